"""What the simulated GPUs are doing, and a DCGM exporter's text saying so (pure).

A real site runs NVIDIA's DCGM exporter on each compute host; the simulator serves
one per system at ``/dcgm/<system_id>/metrics`` (always served), listing the
GPUs attached to that system now. Tests set each GPU's figures through
``/sim/activity``; a GPU nobody set is attached and idle: no kernel ran, a few MiB of
framebuffer used, as a GPU with no process shows.

Figures belong to the GPU (its resource block) and stay with it, attached or not,
until they are changed or reset.

Exporters can be made to misbehave, per system or all at once (``"*"``), through
``/sim/activity/faults``: ``"error"`` answers 500, ``"hang"`` never answers (until
the client leaves), ``"garbage"`` answers 200 with a page that is not Prometheus
text. These are apart from ``/sim/faults``, which is the fabric manager's: a host's
exporter fails on its own.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .inventory import DeviceSpec
from .state import FabricState

EXPORTER_FAULTS = ("error", "hang", "garbage")
ALL_SYSTEMS = "*"
IDLE_MEMORY_USED_MIB = 3.0  # what nvidia-smi shows for a GPU no process holds
DRIVER_VERSION = "550.54.15"  # the DCGM_FI_DRIVER_VERSION label the hosts report
# The fields served, as the exporter's default counters name and describe them.
FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
)


class ActivityError(ValueError):
    """A ``/sim/activity`` document that cannot be applied."""


@dataclass(frozen=True, slots=True)
class GpuFigures:
    utilization: float = 0.0  # percent of the sample period a kernel ran
    memory_used_mib: float = IDLE_MEMORY_USED_MIB


def gpu_uuid(state: FabricState, block_id: str) -> str:
    """A GPU's UUID, as its Redfish Processor gives it (and nvidia-smi shows after "GPU-")."""
    return str(uuid.uuid5(uuid.UUID(state.inventory.uuid), block_id))


class ActivityBoard:
    """The figures tests have set, by GPU block id."""

    def __init__(self) -> None:
        self._figures: dict[str, GpuFigures] = {}
        self.faults: dict[str, str] = {}  # system id or "*" -> one of EXPORTER_FAULTS

    def figures(self, block_id: str) -> GpuFigures:
        return self._figures.get(block_id, GpuFigures())

    def replace(self, state: FabricState, document: Any) -> None:
        """PUT: exactly these figures; every GPU not named is idle again."""
        self._figures = _parse(state, document)

    def update(self, state: FabricState, document: Any) -> None:
        """PATCH: these GPUs' figures; the others keep theirs."""
        self._figures = {**self._figures, **_parse(state, document)}

    def reset(self) -> None:
        """Every GPU idle, every exporter well."""
        self._figures = {}
        self.faults = {}

    def set_faults(self, document: Any) -> None:
        """PUT of ``/sim/activity/faults``: ``{"<system id>" or "*": "error"|"hang"|"garbage"}``."""
        valid = isinstance(document, Mapping) and all(
            isinstance(key, str) and value in EXPORTER_FAULTS for key, value in document.items()
        )
        if not valid:
            raise ActivityError(
                f'exporter faults are {{"<system id>" or "*": one of {list(EXPORTER_FAULTS)}}}'
            )
        self.faults = dict(document)

    def fault(self, system_id: str) -> str | None:
        """How this system's exporter misbehaves now (None: it answers well)."""
        return self.faults.get(system_id, self.faults.get(ALL_SYSTEMS))

    def to_json(self, state: FabricState) -> dict[str, Any]:
        return {
            block_id: {"uuid": gpu_uuid(state, block_id), **asdict(figures)}
            for block_id, figures in sorted(self._figures.items())
        }


def _parse(state: FabricState, document: Any) -> dict[str, GpuFigures]:
    if not isinstance(document, Mapping):
        raise ActivityError("the activity must be a JSON object of GPU block id or UUID")
    by_uuid = {gpu_uuid(state, d.id): d for d in _gpus(state)}
    parsed = {}
    for key, value in document.items():
        device = _device(state, by_uuid, key)
        parsed[device.id] = _figures(device, value)
    return parsed


def _gpus(state: FabricState) -> list[DeviceSpec]:
    return [d for d in state.inventory.devices if d.kind == "gpu"]


def _device(state: FabricState, by_uuid: Mapping[str, DeviceSpec], key: Any) -> DeviceSpec:
    """The GPU a key names: its block id, or its UUID (with or without "GPU-", any case)."""
    text = str(key)
    device = state.inventory.device(text)
    if device is None:
        device = by_uuid.get(text.lower().removeprefix("gpu-"))
    if device is None or device.kind != "gpu":
        raise ActivityError(f"{text!r} is not a GPU of this fabric (a block id or a UUID)")
    return device


def _figures(device: DeviceSpec, value: Any) -> GpuFigures:
    where = f"GPU {device.id}"
    if not isinstance(value, Mapping):
        raise ActivityError(f"{where}: give an object with utilization and/or memory_used_mib")
    unknown = sorted(set(value) - {"utilization", "memory_used_mib"})
    if unknown:
        raise ActivityError(f"{where}: unknown fields {unknown}")
    figures = GpuFigures(
        utilization=_number(where, "utilization", value.get("utilization", 0.0)),
        memory_used_mib=_number(
            where, "memory_used_mib", value.get("memory_used_mib", IDLE_MEMORY_USED_MIB)
        ),
    )
    if figures.utilization > 100:
        raise ActivityError(f"{where}: utilization is a percentage, 0 to 100")
    total = (device.memory_gib or 0) * 1024
    if total and figures.memory_used_mib > total:
        raise ActivityError(f"{where}: memory_used_mib over the GPU's {total} MiB")
    return figures


def _number(where: str, key: str, value: Any) -> float:
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or not math.isfinite(value) or value < 0:
        raise ActivityError(f"{where}: {key} must be a non-negative number")
    return float(value)


def dcgm_metrics(state: FabricState, board: ActivityBoard, system_id: str) -> str:
    """What a DCGM exporter on ``system_id`` serves: one sample per attached GPU and field.

    Labelled like the real exporter's (``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
    ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``); a system without GPUs
    still declares its fields, as an exporter does.
    """
    host = state.system_host(system_id).id
    attached = [state.inventory.device(b) for b in state.system_blocks(system_id)]
    gpus = [d for d in attached if d is not None and d.kind == "gpu"]
    lines = []
    for name, help_text in FIELDS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for index, device in enumerate(gpus):
            labels = _labels(state, device, index, host)
            lines.append(f"{name}{{{labels}}} {_value(name, device, board)}")
    return "\n".join(lines) + "\n"


def _labels(state: FabricState, device: DeviceSpec, index: int, host: str) -> str:
    labels = {
        "gpu": str(index),
        "UUID": f"GPU-{gpu_uuid(state, device.id)}",
        "pci_bus_id": f"00000000:{index + 0x41:02X}:00.0",
        "device": f"nvidia{index}",
        "modelName": device.model,
        "Hostname": host,
        "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
    }
    return ",".join(f'{key}="{_escaped(value)}"' for key, value in labels.items())


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(name: str, device: DeviceSpec, board: ActivityBoard) -> str:
    figures = board.figures(device.id)
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return repr(figures.utilization)
    if name == "DCGM_FI_DEV_FB_USED":
        return repr(figures.memory_used_mib)
    return repr(max((device.memory_gib or 0) * 1024 - figures.memory_used_mib, 0.0))
