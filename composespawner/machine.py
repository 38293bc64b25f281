"""A composed machine as the spawner keeps it: in its state, across hub restarts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .hardware import Device


@dataclass(frozen=True, slots=True)
class ComposedMachine:
    machine_id: str
    host: str  # ComputerSystem Id
    zone: str
    gpus: tuple[Device, ...]
    nic: Device | None
    drives: tuple[Device, ...]

    def to_state(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "host": self.host,
            "zone": self.zone,
            "gpus": [_device_state(d) for d in self.gpus],
            "nic": _device_state(self.nic) if self.nic else None,
            "drives": [_device_state(d) for d in self.drives],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ComposedMachine:
        return cls(
            machine_id=str(state["machine_id"]),
            host=str(state["host"]),
            zone=str(state["zone"]),
            gpus=tuple(_device_from_state(d) for d in state.get("gpus", [])),
            nic=_device_from_state(state["nic"]) if state.get("nic") else None,
            drives=tuple(_device_from_state(d) for d in state.get("drives", [])),
        )


def _device_state(device: Device) -> dict[str, Any]:
    return {
        "block_id": device.block_id,
        "kind": device.kind,
        "model": device.model,
        "zones": sorted(device.zones),
        "chassis": device.chassis,
        "memory_gib": device.memory_gib,
        "speed_gbps": device.speed_gbps,
        "capacity_gb": device.capacity_gb,
    }


def _device_from_state(state: Mapping[str, Any]) -> Device:
    return Device(
        block_id=state["block_id"],
        kind=state["kind"],
        model=state["model"],
        zones=frozenset(state.get("zones", ())),
        chassis=state.get("chassis", ""),
        state="attached",
        memory_gib=state.get("memory_gib"),
        speed_gbps=state.get("speed_gbps"),
        capacity_gb=state.get("capacity_gb"),
    )
