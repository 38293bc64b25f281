"""Helpers shared by the ledger tests (fixtures live in conftest.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from composespawner.ledger import DeviceRecord


class Clock:
    """An injectable clock that moves only when told to."""

    def __init__(self, start: datetime = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, **delta: float) -> datetime:
        with self._lock:
            self.now += timedelta(**delta)
            return self.now


MachineMaker = Callable[..., str]

# How to reach each state from 'requested' through the lifecycle.
PATHS: dict[str, tuple[str, ...]] = {
    "requested": (),
    "claimed": ("claimed",),
    "composed": ("claimed", "composed"),
    "launching": ("claimed", "composed", "launching"),
    "running": ("claimed", "composed", "launching", "running"),
    "stopping": ("claimed", "stopping"),
    "released": ("claimed", "stopping", "released"),
    "failed": ("failed",),
}


GPUS = 8


def gpu_ids(count: int, prefix: str = "gpu") -> list[str]:
    return [f"{prefix}-{n:02d}" for n in range(1, count + 1)]


def inventory() -> list[DeviceRecord]:
    """A small rack: GPUs, a NIC, a drive, two hosts and two co-located GPUs of 'physics'."""
    rack = frozenset({"rack-1"})
    records = [DeviceRecord(block, "gpu", "A100-80GB", rack, "rack-1") for block in gpu_ids(GPUS)]
    records += [
        DeviceRecord("nic-01", "nic", "ConnectX-7", rack, "rack-1"),
        DeviceRecord("nvme-01", "nvme", "PM1735", rack, "rack-1"),
        DeviceRecord("host-1-block", "host", "64 CPUs, 512 GiB", rack, "rack-1"),
        DeviceRecord("host-2-block", "host", "64 CPUs, 512 GiB", rack, "rack-1"),
    ]
    records += [
        DeviceRecord(block, "gpu", "H100", rack | {"rack-2"}, "expansion-1", "physics")
        for block in gpu_ids(2, "colo")
    ]
    return records
