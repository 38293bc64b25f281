"""Refusals both adapters must share: the HTTP simulator and InProcessFabric.

One table, run against both, so "the fake refuses what the simulator
refuses" is checked rather than hoped for.
"""

from __future__ import annotations

from dataclasses import dataclass

from composespawner.fabric.base import DeviceInUse, DeviceNotFound, FabricRefused, IncompatibleZone

ADD, REMOVE = "AddResourceBlock", "RemoveResourceBlock"


@dataclass(frozen=True)
class RefusalCase:
    name: str
    action: str
    system_id: str
    block_id: str
    status: int
    message_id: str
    fabric_error: type[FabricRefused]
    attached_first: tuple[tuple[str, str], ...] = ()  # (system, block) attached before
    disabled: tuple[str, ...] = ()  # blocks switched off before


REFUSALS = [
    RefusalCase(
        "attached elsewhere",
        ADD,
        "host-02",
        "r1-a100-1",
        409,
        "Composition.1.1.3.ResourceBlockInUse",
        DeviceInUse,
        attached_first=(("host-01", "r1-a100-1"),),
    ),
    RefusalCase(
        "unknown block",
        ADD,
        "host-01",
        "r1-a100-99",
        404,
        "Composition.1.1.3.ResourceBlockNotFound",
        DeviceNotFound,
    ),
    RefusalCase(
        "unknown block removed",
        REMOVE,
        "host-01",
        "r1-a100-99",
        404,
        "Composition.1.1.3.ResourceBlockNotFound",
        DeviceNotFound,
    ),
    RefusalCase(
        "unknown system",
        ADD,
        "host-99",
        "r1-a100-1",
        404,
        "Base.1.22.1.ResourceMissingAtURI",
        DeviceNotFound,
    ),
    RefusalCase(
        "other rack's zone",
        ADD,
        "host-01",
        "r2-h100-1",
        400,
        "Composition.1.1.3.IncompatibleZone",
        IncompatibleZone,
    ),
    RefusalCase(
        "another host's block",
        ADD,
        "host-01",
        "host-02-block",
        400,
        "Base.1.22.1.ActionParameterValueError",
        FabricRefused,
    ),
    RefusalCase(
        "own host block removed",
        REMOVE,
        "host-01",
        "host-01-block",
        400,
        "Base.1.22.1.ActionParameterValueError",
        FabricRefused,
    ),
    RefusalCase(
        "disabled device",
        ADD,
        "host-01",
        "r1-t4-1",
        409,
        "Composition.1.1.3.ResourceBlockInvalid",
        FabricRefused,
        disabled=("r1-t4-1",),
    ),
    RefusalCase(
        "disabled host",
        ADD,
        "host-01",
        "r1-t4-1",
        409,
        "Composition.1.1.3.ResourceBlockInvalid",
        FabricRefused,
        disabled=("host-01-block",),
    ),
]
