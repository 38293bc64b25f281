"""The host mark ``Oem.ComposeSpawner`` read from JSON, in either version (pure).

One reader for what a client PATCHes or POSTs and for what the state file
kept, so the service accepts after a restart exactly what it accepted before.
The version is the one ``@odata.type`` names when it is given, else the
shape's: a ``Machines`` list is v1_1_0, anything else v1_0_0 (see
:mod:`.wire`). Refusals are the Redfish messages a service answers for the
property: unknown, missing, of the wrong type, or not a valid value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import PropertyMissing, PropertyUnknown, PropertyValueError, PropertyValueTypeError
from .wire import (
    OEM_KEY,
    SHARED_MARK_TYPE,
    TAG_TYPE,
    CompositionTag,
    HostMark,
    MachineRef,
    SharedMark,
)

MARK_PATH = f"/Oem/{OEM_KEY}"
TAG_PROPERTIES = ("Hub", "Machine", "Owner")
SHARED_PROPERTIES = ("Hub", "Machines")
MACHINE_PROPERTIES = ("Machine", "Owner")


def parse_mark(value: Any, path: str = MARK_PATH) -> HostMark | None:
    """The mark ``value`` (None: no mark), or the refusal of it."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PropertyValueTypeError(json.dumps(value), path)
    odata_type = value.get("@odata.type")
    if odata_type is not None and odata_type not in (TAG_TYPE, SHARED_MARK_TYPE):
        raise PropertyValueError(f"{path}/@odata.type")
    shared = odata_type == SHARED_MARK_TYPE or (odata_type is None and "Machines" in value)
    allowed = SHARED_PROPERTIES if shared else TAG_PROPERTIES
    _only(value, allowed, path)
    if not shared:
        hub, machine, owner = _strings(value, TAG_PROPERTIES, path)
        return CompositionTag(hub=hub, machine=machine, owner=owner)
    (hub,) = _strings(value, ("Hub",), path)
    return SharedMark(hub=hub, machines=_machines(value, f"{path}/Machines"))


def _machines(value: Mapping[str, Any], path: str) -> tuple[MachineRef, ...]:
    if "Machines" not in value:
        raise PropertyMissing(path)
    entries = value["Machines"]
    if not isinstance(entries, list):
        raise PropertyValueTypeError(json.dumps(entries), path)
    if not entries:
        # A host that no machine holds carries no mark: PATCH null removes it.
        raise PropertyValueError(path)
    machines = []
    for index, entry in enumerate(entries):
        where = f"{path}/{index}"
        if not isinstance(entry, Mapping):
            raise PropertyValueTypeError(json.dumps(entry), where)
        _only(entry, MACHINE_PROPERTIES, where)
        machine, owner = _strings(entry, MACHINE_PROPERTIES, where)
        machines.append(MachineRef(machine=machine, owner=owner))
    if len({m.machine for m in machines}) != len(machines):
        raise PropertyValueError(path)  # one machine listed twice
    return tuple(machines)


def _only(value: Mapping[str, Any], allowed: tuple[str, ...], path: str) -> None:
    for key in value:
        if key not in allowed and key != "@odata.type":
            raise PropertyUnknown(f"{path}/{key}")


def _strings(value: Mapping[str, Any], keys: tuple[str, ...], path: str) -> list[str]:
    found = []
    for key in keys:
        if key not in value:
            raise PropertyMissing(f"{path}/{key}")
        if not isinstance(value[key], str):
            raise PropertyValueTypeError(json.dumps(value[key]), f"{path}/{key}")
        found.append(value[key])
    return found
