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

from . import uris
from .composed import BLOCKS_PATH
from .errors import (
    ActionParameterMissing,
    ActionParameterUnknown,
    ActionParameterValueNotInList,
    ActionParameterValueTypeError,
    BlockNotFound,
    MalformedJSON,
    PropertyMissing,
    PropertyNotWritable,
    PropertyUnknown,
    PropertyValueTypeError,
    ResourceMissing,
)
from .marks import MARK_PATH, parse_mark
from .state import CompositionRequest, FabricState
from .wire import OEM_KEY, HostMark

BLOCK_ACTIONS = (uris.ADD_RESOURCE_BLOCK, uris.REMOVE_RESOURCE_BLOCK)
ETAG_PARAMETERS = ("ResourceBlockETag", "ComputerSystemETag")
COMPOSE_ACTION = "CompositionService.Compose"
# What a client may set when it creates a system (the Systems/Capabilities object).
CREATE_PROPERTIES = ("Name", "Description", "Links", "Oem")
# The Compose action's request types this service carries out; Preview and
# PreviewReserve (reservations) are not offered.
COMPOSE_REQUEST_TYPES = ("Apply",)


@dataclass(frozen=True, slots=True)
class Stanza:
    """One stanza of a Compose manifest: compose a system, or decompose one."""

    stanza_id: str
    compose: CompositionRequest | None = None  # a ComposeSystem stanza
    decompose: str | None = None  # a DecomposeSystem stanza: the system's id


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


@dataclass(frozen=True, slots=True)
class SystemPatch:
    """``PATCH /Systems/{id}``: the whole desired block list and/or the mark, as one write."""

    blocks: tuple[str, ...] | None = None  # None: the blocks stay as they are
    writes_mark: bool = False
    mark: HostMark | None = None  # with writes_mark: None removes the mark

    def check(self, state: FabricState, system_id: str, if_match: str | None) -> None:
        """Refuse now what applying would refuse now (an asynchronous PATCH's task re-checks)."""
        state.check_if_match(system_id, if_match, required=True)
        if self.blocks is not None:
            state.plan_relink(system_id, self.blocks)  # planned, not applied

    def apply(self, state: FabricState, system_id: str, if_match: str | None) -> None:
        state.patch_system(
            system_id,
            if_match=if_match,
            blocks=self.blocks,
            mark=self.mark,
            writes_mark=self.writes_mark,
        )


def parse_system_patch(body: bytes, readable: Mapping[str, Any]) -> SystemPatch:
    """The body of ``PATCH /Systems/{id}``: ``Links.ResourceBlocks`` and ``Oem.ComposeSpawner``.

    ``readable`` is the system as a GET shows it: other properties found
    there are read-only (PropertyNotWritable), the rest unknown
    (PropertyUnknown).
    """
    document = parse_json(body)
    if not isinstance(document, Mapping) or not document:
        raise PropertyMissing(MARK_PATH)
    for key in document:
        if key not in ("Links", "Oem"):
            raise (PropertyNotWritable if key in readable else PropertyUnknown)(f"/{key}")
    blocks = None
    if "Links" in document:
        blocks = _patched_blocks(document["Links"], readable.get("Links", {}))
    if "Oem" not in document:
        return SystemPatch(blocks=blocks)
    oem = document["Oem"]
    if not isinstance(oem, Mapping):
        raise PropertyValueTypeError(json.dumps(oem), "/Oem")
    for key in oem:
        if key != OEM_KEY:
            raise PropertyUnknown(f"/Oem/{key}")
    if OEM_KEY not in oem:
        raise PropertyMissing(MARK_PATH)
    return SystemPatch(blocks=blocks, writes_mark=True, mark=parse_mark(oem[OEM_KEY]))


def _patched_blocks(links: Any, readable: Mapping[str, Any]) -> tuple[str, ...]:
    """A PATCH's ``Links``: only ``ResourceBlocks`` is writable, a list of block references."""
    if not isinstance(links, Mapping):
        raise PropertyValueTypeError(json.dumps(links), "/Links")
    for key in links:
        if key != "ResourceBlocks":
            raise (PropertyNotWritable if key in readable else PropertyUnknown)(f"/Links/{key}")
    references = links.get("ResourceBlocks")
    if not isinstance(references, list):
        raise (
            PropertyMissing(BLOCKS_PATH)
            if references is None
            else PropertyValueTypeError(json.dumps(references), BLOCKS_PATH)
        )
    return tuple(_block_id(reference, BLOCKS_PATH) for reference in references)


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


