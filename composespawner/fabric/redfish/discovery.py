"""Reading a Redfish service: its map, the inventory, systems and their latest answers.

Nothing here writes to the service. What is read is kept where reading it
again would cost round trips for nothing: the service map (once), the devices'
parts (see ``_PART_MAX_AGE_S``) and each system's latest answer with an ETag
(see ``_RECENT_SYSTEM_S``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import quote

from composespawner.domain.hardware import Inventory
from composespawner.fabric.base import CompositionMode, DeviceNotFound, FabricRefused
from composespawner.fabric.redfish import capabilities, mapping
from composespawner.fabric.redfish.mapping import Document, dig
from composespawner.fabric.redfish.transport import (
    SERVICE_ROOT,
    Deadline,
    RedfishTransport,
    Response,
)

T = TypeVar("T")

# A device's parts (a GPU's Processor, a NIC's EthernetInterfaces, a Storage and
# its Drives) describe the hardware, which does not change while its block is in
# the fabric: an inventory reads them all once (inline in the block listing,
# where the service can expand that deep), then only the three collections and
# the parts of devices new since. All are read again after this long, in case
# hardware was swapped behind an unchanged URI.
_PART_MAX_AGE_S = 300.0
# A system's latest answer (the inventory's expanded listing, our tag PATCH's
# answer, the read of its mark) may stand in for the GET the next change on that
# system starts with, for this long: on a BMC-class service every round trip counts.
_RECENT_SYSTEM_S = 5.0

MODE_WORDS: dict[CompositionMode, str] = {
    "expandable": "adding resource blocks to expandable systems",
    "specific": "POST of whole systems to its Systems collection",
    "action": "the CompositionService.Compose action",
}


@dataclass(frozen=True, slots=True)
class ServiceMap:
    """Where a service keeps what we use, read once from its service root."""

    systems: str
    resource_blocks: str
    resource_zones: str
    expand: str | None  # query string that inlines collection members, if supported
    expand_parts: str | None  # ... and the blocks' device parts with them, if supported
    composition: CompositionMode = "expandable"
    compose_target: str | None = None  # CompositionService.Compose, in "action" mode

    @property
    def whole_systems(self) -> bool:
        return self.composition != "expandable"


@dataclass(frozen=True, slots=True)
class Seen:
    """A system as one of its answers showed it: the document and its ETag."""

    body: Document
    tag: str

    def document(self) -> Document:
        return self.body

    def etag(self) -> str:
        return self.tag


class Discovery:
    """What a Redfish service has, read through ``transport``: the reads every
    operation of :class:`~composespawner.fabric.redfish.RedfishFabric` starts from."""

    def __init__(self, transport: RedfishTransport, log: logging.Logger) -> None:
        self._transport = transport
        self._log = log
        self._service: ServiceMap | None = None
        self._parts: dict[str, Document] = {}  # device parts by URI, all read at:
        self._parts_read_at: float | None = None
        # system id → (how its latest answer with an ETag showed it, when); used
        # once. The ETag guards it: if the system changed since, the service
        # refuses the change as stale and we read the system afresh.
        self._recent: dict[str, tuple[Seen, float]] = {}
        # Whether a composed system's Links.ResourceBlocks may be PATCHed (machines
        # share it), as the service last said or showed: by a system's
        # @Redfish.WriteableProperties, or by refusing that PATCH. None: not known yet.
        self.blocks_writable: bool | None = None

    async def document(self, path: str, deadline: Deadline) -> dict[str, Any]:
        response = await self._transport.request("GET", path, deadline)
        if not response.ok:
            raise response.refusal()
        return response.document()

    async def service_map(self, deadline: Deadline) -> ServiceMap:
        if self._service is None:
            root = await self.document(SERVICE_ROOT, deadline)
            composition_uri = dig(root, "CompositionService", "@odata.id")
            systems_uri = dig(root, "Systems", "@odata.id")
            if not isinstance(composition_uri, str) or not isinstance(systems_uri, str):
                raise FabricRefused("the Redfish service has no CompositionService or Systems")
            composition = await self.document(composition_uri, deadline)
            service = ServiceMap(
                systems=systems_uri,
                resource_blocks=_link(composition, "ResourceBlocks"),
                resource_zones=_link(composition, "ResourceZones"),
                expand=mapping.expand_query(root),
                expand_parts=mapping.deep_expand_query(root),
            )
            mode, compose_target = await self._composition_mode(composition, service, deadline)
            self._service = replace(service, composition=mode, compose_target=compose_target)
            self._log.info("Redfish service composes by %s", MODE_WORDS[mode])
        return self._service

    async def _composition_mode(
        self, composition: Document, service: ServiceMap, deadline: Deadline
    ) -> tuple[CompositionMode, str | None]:
        """How the service composes, from what it advertises: the Compose action
        (if it applies manifests), else POST to Systems (said on the collection,
        or by older services on each resource zone), else expandable hosts."""
        action = dig(composition, "Actions", "#CompositionService.Compose")
        target = dig(action, "target")
        if isinstance(target, str) and await self._applies_manifests(action, deadline):
            return "action", target
        systems = await self.document(service.systems, deadline)
        if capabilities.creates_systems(systems) or await self._zones_create_systems(
            service, deadline
        ):
            return "specific", None
        return "expandable", None

    async def _zones_create_systems(self, service: ServiceMap, deadline: Deadline) -> bool:
        """Whether the resource zones advertise POST of composed systems (older services)."""
        try:
            zones = await self.members(service.resource_zones, service.expand, deadline)
        except DeviceNotFound:
            return False  # no zones to say anything: attach and tag need none
        linked = await self.fetch_existing(capabilities.zone_capabilities_uris(zones), deadline)
        return capabilities.zones_create_systems(zones, linked)

    async def _applies_manifests(self, action: Document, deadline: Deadline) -> bool:
        info_uri = dig(action, "@Redfish.ActionInfo")
        if not isinstance(info_uri, str):
            return True  # no ActionInfo: the schema's parameters, Apply among them
        info = await self.document_if_present(info_uri, deadline)
        return capabilities.action_allows(
            info or {}, "RequestType", "Apply"
        ) and capabilities.action_allows(info or {}, "RequestFormat", "Manifest")

    async def inventory(self, deadline: Deadline) -> Inventory:
        service = await self.service_map(deadline)
        now = time.monotonic()
        read_all_parts = self._parts_read_at is None or now - self._parts_read_at >= _PART_MAX_AGE_S
        blocks_query = service.expand
        if read_all_parts:
            self._parts = {}
            blocks_query = service.expand_parts or service.expand
        blocks, zones, systems = await _all(
            [
                self.members(service.resource_blocks, blocks_query, deadline),
                self.members(service.resource_zones, service.expand, deadline),
                self.members(service.systems, service.expand, deadline),
            ]
        )
        self._parts |= mapping.inline_parts(blocks)
        part_uris = [uri for block in blocks for uri in mapping.device_part_uris(block)]
        if service.whole_systems:  # a free compute block's capacity is in its CPUs and DIMMs
            part_uris += [uri for block in blocks for uri in mapping.compute_part_uris(block)]
        parts = await self._device_parts(part_uris, deadline)
        parts |= await self._device_parts(mapping.storage_drive_uris(parts), deadline)
        # Forget parts of devices that left the fabric.
        self._parts = parts
        if read_all_parts:
            self._parts_read_at = now
        for system in systems:
            etag = system.get("@odata.etag")
            if isinstance(etag, str) and etag:
                self._recent[mapping.resource_id(system)] = (Seen(system, etag), now)
            self.learn_blocks_writable(system)
        return mapping.build_inventory(
            blocks=blocks,
            zones=zones,
            systems=systems,
            parts=parts,
            whole_systems=service.whole_systems,
            blocks_writable=self.blocks_writable,
        )

    def learn_blocks_writable(self, system: Document) -> None:
        """Remember what a composed system says of PATCHing its blocks, if it says."""
        said = None if mapping.is_expandable(system) else mapping.blocks_writable(system)
        if said is not None:
            self.blocks_writable = said

    async def _device_parts(self, uris: Iterable[str], deadline: Deadline) -> dict[str, Document]:
        """Part documents by normalized URI: known ones, the rest fetched."""
        wanted = dict.fromkeys(mapping.normalized(u) for u in uris)
        known = {uri: self._parts[uri] for uri in wanted if uri in self._parts}
        fetched = await self.fetch_existing((u for u in wanted if u not in known), deadline)
        self._parts |= fetched
        return known | fetched

    async def members(self, collection: str, expand: str | None, deadline: Deadline) -> list[Any]:
        """All members of a collection, expanded where the service can, else fetched."""
        members: list[Any] = []
        page: str | None = f"{collection}?{expand}" if expand else collection
        seen: set[str] = set()
        while page and page not in seen:
            seen.add(page)
            document = await self.document(page, deadline)
            listed = document.get("Members")
            members += (
                [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
            )
            next_link = document.get("Members@odata.nextLink")
            page = next_link if isinstance(next_link, str) else None
        # A service may advertise $expand and still answer with references only.
        missing = [m["@odata.id"] for m in members if mapping.is_reference(m)]
        fetched = await self.fetch_existing(missing, deadline)
        expanded = (
            fetched.get(mapping.normalized(m["@odata.id"])) if mapping.is_reference(m) else m
            for m in members
        )
        return [m for m in expanded if m is not None]

    async def fetch_existing(self, uris: Iterable[str], deadline: Deadline) -> dict[str, Document]:
        """Documents by normalized URI, fetched concurrently; vanished ones left out."""
        wanted = list(dict.fromkeys(mapping.normalized(u) for u in uris))
        found = await _all([self.document_if_present(u, deadline) for u in wanted])
        return {uri: doc for uri, doc in zip(wanted, found, strict=True) if doc is not None}

    async def document_if_present(self, path: str, deadline: Deadline) -> Document | None:
        try:
            return await self.document(path, deadline)
        except DeviceNotFound:
            # Removed between listing and reading (hot-unplug): it is not there.
            self._log.debug("%s vanished during discovery", path)
            return None

    async def system_path(self, system_id: str, deadline: Deadline) -> str:
        service = await self.service_map(deadline)
        return f"{service.systems}/{quote(system_id, safe='')}"

    async def system(self, system_id: str, deadline: Deadline) -> tuple[str, Response]:
        path = await self.system_path(system_id, deadline)
        response = await self._transport.request("GET", path, deadline)
        if not response.ok:
            raise response.refusal()
        return path, response

    async def is_expandable(self, host: str, deadline: Deadline) -> bool:
        """Whether ``host`` is an expandable system (else: a compute block to compose on)."""
        if not (await self.service_map(deadline)).whole_systems:
            return True
        path = await self.system_path(host, deadline)
        system = await self.document_if_present(path, deadline)
        return system is not None and mapping.is_expandable(system)

    async def system_holding(self, block_id: str, deadline: Deadline) -> Document | None:
        """The composed system a compute block is part of now, if any."""
        service = await self.service_map(deadline)
        systems = await self.members(service.systems, service.expand, deadline)
        return mapping.system_holding(block_id, systems)

    def remember(self, system_id: str, system: Response) -> None:
        """Keep a system's answer for the next change on it, if it carries an ETag."""
        etag = system.etag() if system.ok and system.body else None
        if etag:
            self._recent[system_id] = (Seen(system.document(), etag), time.monotonic())

    def recall(self, system_id: str) -> Seen | None:
        """The system's latest answer, once, if recent enough to start a change with."""
        recent = self._recent.pop(system_id, None)
        if recent is None or time.monotonic() - recent[1] > _RECENT_SYSTEM_S:
            return None
        return recent[0]


def _link(document: Document, name: str) -> str:
    uri = dig(document, name, "@odata.id")
    if not isinstance(uri, str):
        raise FabricRefused(f"the CompositionService has no {name}")
    return uri


async def _all(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Await all concurrently; on the first failure cancel the rest and re-raise it."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
