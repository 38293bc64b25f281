"""A composed machine as the spawner keeps it: in its state, across hub restarts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from composespawner.domain.hardware import Device, Share


@dataclass(frozen=True, slots=True)
class ComposedMachine:
    machine_id: str
    host: str  # ComputerSystem Id
    zone: str
    gpus: tuple[Device, ...]
    nic: Device | None
    drives: tuple[Device, ...]
    share: Share | None = None  # its share of a shared host (None: the whole host)
    # 1: its GPUs are its own; n > 1: it holds 1/n of its one GPU, time-sliced with others.
    gpu_share: int = 1

    def to_state(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "host": self.host,
            "zone": self.zone,
            "gpus": [_device_state(d) for d in self.gpus],
            "nic": _device_state(self.nic) if self.nic else None,
            "drives": [_device_state(d) for d in self.drives],
            "share": [self.share.cores, self.share.memory_gib] if self.share else None,
            "gpu_share": self.gpu_share,
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
            share=Share(*state["share"]) if state.get("share") else None,
            gpu_share=int(state.get("gpu_share", 1)),
        )


def _device_state(device: Device) -> dict[str, Any]:
    return {
        "block_id": device.block_id,
        "kind": device.kind,
        "model": device.model,
        "zones": sorted(device.zones),
        "chassis": device.chassis,
        "memory_gib": device.memory_gib,
        "uuid": device.uuid,
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
        uuid=state.get("uuid"),
        speed_gbps=state.get("speed_gbps"),
        capacity_gb=state.get("capacity_gb"),
    )


def machine_env(machine: ComposedMachine) -> dict[str, str]:
    """Environment that tells the notebook what it got."""
    gpus = [
        {"id": d.block_id, "model": d.model, "memory_gib": d.memory_gib, "uuid": d.uuid}
        for d in machine.gpus
    ]
    return {
        "COMPOSE_MACHINE_ID": machine.machine_id,
        "COMPOSE_HOST": machine.host,
        "COMPOSE_ZONE": machine.zone,
        "COMPOSE_GPUS": json.dumps(gpus),
        "COMPOSE_GPU_MODELS": ",".join(d.model for d in machine.gpus),
        "COMPOSE_DEVICE_IDS": ",".join(d.block_id for d in (*machine.gpus, *_extras(machine))),
        "CUDA_VISIBLE_DEVICES": gpu_selection(machine),
        "COMPOSE_SCRATCH_GB": str(sum(d.capacity_gb or 0 for d in machine.drives)),
        "COMPOSE_NIC": _nic(machine),
        **_share_env(machine),
        **gpu_share_env(machine.gpu_share),
    }


def gpu_share_env(gpu_share: int) -> dict[str, str]:
    """What a notebook holding 1/``gpu_share`` of its one GPU is told; nothing for whole GPUs.

    Time-slicing shares the GPU's compute, not its memory: nothing stops one holder
    from filling the GPU. ``COMPOSE_GPU_MEMORY_FRACTION`` says what is fair, and the
    framework settings ask JAX (its preallocation capped to the fraction), TensorFlow
    (grow on demand, not grab it all) and PyTorch (give freed memory back) to keep to
    it; they are advisory, and a stack's own settings win (its env is applied after).
    ``client.limit_gpu_memory()`` caps PyTorch itself.
    """
    if gpu_share <= 1:
        return {}
    fraction = f"{(10_000 // gpu_share) / 10_000:g}"  # rounded down: the holders' sum <= 1
    return {
        "COMPOSE_GPU_SHARE": f"1/{gpu_share}",
        "COMPOSE_GPU_MEMORY_FRACTION": fraction,
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def _share_env(machine: ComposedMachine) -> dict[str, str]:
    """The machine's share of its host, where it has one (a whole host has none): for people
    (``COMPOSE_CORES``, ``COMPOSE_MEMORY_GIB``) and in the variables jupyter-resource-usage
    shows limits from (``CPU_LIMIT`` cores, ``MEM_LIMIT`` bytes)."""
    share = machine.share
    if share is None:
        return {}
    return {
        "COMPOSE_CORES": str(share.cores),
        "COMPOSE_MEMORY_GIB": str(share.memory_gib),
        "CPU_LIMIT": str(share.cores),
        "MEM_LIMIT": str(share.memory_gib * 2**30),
    }


def gpu_selection(machine: ComposedMachine) -> str:
    """The machine's GPUs as CUDA (``CUDA_VISIBLE_DEVICES``) and the NVIDIA container
    runtime select them: ``GPU-<uuid>`` each, in attach order; "" for none.

    A shared host sees the GPUs of every machine composed into it, so indexes
    would name a neighbour's; a UUID names this machine's GPU whatever else the
    host has (``Device.uuid`` is the fabric's ``Processor.UUID``, without the
    ``GPU-`` that ``nvidia-smi -L`` shows). A fabric that reports no UUIDs
    leaves only the indexes, right where the host holds this machine alone.
    """
    if all(gpu.uuid for gpu in machine.gpus):
        return ",".join(f"GPU-{gpu.uuid}" for gpu in machine.gpus)
    return ",".join(str(index) for index in range(len(machine.gpus)))


def nvidia_visible_devices(machine: ComposedMachine) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` for exactly the machine's GPUs (:func:`gpu_selection`).

    ``none`` still gives a container the driver's tools, with no device ("" would
    give it no driver at all).
    """
    return gpu_selection(machine) or "none"


def _nic(machine: ComposedMachine) -> str:
    """The composed network card, or ``none`` when the host network is all there is."""
    if machine.nic is None:
        return "none"
    return f"{machine.nic.model} ({machine.nic.speed_gbps} Gb/s)"


def _extras(machine: ComposedMachine) -> tuple[Any, ...]:
    return ((machine.nic,) if machine.nic else ()) + machine.drives
