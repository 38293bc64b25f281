"""composespawner.client's files: the manifest and environment a grow or shrink leaves."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from composespawner import client
from tests.support.fake_portal import FakePortal

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


class FakeCuda:
    """torch.cuda as limit_gpu_memory uses it: what it was asked to cap."""

    def __init__(self, available: bool) -> None:
        self.available = available
        self.fractions: list[float] = []

    def is_available(self) -> bool:
        return self.available

    def set_per_process_memory_fraction(self, fraction: float) -> None:
        self.fractions.append(fraction)


def fake_torch(monkeypatch: pytest.MonkeyPatch, available: bool = True) -> FakeCuda:
    cuda = FakeCuda(available)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    return cuda


def test_a_share_holders_pytorch_is_capped_to_its_shares_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = fake_torch(monkeypatch)
    monkeypatch.setenv("COMPOSE_GPU_MEMORY_FRACTION", "0.25")
    assert client.limit_gpu_memory() == 0.25
    assert cuda.fractions == [0.25]


@pytest.mark.parametrize("fraction", [None, "", "1", "0", "-0.5", "a quarter"])
def test_whole_gpus_or_no_fraction_cap_nothing(
    monkeypatch: pytest.MonkeyPatch, fraction: str | None
) -> None:
    cuda = fake_torch(monkeypatch)
    if fraction is None:
        monkeypatch.delenv("COMPOSE_GPU_MEMORY_FRACTION", raising=False)
    else:
        monkeypatch.setenv("COMPOSE_GPU_MEMORY_FRACTION", fraction)
    assert client.limit_gpu_memory() is None
    assert cuda.fractions == []


def test_without_pytorch_or_a_gpu_nothing_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSE_GPU_MEMORY_FRACTION", "0.5")
    cuda = fake_torch(monkeypatch, available=False)
    assert client.limit_gpu_memory() is None
    assert cuda.fractions == []
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert client.limit_gpu_memory() is None


PORTAL_SERVER = {
    "server": "",
    "machine": "m1",
    "state": "running",
    "host": "host-01",
    "zone": "rack-1",
    "since": "2026-11-24T08:00:00+00:00",
    "gpus": [{"id": "t4-1", "model": "NVIDIA T4"}],
    "devices": [],
}


def test_the_machine_says_its_share_as_the_portal_or_else_its_start_told_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPOSE_GPU_SHARE", "1/4")
    told = client.Machine.from_json({**PORTAL_SERVER, "gpu_share": 2})
    assert (told.gpu_share, told.gpu_memory_fraction) == (2, 0.5)
    started = client.Machine.from_json(PORTAL_SERVER)
    assert (started.gpu_share, started.gpu_memory_fraction) == (4, 0.25)
    monkeypatch.delenv("COMPOSE_GPU_SHARE")
    whole = client.Machine.from_json({**PORTAL_SERVER, "gpu_share": True})
    assert (whole.gpu_share, whole.gpu_memory_fraction) == (1, None)


def test_the_machine_tells_idle_gpus_and_keep_keeps_the_warned_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FakePortal("notebook-token", gpus=2) as portal:
        monkeypatch.setenv("COMPOSE_PORTAL_URL", portal.url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "notebook-token")
        monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")
        portal.idle("gpu-1", 1900)
        portal.warn("gpu-1", reclaim_at=1_800_000_000, keep_allowed=True)

        machine = client.machine()

        assert [(g.id, g.idle_s) for g in machine.gpus] == [("gpu-0", None), ("gpu-1", 1900.0)]
        assert machine.warnings == ["Your T4 has done no work for 30 min."]
        assert client.keep() == "Kept T4 (gpu-1) for another hour."
        assert client.machine().warnings == []
        assert client.keep() == "No GPU of this server has a warning: nothing to keep."
        with pytest.raises(client.PortalError, match="holds no GPU nope") as refused:
            client.keep("nope")
        assert refused.value.status == 404
        assert [(m, p) for m, p, _ in portal.calls() if m == "POST"] == [
            ("POST", "/api/me/server/gpus/gpu-1/keep"),
            ("POST", "/api/me/server/gpus/nope/keep"),
        ]
