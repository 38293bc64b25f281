"""RedfishFabric: the Fabric protocol over a DMTF Redfish CompositionService."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import quote

from composespawner.domain.hardware import CompositionTag, Device, Inventory
from composespawner.fabric.base import (
    OEM_KEY,
    CompositionMode,
    DeviceInUse,
    DeviceNotFound,
    FabricDeadlineExceeded,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    NotExpandable,
    Progress,
    StaleETag,
    compose_by_attaching,
    decompose_by_detaching,
    host_taken_by,
    same_machine,
)
from composespawner.fabric.redfish import mapping
from composespawner.fabric.redfish.errors import (
    NOT_ATTACHED_IDS,
    error_messages,
    has_message,
    parse_body,
)
from composespawner.fabric.redfish.mapping import Document, dig
from composespawner.fabric.redfish.transport import (
    MAX_IN_FLIGHT,
    SERVICE_ROOT,
    Deadline,
    RedfishRetry,
    RedfishTimeouts,
    RedfishTransport,
    Response,
    retry_after_seconds,
)

T = TypeVar("T")

DEFAULT_LOGGER = "composespawner.fabric.redfish"
DEFAULT_TIMEOUTS = RedfishTimeouts()
DEFAULT_RETRY = RedfishRetry()
_TASK_FAILED = frozenset({"Exception", "Killed", "Cancelled", "Interrupted"})
_TASK_RUNNING = frozenset(
    {"New", "Starting", "Running", "Suspended", "Pending", "Stopping", "Cancelling", "Service"}
)
# Monitor answers that may come from the monitor itself rather than the operation.
_MONITOR_LOST = frozenset({404, 410, 502, 503, 504})
# Message ids that only an operation on blocks gives (never a missing monitor).
_OPERATION_REFUSALS = frozenset(
    {"ResourceBlockInUse", "ResourceBlockNotFound", "IncompatibleZone", "NoResourceMatch"}
)
# How long to wait between task polls when the monitor gives no Retry-After.
_DEFAULT_TASK_POLL = 1.0
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
class _Change:
    """One direction of ``attach``/``detach``."""

    verb: str
    action: str  # key under the system's Actions
    attach: bool
    tolerated: frozenset[str]  # message ids meaning "maybe done already: look"


_ATTACH = _Change(
    "attach", "#ComputerSystem.AddResourceBlock", True, frozenset({"ResourceBlockInUse"})
)
_DETACH = _Change("detach", "#ComputerSystem.RemoveResourceBlock", False, NOT_ATTACHED_IDS)


@dataclass(frozen=True, slots=True)
class _Seen:
    """A system as one of its answers showed it: the document and its ETag."""

    body: Document
    tag: str

    def document(self) -> Document:
        return self.body

    def etag(self) -> str:
        return self.tag


class _OutcomeUnknown(Exception):
    """A write was accepted but we cannot tell from its answer whether it happened."""


class RedfishFabric:
    """The :class:`~composespawner.fabric.base.Fabric` protocol over DMTF Redfish.

    Devices are attached to expandable hosts with the ``AddResourceBlock`` /
    ``RemoveResourceBlock`` actions the host's ComputerSystem advertises;
    hosts are tagged through ``Oem.ComposeSpawner``. Every method is bounded by
    ``timeouts.operation`` and raises only errors of the ``base.py`` tree.
    Over https certificates are always verified, against ``ca_bundle`` (a PEM
    file) when given, else the system's CAs.
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str,
        password: str,
        timeouts: RedfishTimeouts = DEFAULT_TIMEOUTS,
        retry: RedfishRetry = DEFAULT_RETRY,
        ca_bundle: str | None = None,
        log: logging.Logger | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self._log = log or logging.getLogger(DEFAULT_LOGGER)
        self._timeouts = timeouts
        self._retry = retry
        self._transport = RedfishTransport(
            base_url,
            username=username,
            password=password,
            timeouts=timeouts,
            retry=retry,
            ca_bundle=ca_bundle,
            log=self._log,
            max_in_flight=max_in_flight,
        )
        self._service: ServiceMap | None = None
        self._action_targets: dict[tuple[str, str], str] = {}
        self._parts: dict[str, Document] = {}  # device parts by URI, all read at:
        self._parts_read_at: float | None = None
        # system id → (how its latest answer with an ETag showed it, when); used
        # once. The ETag guards it: if the system changed since, the service
        # refuses the change as stale and we read the system afresh.
        self._recent: dict[str, tuple[_Seen, float]] = {}

    # -- the protocol ---------------------------------------------------------------------

    async def inventory(self) -> Inventory:
        return await self._within_deadline("inventory", self._inventory)

    async def compose(
        self, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
    ) -> str:
        if await self._within_deadline(f"read {host}", self._is_expandable(host)):
            return await compose_by_attaching(self, host, devices, tag, progress)
        progress(f"composing {_count_devices(devices)} on {host}")
        blocks = [host, *(d.block_id for d in devices)]
        return await self._within_deadline(
            f"compose {tag.machine} on {host}",
            lambda deadline: self._compose_system(host, blocks, tag, deadline),
        )

    async def decompose(self, host: str, blocks: Sequence[str], tag: CompositionTag) -> bool:
        if await self._within_deadline(f"read {host}", self._is_expandable(host)):
            return await decompose_by_detaching(self, host, blocks, tag)
        return await self._within_deadline(
            f"decompose {tag.machine} on {host}",
            lambda deadline: self._decompose_system(host, tag, deadline),
        )

    async def attach(self, system_id: str, block_id: str) -> None:
        await self._within_deadline(
            f"attach {block_id} to {system_id}",
            lambda deadline: self._change(system_id, block_id, _ATTACH, deadline),
        )

    async def detach(self, system_id: str, block_id: str) -> None:
        await self._within_deadline(
            f"detach {block_id} from {system_id}",
            lambda deadline: self._change(system_id, block_id, _DETACH, deadline),
        )

    async def host_mark(self, system_id: str) -> tuple[CompositionTag | None, tuple[str, ...]]:
        async def read(deadline: Deadline) -> tuple[CompositionTag | None, tuple[str, ...]]:
            if not await self._is_expandable(system_id)(deadline):
                found = await self._system_holding(system_id, deadline)
                document = found or {}
                blocks = mapping.system_block_ids(document) or [system_id]
                return mapping.composition_tag(document), tuple(blocks)
            _, system = await self._system(system_id, deadline)
            self._remember(system_id, system)
            document = system.document()
            return mapping.composition_tag(document), tuple(mapping.system_block_ids(document))

        return await self._within_deadline(f"read {system_id}", read)

    async def tag_host(self, system_id: str, tag: CompositionTag | None) -> None:
        await self._within_deadline(
            f"tag {system_id}", lambda deadline: self._tag(system_id, tag, deadline)
        )

    def seconds_since_answer(self) -> float:
        return time.monotonic() - self._transport.answered_at

    async def close(self) -> None:
        await self._transport.close()

    async def _within_deadline(self, what: str, work: Callable[[Deadline], Awaitable[T]]) -> T:
        seconds = self._timeouts.operation
        try:
            async with asyncio.timeout(seconds):
                return await work(Deadline(seconds))
        except TimeoutError as exc:
            raise FabricDeadlineExceeded(f"{what}: not done within {seconds:g} s") from exc

    # -- reading ---------------------------------------------------------------------------

    async def _document(self, path: str, deadline: Deadline) -> dict[str, Any]:
        response = await self._transport.request("GET", path, deadline)
        if not response.ok:
            raise response.refusal()
        return response.document()

    async def _service_map(self, deadline: Deadline) -> ServiceMap:
        if self._service is None:
            root = await self._document(SERVICE_ROOT, deadline)
            composition_uri = dig(root, "CompositionService", "@odata.id")
            systems_uri = dig(root, "Systems", "@odata.id")
            if not isinstance(composition_uri, str) or not isinstance(systems_uri, str):
                raise FabricRefused("the Redfish service has no CompositionService or Systems")
            composition = await self._document(composition_uri, deadline)
            service = ServiceMap(
                systems=systems_uri,
                resource_blocks=_link(composition, "ResourceBlocks"),
                resource_zones=_link(composition, "ResourceZones"),
                expand=mapping.expand_query(root),
                expand_parts=mapping.deep_expand_query(root),
            )
            mode, compose_target = await self._composition_mode(composition, service, deadline)
            self._service = replace(service, composition=mode, compose_target=compose_target)
            self._log.info("Redfish service composes by %s", _MODE_WORDS[mode])
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
        systems = await self._document(service.systems, deadline)
        if mapping.creates_systems(systems) or await self._zones_create_systems(service, deadline):
            return "specific", None
        return "expandable", None

    async def _zones_create_systems(self, service: ServiceMap, deadline: Deadline) -> bool:
        """Whether the resource zones advertise POST of composed systems (older services)."""
        try:
            zones = await self._members(service.resource_zones, service.expand, deadline)
        except DeviceNotFound:
            return False  # no zones to say anything: attach and tag need none
        linked = await self._fetch_existing(mapping.zone_capabilities_uris(zones), deadline)
        return mapping.zones_create_systems(zones, linked)

    async def _applies_manifests(self, action: Document, deadline: Deadline) -> bool:
        info_uri = dig(action, "@Redfish.ActionInfo")
        if not isinstance(info_uri, str):
            return True  # no ActionInfo: the schema's parameters, Apply among them
        info = await self._document_if_present(info_uri, deadline)
        return mapping.action_allows(info or {}, "RequestType", "Apply") and mapping.action_allows(
            info or {}, "RequestFormat", "Manifest"
        )

    async def _inventory(self, deadline: Deadline) -> Inventory:
        service = await self._service_map(deadline)
        now = time.monotonic()
        read_all_parts = self._parts_read_at is None or now - self._parts_read_at >= _PART_MAX_AGE_S
        blocks_query = service.expand
        if read_all_parts:
            self._parts = {}
            blocks_query = service.expand_parts or service.expand
        blocks, zones, systems = await _all(
            [
                self._members(service.resource_blocks, blocks_query, deadline),
                self._members(service.resource_zones, service.expand, deadline),
                self._members(service.systems, service.expand, deadline),
            ]
        )
        self._parts |= mapping.inline_parts(blocks)
        parts = await self._device_parts(
            (uri for block in blocks for uri in mapping.device_part_uris(block)), deadline
        )
        parts |= await self._device_parts(mapping.storage_drive_uris(parts), deadline)
        # Forget parts of devices that left the fabric.
        self._parts = parts
        if read_all_parts:
            self._parts_read_at = now
        for system in systems:
            etag = system.get("@odata.etag")
            if isinstance(etag, str) and etag:
                self._recent[mapping.resource_id(system)] = (_Seen(system, etag), now)
        return mapping.build_inventory(
            blocks=blocks,
            zones=zones,
            systems=systems,
            parts=parts,
            whole_systems=service.whole_systems,
        )

    async def _device_parts(self, uris: Iterable[str], deadline: Deadline) -> dict[str, Document]:
        """Part documents by normalized URI: known ones, the rest fetched."""
        wanted = dict.fromkeys(mapping.normalized(u) for u in uris)
        known = {uri: self._parts[uri] for uri in wanted if uri in self._parts}
        fetched = await self._fetch_existing((u for u in wanted if u not in known), deadline)
        self._parts |= fetched
        return known | fetched

    async def _members(self, collection: str, expand: str | None, deadline: Deadline) -> list[Any]:
        """All members of a collection, expanded where the service can, else fetched."""
        members: list[Any] = []
        page: str | None = f"{collection}?{expand}" if expand else collection
        seen: set[str] = set()
        while page and page not in seen:
            seen.add(page)
            document = await self._document(page, deadline)
            listed = document.get("Members")
            members += (
                [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
            )
            next_link = document.get("Members@odata.nextLink")
            page = next_link if isinstance(next_link, str) else None
        # A service may advertise $expand and still answer with references only.
        missing = [m["@odata.id"] for m in members if mapping.is_reference(m)]
        fetched = await self._fetch_existing(missing, deadline)
        expanded = (
            fetched.get(mapping.normalized(m["@odata.id"])) if mapping.is_reference(m) else m
            for m in members
        )
        return [m for m in expanded if m is not None]

    async def _fetch_existing(self, uris: Iterable[str], deadline: Deadline) -> dict[str, Document]:
        """Documents by normalized URI, fetched concurrently; vanished ones left out."""
        wanted = list(dict.fromkeys(mapping.normalized(u) for u in uris))
        found = await _all([self._document_if_present(u, deadline) for u in wanted])
        return {uri: doc for uri, doc in zip(wanted, found, strict=True) if doc is not None}

    async def _document_if_present(self, path: str, deadline: Deadline) -> Document | None:
        try:
            return await self._document(path, deadline)
        except DeviceNotFound:
            # Removed between listing and reading (hot-unplug): it is not there.
            self._log.debug("%s vanished during discovery", path)
            return None

    async def _system_path(self, system_id: str, deadline: Deadline) -> str:
        service = await self._service_map(deadline)
        return f"{service.systems}/{quote(system_id, safe='')}"

    async def _system(self, system_id: str, deadline: Deadline) -> tuple[str, Response]:
        path = await self._system_path(system_id, deadline)
        response = await self._transport.request("GET", path, deadline)
        if not response.ok:
            raise response.refusal()
        return path, response

    # -- attach / detach -------------------------------------------------------------------

    async def _change(
        self, system_id: str, block_id: str, change: _Change, deadline: Deadline
    ) -> None:
        await self._refuse_unless_expandable(system_id, f"{change.verb} {block_id}", deadline)
        service = await self._service_map(deadline)
        block_uri = f"{service.resource_blocks}/{quote(block_id, safe='')}"
        what = f"{change.verb} {block_id} / {system_id}"

        def done(system: _Seen | Response) -> bool:
            document = system.document()
            if (block_id in mapping.system_block_ids(document)) == change.attach:
                return True
            _refuse_unless_takes_devices(system_id, document, what)
            return False

        async def request(path: str, system: _Seen | Response) -> None:
            try:
                await self._request_change(system_id, system, block_uri, change, deadline)
            except StaleETag:
                raise  # a FabricRefused, but _write_system's to handle: read again
            except (FabricRefused, FabricTaskFailed, _OutcomeUnknown) as exc:
                await self._settle(system_id, block_id, change, exc, deadline)

        wrote = await self._write_system(system_id, what, done, request, deadline)
        self._log.debug("%s: %s", what, "done" if wrote else "already done")

    async def _write_system(
        self,
        system_id: str,
        what: str,
        done: Callable[[_Seen | Response], bool],
        write: Callable[[str, _Seen | Response], Awaitable[None]],
        deadline: Deadline,
    ) -> bool:
        """Write to a system against its ETag; False if a fresh read says it is done.

        The first try starts from the system's remembered answer, if one is
        recent and ``done`` neither says it is done nor raises (it refuses a
        taken host): only a fresh read may decide those. A stale ETag means
        reading the system again, ``etag_attempts`` fresh reads at most.
        """
        path = await self._system_path(system_id, deadline)
        system: _Seen | Response | None = self._recall(system_id)
        try:
            if system is not None and done(system):
                system = None
        except FabricRefused:
            system = None
        fresh_reads = 0
        while True:
            fresh = system is None
            if system is None:
                fresh_reads += 1
                path, system = await self._system(system_id, deadline)
                if done(system):
                    return False
            try:
                await write(path, system)
            except StaleETag:
                if fresh and fresh_reads >= self._retry.etag_attempts:
                    raise
                # A remembered answer going stale is expected now and then: no warning.
                self._log.log(
                    logging.WARNING if fresh else logging.DEBUG, "%s: ETag went stale", what
                )
                system = None
                continue
            return True

    async def _request_change(
        self,
        system_id: str,
        system: _Seen | Response,
        block_uri: str,
        change: _Change,
        deadline: Deadline,
    ) -> None:
        target = self._action_target(system_id, system.document(), change.action)
        payload: dict[str, Any] = {"ResourceBlock": {"@odata.id": block_uri}}
        etag = system.etag()
        if etag:
            payload["ComputerSystemETag"] = etag
        response = await self._transport.request("POST", target, deadline, payload=payload)
        await self._outcome(response, deadline)

    async def _settle(
        self, system_id: str, block_id: str, change: _Change, error: Exception, deadline: Deadline
    ) -> None:
        """Look at the system after an unclear answer; re-raise unless it is done.

        Answers like ResourceBlockInUse on attach arrive when an earlier try of
        ours succeeded but its answer was lost: done, if the block is here.
        """
        ids = getattr(error, "message_ids", ())
        if not isinstance(error, _OutcomeUnknown) and not has_message(ids, change.tolerated):
            raise error
        _, system = await self._system(system_id, deadline)
        if (block_id in mapping.system_block_ids(system.document())) == change.attach:
            return
        if isinstance(error, _OutcomeUnknown):
            raise FabricUnreachable(f"{change.verb} {block_id} / {system_id}: {error}") from error
        raise error

    def _action_target(self, system_id: str, system: Document, action: str) -> str:
        key = (system_id, action)
        if key not in self._action_targets:
            target = dig(system, "Actions", action, "target")
            if not isinstance(target, str):
                raise FabricRefused(f"system {system_id} does not offer {action}")
            self._action_targets[key] = target
        return self._action_targets[key]

    # -- whole systems (specific composition, the Compose action) ---------------------------

    def _is_expandable(self, host: str) -> Callable[[Deadline], Awaitable[bool]]:
        """Whether ``host`` is an expandable system (else: a compute block to compose on)."""

        async def read(deadline: Deadline) -> bool:
            if not (await self._service_map(deadline)).whole_systems:
                return True
            path = await self._system_path(host, deadline)
            system = await self._document_if_present(path, deadline)
            return system is not None and mapping.is_expandable(system)

        return read

    async def _refuse_unless_expandable(self, host: str, what: str, deadline: Deadline) -> None:
        if not await self._is_expandable(host)(deadline):
            service = await self._service_map(deadline)
            raise NotExpandable(
                f"{what}: {host} is no expandable system, and this fabric composes whole "
                f"systems ({_MODE_WORDS[service.composition]}): use compose/decompose"
            )

    async def _system_holding(self, block_id: str, deadline: Deadline) -> Document | None:
        """The composed system a compute block is part of now, if any."""
        service = await self._service_map(deadline)
        systems = await self._members(service.systems, service.expand, deadline)
        return mapping.system_holding(block_id, systems)

    async def _ours_or_refuse(
        self, host: str, tag: CompositionTag, deadline: Deadline
    ) -> str | None:
        """The Id of ``tag``'s system on ``host`` if composed; DeviceInUse if another's is."""
        system = await self._system_holding(host, deadline)
        if system is None:
            return None
        if same_machine(mapping.composition_tag(system), tag):
            return mapping.resource_id(system)
        holder = host_taken_by(
            mapping.composition_tag(system),
            marked=dig(system, "Oem", OEM_KEY) is not None,
            attached=mapping.system_block_ids(system) or [host],
            wanted=tag,
        )
        raise DeviceInUse(f"host {host} is already composed for {holder}")

    async def _compose_system(
        self, host: str, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str:
        """Create the system unless ours is there; a lost answer is settled by looking."""
        existing = await self._ours_or_refuse(host, tag, deadline)
        if existing is not None:
            self._log.debug("compose %s: already composed as %s", tag.machine, existing)
            return existing
        try:
            created = await self._request_composition(blocks, tag, deadline)
        except (FabricRefused, FabricTaskFailed, _OutcomeUnknown) as exc:
            # ResourceBlockInUse may be our own earlier try, whose answer was lost.
            ids = getattr(exc, "message_ids", ())
            if not isinstance(exc, _OutcomeUnknown) and not has_message(ids, _ATTACH.tolerated):
                raise
            found = await self._ours_or_refuse(host, tag, deadline)
            if found is not None:
                return found
            if isinstance(exc, _OutcomeUnknown):
                raise FabricUnreachable(f"compose {tag.machine} on {host}: {exc}") from exc
            raise
        return created or await self._created_by_looking(host, tag, deadline)

    async def _created_by_looking(self, host: str, tag: CompositionTag, deadline: Deadline) -> str:
        found = await self._ours_or_refuse(host, tag, deadline)
        if found is None:
            raise FabricUnreachable(f"compose {tag.machine} on {host}: accepted, but not found")
        return found

    async def _request_composition(
        self, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str | None:
        """POST the composition the way the service takes it; the new system's Id if told."""
        service = await self._service_map(deadline)
        request = _composition_request(service.resource_blocks, blocks, tag)
        if service.compose_target is not None:
            answer = await self._transport.request(
                "POST", service.compose_target, deadline, payload=_manifest(request, tag.machine)
            )
            final = await self._outcome(answer, deadline)
            return mapping.composed_system_id(final.document() if final.body else {})
        answer = await self._transport.request("POST", service.systems, deadline, payload=request)
        final = await self._outcome(answer, deadline)
        location = final.headers.get("Location") if final.status in (201, 204) else None
        created = location or (mapping.uri_of(final.document()) if final.body else None)
        systems = mapping.normalized(service.systems) + "/"
        return mapping.id_from_uri(created) if created and systems in created else None

    async def _decompose_system(self, host: str, tag: CompositionTag, deadline: Deadline) -> bool:
        system = await self._system_holding(host, deadline)
        if system is None or not same_machine(mapping.composition_tag(system), tag):
            return False
        path = mapping.uri_of(system) or await self._system_path(
            mapping.resource_id(system), deadline
        )
        answer = await self._transport.request("DELETE", path, deadline)
        if answer.status == 404:
            return True  # gone already: an earlier try of ours, whose answer was lost
        try:
            await self._outcome(answer, deadline)
        except _OutcomeUnknown as unknown:
            if await self._system_holding(host, deadline) is not None:
                raise FabricUnreachable(f"DELETE {path}: {unknown}") from unknown
        return True

    # -- tagging ---------------------------------------------------------------------------

    async def _tag(self, system_id: str, tag: CompositionTag | None, deadline: Deadline) -> None:
        await self._refuse_unless_expandable(system_id, f"tag {system_id}", deadline)
        wanted = _tag_object(tag)

        def done(system: _Seen | Response) -> bool:
            document = system.document()
            if dig(document, "Oem", OEM_KEY) == wanted:
                return True
            if tag is not None:
                # Check first, write second: a mark on a host that takes no devices
                # would stand for a machine that can never be composed there.
                _refuse_unless_takes_devices(system_id, document, f"tag {system_id}")
                _refuse_if_taken(system_id, document, tag)
            return False

        async def write(path: str, system: _Seen | Response) -> None:
            written = await self._write_tag(path, system, wanted, deadline)
            if written is not None:
                self._remember(system_id, written)

        wrote = await self._write_system(system_id, f"tag {system_id}", done, write, deadline)
        self._log.debug("tag %s: %s%s", system_id, "" if wrote else "already ", _describe_tag(tag))

    async def _write_tag(
        self, path: str, system: _Seen | Response, wanted: dict[str, str] | None, deadline: Deadline
    ) -> Response | None:
        """PATCH the mark; returns the answer if it is the system as the PATCH left it."""
        etag = system.etag()
        headers = {"If-Match": etag} if etag else {}
        payload = {"Oem": {OEM_KEY: wanted}}
        response = await self._transport.request(
            "PATCH", path, deadline, payload=payload, headers=headers
        )
        try:
            await self._outcome(response, deadline)
        except _OutcomeUnknown as unknown:
            if dig(await self._document(path, deadline), "Oem", OEM_KEY) != wanted:
                raise FabricUnreachable(f"PATCH {path}: {unknown}") from unknown
            return None
        return response if response.status == 200 else None

    def _remember(self, system_id: str, system: Response) -> None:
        """Keep a system's answer for the next change on it, if it carries an ETag."""
        etag = system.etag() if system.ok and system.body else None
        if etag:
            self._recent[system_id] = (_Seen(system.document(), etag), time.monotonic())

    def _recall(self, system_id: str) -> _Seen | None:
        """The system's latest answer, once, if recent enough to start a change with."""
        recent = self._recent.pop(system_id, None)
        if recent is None or time.monotonic() - recent[1] > _RECENT_SYSTEM_S:
            return None
        return recent[0]

    # -- answers and tasks -----------------------------------------------------------------

    async def _outcome(self, response: Response, deadline: Deadline) -> Response:
        """The final answer of a write that succeeded, following a 202 task monitor."""
        if response.status == 202:
            monitor = response.headers.get("Location")
            if not monitor:
                raise _OutcomeUnknown("accepted without a task monitor")
            return await self._follow_task(monitor, response, deadline)
        if not response.ok:
            raise response.refusal()
        return response

    async def _follow_task(self, monitor: str, accepted: Response, deadline: Deadline) -> Response:
        answer = accepted
        while True:
            await asyncio.sleep(self._poll_delay(answer, deadline))
            answer = await self._transport.request("GET", monitor, deadline)
            if answer.status != 202 and not _task_running(answer):
                _task_result(answer)
                return answer

    def _poll_delay(self, answer: Response, deadline: Deadline) -> float:
        asked = retry_after_seconds(answer.headers.get("Retry-After"))
        delay = min(_DEFAULT_TASK_POLL if asked is None else asked, self._timeouts.task_poll_max)
        if delay >= deadline.remaining():
            raise FabricDeadlineExceeded(f"task {answer.path} still running at the deadline")
        return delay


def _task_state(answer: Response) -> Any:
    return dig(parse_body(answer.body), "TaskState")


def _task_running(answer: Response) -> bool:
    return answer.ok and _task_state(answer) in _TASK_RUNNING


def _task_result(answer: Response) -> None:
    """Raise unless a task monitor's final answer says the work was done.

    By DSP0266 the monitor's final answer is the operation's own response, so
    a refusal we know (ResourceBlockInUse, IncompatibleZone, a stale ETag...)
    raises the same error as when the service answers at once: callers need
    not care whether the service works asynchronously. Other failures, and a
    Task that ended in Exception/Killed/Cancelled, raise FabricTaskFailed.
    """
    ids, texts = error_messages(parse_body(answer.body))
    if answer.ok:
        state = _task_state(answer)
        if state in _TASK_FAILED:
            detail = "; ".join(texts) or "no details"
            raise FabricTaskFailed(f"task {answer.path} ended {state}: {detail}", message_ids=ids)
        return
    if answer.status in _MONITOR_LOST and not has_message(ids, _OPERATION_REFUSALS):
        # The monitor is gone or its gateway failed: that says nothing about the work.
        raise _OutcomeUnknown(f"task monitor {answer.path} answered {answer.status}")
    refused = answer.refusal()
    if type(refused) is FabricRefused:
        raise FabricTaskFailed(f"task {answer.path} failed: {refused}", message_ids=ids)
    raise refused


_MODE_WORDS: dict[CompositionMode, str] = {
    "expandable": "adding resource blocks to expandable systems",
    "specific": "POST of whole systems to its Systems collection",
    "action": "the CompositionService.Compose action",
}


def _composition_request(
    blocks_uri: str, blocks: Sequence[str], tag: CompositionTag
) -> dict[str, Any]:
    """A ComputerSystem to create: the compute block first, then the devices, and our mark."""
    return {
        "Name": f"{tag.owner} ({tag.machine})",
        "Links": {
            "ResourceBlocks": [{"@odata.id": f"{blocks_uri}/{quote(b, safe='')}"} for b in blocks]
        },
        "Oem": {OEM_KEY: _tag_object(tag)},
    }


def _manifest(request: Document, stanza_id: str) -> dict[str, Any]:
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": stanza_id, "Request": request}
    return {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}


def _count_devices(devices: Sequence[Device]) -> str:
    counts = Counter(d.kind for d in devices)
    words = {"gpu": "GPU", "nic": "network card", "nvme": "scratch NVMe"}
    parts = [f"{n} {words[k]}{'s' if n > 1 else ''}" for k, n in counts.items()]
    return ", ".join(parts) or "no devices"


def _link(document: Document, name: str) -> str:
    uri = dig(document, name, "@odata.id")
    if not isinstance(uri, str):
        raise FabricRefused(f"the CompositionService has no {name}")
    return uri


def _tag_object(tag: CompositionTag | None) -> dict[str, str] | None:
    """What ``Oem.ComposeSpawner`` holds for ``tag`` (null removes it: merge-patch)."""
    if tag is None:
        return None
    return {"Hub": tag.hub, "Machine": tag.machine, "Owner": tag.owner}


def _refuse_if_taken(system_id: str, system: Document, tag: CompositionTag) -> None:
    # A system lists its own ComputerSystem block among Links.ResourceBlocks;
    # anything beyond that one is an attached device.
    blocks = mapping.system_block_ids(system)
    holder = host_taken_by(
        mapping.composition_tag(system),
        marked=dig(system, "Oem", OEM_KEY) is not None,
        attached=blocks[1:],
        wanted=tag,
    )
    if holder:
        raise DeviceInUse(f"host {system_id} is already composed for {holder}")


def _refuse_unless_takes_devices(system_id: str, system: Document, what: str) -> None:
    """NotExpandable, before anything is written, unless the system is an expandable one."""
    if not mapping.is_expandable(system):
        raise NotExpandable(
            f"{what}: system {system_id} is not expandable (its Composition.UseCases do not"
            " list ExpandableSystem): devices cannot be added to it or taken from it, so"
            " nothing was written to it"
        )


def _describe_tag(tag: CompositionTag | None) -> str:
    return "untagged" if tag is None else f"hub={tag.hub} machine={tag.machine} owner={tag.owner}"


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
