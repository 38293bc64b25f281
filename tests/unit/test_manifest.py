"""Run manifests: what a server ran on, and the options that run it again identically."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import Device
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.manifest import NotRelaunchable, relaunch_options, run_manifest
from harness.paths import HUB_CONFIG

CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")
OPTIONS = {"gpu_model": "t4", "gpu_count": 2, "network": "shared", "scratch_gb": 0}


def gpu(block: str) -> Device:
    return Device(
        block, "gpu", "NVIDIA T4", frozenset({"rack-1"}), "chassis-1", "attached", memory_gib=16
    )


MACHINE = ComposedMachine("m-1", "host-01", "rack-1", (gpu("r1-t4-1"), gpu("r1-t4-2")), None, ())


def a_manifest(stack_id: str = "pytorch") -> dict[str, Any]:
    return run_manifest(
        user="student1",
        server="",
        options={**OPTIONS, "stack": stack_id},
        stack=CATALOG.stack(stack_id),
        variant="cpu",
        machine=MACHINE,
        environment={"PYTHONHASHSEED": "0", "COMPOSE_HOST": "host-01"},
        started_at=datetime(2026, 11, 24, 12, 0, tzinfo=UTC),
    )


def test_the_manifest_names_stack_machine_environment_and_time() -> None:
    manifest = a_manifest()
    stack = CATALOG.stack("pytorch")
    assert stack is not None
    assert stack.cpu is not None
    assert manifest["stack"] == {
        "id": "pytorch",
        "label": "PyTorch 2.13",
        "variant": "cpu",
        "lock_sha256": stack.cpu.lock_sha256,
        "image": "composespawner/pytorch",
        "image_digest": None,  # no image is built here
    }
    assert manifest["machine"] == {
        "id": "m-1",
        "host": "host-01",
        "zone": "rack-1",
        "gpus": [{"id": "r1-t4-1", "model": "NVIDIA T4"}, {"id": "r1-t4-2", "model": "NVIDIA T4"}],
        "nic": None,
        "scratch_gb": 0,
    }
    assert manifest["environment"] == {"COMPOSE_HOST": "host-01", "PYTHONHASHSEED": "0"}
    assert manifest["started_at"] == "2026-11-24T12:00:00+00:00"


def test_launching_again_asks_for_the_same_stack_and_gpus() -> None:
    assert relaunch_options(a_manifest("tensorflow"), CATALOG) == {**OPTIONS, "stack": "tensorflow"}


def test_a_stack_whose_lock_changed_cannot_be_launched_again() -> None:
    manifest = a_manifest()
    manifest["stack"]["lock_sha256"] = "0" * 64
    with pytest.raises(NotRelaunchable, match=r"PyTorch 2\.13 stack has changed since this run"):
        relaunch_options(manifest, CATALOG)


def test_a_stack_no_longer_offered_cannot_be_launched_again() -> None:
    manifest = a_manifest()
    without = replace(CATALOG, stacks=CATALOG.stacks[1:])
    with pytest.raises(NotRelaunchable, match=r"'PyTorch 2\.13' is no longer offered"):
        relaunch_options(manifest, without)


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_what_is_not_a_manifest_is_refused(version: object) -> None:
    with pytest.raises(NotRelaunchable, match="not a run manifest"):
        relaunch_options({**a_manifest(), "version": version}, CATALOG)
