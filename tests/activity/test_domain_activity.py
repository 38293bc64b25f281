"""The shared vocabulary of GPU activity (composespawner.domain.activity)."""

from __future__ import annotations

import dataclasses

import pytest

from composespawner.domain.activity import (
    ActivityReading,
    GpuActivity,
    did_work,
    gpu_uuid,
    holds_context,
)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("GPU-0AB1C2D3-0000-1111-2222-333344445555", "0ab1c2d3-0000-1111-2222-333344445555"),
        ("gpu-0ab1c2d3-0000-1111-2222-333344445555", "0ab1c2d3-0000-1111-2222-333344445555"),
        ("0AB1C2D3-0000-1111-2222-333344445555", "0ab1c2d3-0000-1111-2222-333344445555"),
        (" GPU-abc\n", "abc"),
        ("MIG-GPU-abc", "mig-gpu-abc"),  # only a leading "GPU-" is the prefix
    ],
)
def test_gpu_uuid_keys_as_nvidia_smi_shows_without_prefix(text: str, key: str) -> None:
    assert gpu_uuid(text) == key
    assert gpu_uuid(key) == key  # idempotent: a key stays a key


def test_holds_context_counts_processes_when_known() -> None:
    # Processes, when the source counts them, win over memory either way.
    assert holds_context(GpuActivity("a", 0.0, 2.0, 1), memory_floor_mib=64)
    assert not holds_context(GpuActivity("a", 0.0, 9000.0, 0), memory_floor_mib=64)


def test_holds_context_falls_back_on_memory_above_the_floor() -> None:
    assert holds_context(GpuActivity("a", 0.0, 500.0, None), memory_floor_mib=64)
    assert not holds_context(GpuActivity("a", 0.0, 64.0, None), memory_floor_mib=64)
    assert not holds_context(GpuActivity("a", 0.0, 3.0, None), memory_floor_mib=64)


def test_did_work_is_utilisation_above_the_busy_percent() -> None:
    assert did_work(GpuActivity("a", 1.5, 0.0, None), busy_percent=1.0)
    assert not did_work(GpuActivity("a", 1.0, 0.0, None), busy_percent=1.0)
    assert not did_work(GpuActivity("a", 0.0, 9000.0, 3), busy_percent=1.0)


def test_readings_are_frozen_values() -> None:
    gpu = GpuActivity("a", 0.0, 3.0, None)
    reading = ActivityReading("host-01", 10.0, {"a": gpu})
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.at = 11.0  # type: ignore[misc]
    assert reading == ActivityReading("host-01", 10.0, {"a": GpuActivity("a", 0.0, 3.0, None)})