def parse_system_create(body: bytes) -> CompositionRequest:
    """The body of ``POST /Systems``: a name, the blocks, and optionally our tag."""
    document = parse_json(body)
    if not isinstance(document, Mapping):
        raise PropertyMissing("Name")
    for key in document:
        if key not in CREATE_PROPERTIES:
            raise PropertyUnknown(f"/{key}")
    return _composition_request(document, "")


def _composition_request(document: Mapping[str, Any], where: str) -> CompositionRequest:
    name = document.get("Name")
    if not isinstance(name, str) or not name:
        raise (
            PropertyMissing(f"{where}/Name")
            if name is None
            else PropertyValueTypeError(json.dumps(name), f"{where}/Name")
        )
    links = document.get("Links")
    references = links.get("ResourceBlocks") if isinstance(links, Mapping) else None
    if not isinstance(references, list) or not references:
        raise PropertyMissing(f"{where}/Links/ResourceBlocks")
    blocks = tuple(_block_id(ref, f"{where}/Links/ResourceBlocks") for ref in references)
    oem = document.get("Oem", {})
    if not isinstance(oem, Mapping):
        raise PropertyValueTypeError(json.dumps(oem), f"{where}/Oem")
    for key in oem:
        if key != OEM_KEY:
            raise PropertyUnknown(f"{where}/Oem/{key}")
    mark = parse_mark(oem.get(OEM_KEY), f"{where}/Oem/{OEM_KEY}")
    return CompositionRequest(name=name, blocks=blocks, tag=mark)


def _block_id(reference: Any, where: str) -> str:
    uri = reference.get("@odata.id") if isinstance(reference, Mapping) else None
    if not isinstance(uri, str):
        raise PropertyValueTypeError(json.dumps(reference), where)
    block_id = uris.block_id_from_uri(uri)
    if block_id is None:
        raise BlockNotFound(uri)
    return block_id


def parse_compose_action(body: bytes) -> list[Stanza]:
    """The body of ``CompositionService.Compose``: an Apply manifest's stanzas."""
    document = parse_json(body)
    if not isinstance(document, Mapping):
        raise ActionParameterMissing(COMPOSE_ACTION, "RequestFormat")
    for key in document:
        if key not in ("RequestFormat", "RequestType", "Manifest"):
            raise ActionParameterUnknown(COMPOSE_ACTION, key)
    for parameter, allowed in (
        ("RequestFormat", ("Manifest",)),
        ("RequestType", COMPOSE_REQUEST_TYPES),
    ):
        if parameter not in document:
            raise ActionParameterMissing(COMPOSE_ACTION, parameter)
        if document[parameter] not in allowed:
            raise ActionParameterValueNotInList(
                json.dumps(document[parameter]), parameter, COMPOSE_ACTION
            )
    stanzas = dig_list(document, "Manifest", "Stanzas")
    if not stanzas:
        raise ActionParameterMissing(COMPOSE_ACTION, "Manifest/Stanzas")
    return [_stanza(stanza, index) for index, stanza in enumerate(stanzas)]


def dig_list(document: Mapping[str, Any], *keys: str) -> list[Any]:
    value: Any = document
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, list) else []


def _stanza(stanza: Any, index: int) -> Stanza:
    where = f"Manifest/Stanzas/{index}"
    if not isinstance(stanza, Mapping):
        raise ActionParameterValueTypeError(json.dumps(stanza), where, COMPOSE_ACTION)
    kind, request = stanza.get("StanzaType"), stanza.get("Request")
    stanza_id = stanza.get("StanzaId")
    stanza_id = stanza_id if isinstance(stanza_id, str) else str(index)
    if not isinstance(request, Mapping):
        raise ActionParameterMissing(COMPOSE_ACTION, f"{where}/Request")
    if kind == "ComposeSystem":
        return Stanza(stanza_id, compose=_composition_request(request, f"/{where}/Request"))
    if kind == "DecomposeSystem":
        uri = request.get("@odata.id")
        system_id = uris.system_id_from_uri(uri) if isinstance(uri, str) else None
        if system_id is None:
            raise ResourceMissing(str(uri))
        return Stanza(stanza_id, decompose=system_id)
    raise ActionParameterValueNotInList(json.dumps(kind), f"{where}/StanzaType", COMPOSE_ACTION)
