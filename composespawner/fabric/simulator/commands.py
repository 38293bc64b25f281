"""Request bodies parsed into commands on the state model (pure).

Each parser either returns a typed command or raises the
:class:`~.errors.SimulatorError` a Redfish service answers for that body
(``ActionParameterMissing``, ``PropertyValueTypeError``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from composespawner.fabric.base import OEM_KEY, CompositionTag

from . import uris
from .errors import (
    ActionParameterMissing,
    ActionParameterUnknown,
    ActionParameterValueTypeError,
    BlockNotFound,
    MalformedJSON,
    PropertyMissing,
    PropertyNotWritable,
    PropertyUnknown,
    PropertyValueTypeError,
    ResourceMissing,
)
from .state import FabricState

BLOCK_ACTIONS = (uris.ADD_RESOURCE_BLOCK, uris.REMOVE_RESOURCE_BLOCK)
ETAG_PARAMETERS = ("ResourceBlockETag", "ComputerSystemETag")
TAG_PROPERTIES = ("Hub", "Machine", "Owner")


@dataclass(frozen=True, slots=True)
class BlockCommand:
    """ComputerSystem.AddResourceBlock or RemoveResourceBlock, ready to apply."""

    action: str  # one of BLOCK_ACTIONS
    system_id: str
    block_id: str
    block_etag: str | None = None
    system_etag: str | None = None

    @property
    def gives_etags(self) -> bool:
        return self.block_etag is not None or self.system_etag is not None

    def check(self, state: FabricState) -> None:
        """Refuse now what can never succeed (unknown system or block, a host block)."""
        state.check_target(self.system_id, self.block_id, self.action)

    def apply(self, state: FabricState) -> bool:
        """Run it; True if the state changed."""
        operation = (
            state.add_resource_block
            if self.action == uris.ADD_RESOURCE_BLOCK
            else state.remove_resource_block
        )
        return operation(
            self.system_id,
            self.block_id,
            block_etag=self.block_etag,
            system_etag=self.system_etag,
        )


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as err:
        raise MalformedJSON() from err


def parse_block_command(system_id: str, action: str, body: bytes) -> BlockCommand:
    """The body of ``POST .../Actions/ComputerSystem.{action}``."""
    if action not in BLOCK_ACTIONS:
        raise ResourceMissing(uris.action_uri(system_id, action))
    document = parse_json(body)
    name = f"ComputerSystem.{action}"
    if not isinstance(document, Mapping):
        raise ActionParameterMissing(name, "ResourceBlock")
    for key in document:
        if key not in ("ResourceBlock", *ETAG_PARAMETERS):
            raise ActionParameterUnknown(name, key)
    return BlockCommand(
        action=action,
        system_id=system_id,
        block_id=_block_reference(document, name),
        block_etag=_optional_string(document, "ResourceBlockETag", name),
        system_etag=_optional_string(document, "ComputerSystemETag", name),
    )


def _block_reference(document: Mapping[str, Any], action: str) -> str:
    if "ResourceBlock" not in document:
        raise ActionParameterMissing(action, "ResourceBlock")
    reference = document["ResourceBlock"]
    uri = reference.get("@odata.id") if isinstance(reference, Mapping) else None
    if not isinstance(uri, str):
        raise ActionParameterValueTypeError(json.dumps(reference), "ResourceBlock", action)
    block_id = uris.block_id_from_uri(uri)
    if block_id is None:
        raise BlockNotFound(uri)
    return block_id


def _optional_string(document: Mapping[str, Any], key: str, action: str) -> str | None:
    value = document.get(key)
    if value is not None and not isinstance(value, str):
        raise ActionParameterValueTypeError(json.dumps(value), key, action)
    return value


def parse_tag_patch(body: bytes, readable: Mapping[str, Any]) -> CompositionTag | None:
    """The body of ``PATCH /Systems/{id}``: only ``Oem.ComposeSpawner`` is writable.

    ``readable`` is the system as a GET shows it: properties found there are
    read-only (PropertyNotWritable), others are unknown (PropertyUnknown).
    """
    document = parse_json(body)
    if not isinstance(document, Mapping):
        raise PropertyMissing(f"/Oem/{OEM_KEY}")
    for key in document:
        if key != "Oem":
            raise (PropertyNotWritable if key in readable else PropertyUnknown)(f"/{key}")
    if "Oem" not in document:
        raise PropertyMissing(f"/Oem/{OEM_KEY}")
    oem = document["Oem"]
    if not isinstance(oem, Mapping):
        raise PropertyValueTypeError(json.dumps(oem), "/Oem")
    for key in oem:
        if key != OEM_KEY:
            raise PropertyUnknown(f"/Oem/{key}")
    if OEM_KEY not in oem:
        raise PropertyMissing(f"/Oem/{OEM_KEY}")
    return _tag(oem[OEM_KEY])


def _tag(value: Any) -> CompositionTag | None:
    path = f"/Oem/{OEM_KEY}"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PropertyValueTypeError(json.dumps(value), path)
    for key in value:
        if key not in TAG_PROPERTIES and key != "@odata.type":
            raise PropertyUnknown(f"{path}/{key}")
    fields = []
    for key in TAG_PROPERTIES:
        if key not in value:
            raise PropertyMissing(f"{path}/{key}")
        if not isinstance(value[key], str):
            raise PropertyValueTypeError(json.dumps(value[key]), f"{path}/{key}")
        fields.append(value[key])
    hub, machine, owner = fields
    return CompositionTag(hub=hub, machine=machine, owner=owner)


def parse_login(body: bytes) -> tuple[str, str]:
    """The body of ``POST /SessionService/Sessions``: (user name, password)."""
    document = parse_json(body)
    if not isinstance(document, Mapping):
        raise PropertyMissing("UserName")
    for key in document:
        if key not in ("UserName", "Password"):
            raise PropertyUnknown(f"/{key}")
    credentials = []
    for key in ("UserName", "Password"):
        if key not in document:
            raise PropertyMissing(key)
        if not isinstance(document[key], str):
            raise PropertyValueTypeError(json.dumps(document[key]), key)
        credentials.append(document[key])
    return credentials[0], credentials[1]
