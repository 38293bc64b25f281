"""composespawner.client's files: the manifest and environment a grow or shrink leaves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from composespawner import client

RESIZED = client.Resized(
    client.Machine(
        server="",
        machine="m1",
        state="running",
        host="host-01",
        zone="rack-1",
        since="2026-11-24T08:00:00+00:00",
        gpus=(client.Gpu("t4-1", "NVIDIA T4"), client.Gpu("t4-2", "NVIDIA T4")),
        devices=(),
    ),
    {"CUDA_VISIBLE_DEVICES": "0,1", "COMPOSE_GPU_MODELS": "NVIDIA T4,NVIDIA T4"},
    "restart your kernel",
)


def test_a_resize_writes_the_manifest_and_an_env_file_a_shell_can_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "not-made-yet"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")
    client._write_manifest(RESIZED)
    manifest = json.loads((home / ".composespawner" / "default.json").read_text())
    assert [g["id"] for g in manifest["gpus"]] == ["t4-1", "t4-2"]
    sourced = subprocess.run(
        ["sh", "-c", f". {home / '.composespawner' / 'default.env'}; echo $CUDA_VISIBLE_DEVICES"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    assert sourced.stdout.strip() == "0,1"


def test_a_home_that_takes_no_files_is_said_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the home's folder should be")
    monkeypatch.setenv("HOME", str(blocked))
    client._write_manifest(RESIZED)
    assert "could not write" in capsys.readouterr().err


def test_outside_a_hub_notebook_the_client_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPOSE_PORTAL_URL", raising=False)
    with pytest.raises(client.PortalError, match="not a notebook the GPU hub started"):
        client.machine()
