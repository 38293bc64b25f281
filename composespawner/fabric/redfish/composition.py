"""Whole systems: composing and decomposing where the service makes new systems.

Two modes of Redfish composition create a ComputerSystem from a compute block
and devices: specific composition (POST to the Systems collection) and the
``CompositionService.Compose`` action (a manifest). Either way the new system
carries our mark, so a lost answer is settled by looking for it.

Several machines of one hub share a composed system where the service lets its
blocks change. The next machine joins with one ``PATCH`` of the system: the
whole ``Links.ResourceBlocks`` (those there now and its own) and the mark with
it on, under ``If-Match`` of the system as read; a machine leaves with one
``PATCH`` without its blocks and off the mark, and the last one deletes the
system, also under ``If-Match``. A stale ETag (another machine joined or left
meanwhile) means reading the system again and making the change on what is
there now: nobody's blocks or place on the mark are lost.

Where the service refuses that PATCH (``Base.PropertyNotWritable`` on
``Links/ResourceBlocks``, or 405), or its systems say so beforehand
(``Links`` with ``@Redfish.WriteableProperties`` not listing ``ResourceBlocks``),
its composed systems keep their blocks until deleted: a composed system is one
machine's, a compose onto one that holds a machine is :class:`DeviceInUse`, and
the client remembers that of the service (``Discovery.blocks_writable``), so its
hosts are not offered for sharing (``Host.shareable``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from composespawner.domain.hardware import CompositionTag, HostMark
from composespawner.fabric.base import (
    OEM_KEY,
    DeviceInUse,
    DeviceNotFound,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    StaleETag,
    host_taken_by,
)
from composespawner.fabric.redfish import capabilities, mapping
from composespawner.fabric.redfish.discovery import Discovery
from composespawner.fabric.redfish.errors import has_message
from composespawner.fabric.redfish.expandable import ATTACH, STALE_PAUSE
from composespawner.fabric.redfish.mapping import Document, dig
from composespawner.fabric.redfish.tasks import OutcomeUnknown, outcome
from composespawner.fabric.redfish.transport import (
    Deadline,
    RedfishRetry,
    RedfishTimeouts,
    RedfishTransport,
    Response,
)


class WholeSystems:
    """Compose and decompose by creating, changing and deleting systems (specific
    composition, the Compose action)."""

    def __init__(
        self,
        transport: RedfishTransport,
        discovery: Discovery,
        *,
        timeouts: RedfishTimeouts,
        retry: RedfishRetry,
        log: logging.Logger,
    ) -> None:
        self._transport = transport
        self._discovery = discovery
        self._timeouts = timeouts
        self._retry = retry
        self._log = log

    async def compose(
        self, host: str, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str:
        """Create the system, or join ``tag``'s machine to the one of its hub on ``host``;
        a lost answer is settled by looking, a stale ETag by reading again."""
        reads = 0
        while True:
            reads += 1
            system = await self._discovery.system_holding(host, deadline)
            try:
                if system is None:
                    created = await self._create(host, blocks, tag, deadline)
                    if created is not None:
                        return created
                    continue  # composed by another machine of ours meanwhile: join it
                mark = mapping.host_mark(system)
                if mark is not None and mark.has(tag):
                    self._log.debug("compose %s: already composed on %s", tag.machine, host)
                    return mapping.resource_id(system)
                _refuse_unless_ours(host, system, tag)
                return await self._join(host, mapping.resource_id(system), blocks, tag, deadline)
            except StaleETag:
                if reads >= self._retry.etag_attempts:
                    raise
            await _pause(reads)

    async def decompose(
        self, host: str, devices: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> bool:
        """Take ``tag``'s machine off ``host``: its ``devices`` out of the system and it off
        the mark, or the whole system when it is the last machine there."""
        reads = 0
        while True:
            reads += 1
            system = await self._discovery.system_holding(host, deadline)
            mark = mapping.host_mark(system) if system is not None else None
            if system is None or mark is None or not mark.has(tag):
                return False
            try:
                path, read = await self._discovery.system(mapping.resource_id(system), deadline)
                current = mapping.host_mark(read.document())
                if current is None or not current.has(tag):
                    return False
                rest = current.left(tag)
                if rest is None:
                    await self._delete(host, path, read, deadline)
                else:
                    linked = mapping.system_block_ids(read.document())
                    kept = [b for b in linked if b == host or b not in devices]
                    await self._patch(path, read, kept, rest, deadline)
                return True
            except (StaleETag, DeviceNotFound):
                # Another machine joined or left since the read, or the system went.
                if reads >= self._retry.etag_attempts:
                    raise
            await _pause(reads)

    async def _create(
        self, host: str, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str | None:
        """POST the composition; the new system's Id, or None when the host was composed
        meanwhile (by another machine of ours, whose system this one may join)."""
        try:
            created = await self._request_composition(blocks, tag, deadline)
        except (FabricRefused, FabricTaskFailed, OutcomeUnknown) as exc:
            # ResourceBlockInUse may be our own earlier try, whose answer was lost, or
            # another machine's composition of this host, just made.
            ids = getattr(exc, "message_ids", ())
            if not isinstance(exc, OutcomeUnknown) and not has_message(ids, ATTACH.tolerated):
                raise
            system = await self._discovery.system_holding(host, deadline)
            mark = mapping.host_mark(system) if system is not None else None
            if system is not None and mark is not None and mark.has(tag):
                return mapping.resource_id(system)
            if isinstance(exc, OutcomeUnknown):
                raise FabricUnreachable(f"compose {tag.machine} on {host}: {exc}") from exc
            if system is None:
                raise  # a device of the request is someone else's
            _refuse_unless_ours(host, system, tag)
            return None
        return created or await self._created_by_looking(host, tag, deadline)

    async def _join(
        self,
        host: str,
        system_id: str,
        blocks: Sequence[str],
        tag: CompositionTag,
        deadline: Deadline,
    ) -> str:
        """One PATCH: the system's blocks with this machine's, and the mark with it on."""
        path, read = await self._discovery.system(system_id, deadline)
        document = read.document()
        mark = mapping.host_mark(document)
        if mark is not None and mark.has(tag):
            return system_id
        _refuse_unless_ours(host, document, tag)
        assert mark is not None  # ours: _refuse_unless_ours let it through
        self._discovery.learn_blocks_writable(document)
        if self._discovery.blocks_writable is False:
            raise _one_machine_each(host, mark)
        linked = mapping.system_block_ids(document)
        wanted = [*linked, *(b for b in blocks if b not in linked)]
        try:
            await self._patch(path, read, wanted, mark.joined(tag), deadline)
        except FabricRefused as refused:
            if refused.status != 405 and not has_message(
                refused.message_ids, "PropertyNotWritable"
            ):
                raise
            self._discovery.blocks_writable = False
            raise _one_machine_each(host, mark) from refused
        self._log.debug("compose %s: joined %s on %s", tag.machine, system_id, host)
        return system_id

    async def _patch(
        self,
        path: str,
        read: Response,
        blocks: Sequence[str],
        mark: HostMark,
        deadline: Deadline,
    ) -> None:
        """The system's whole block list and its mark, as one write against its ETag."""
        service = await self._discovery.service_map(deadline)
        payload = {
            "Links": {"ResourceBlocks": _references(service.resource_blocks, blocks)},
            "Oem": {OEM_KEY: mapping.mark_object(mark)},
        }
        answer = await self._transport.request(
            "PATCH", path, deadline, payload=payload, headers=_if_match(read)
        )
        try:
            await self._outcome(answer, deadline)
        except OutcomeUnknown as unknown:
            now = await self._discovery.document(path, deadline)
            if (mapping.system_block_ids(now), mapping.host_mark(now)) != (list(blocks), mark):
                raise FabricUnreachable(f"PATCH {path}: {unknown}") from unknown

    async def _delete(self, host: str, path: str, read: Response, deadline: Deadline) -> None:
        """DELETE the system, if nobody changed it since ``read`` (else StaleETag)."""
        answer = await self._transport.request("DELETE", path, deadline, headers=_if_match(read))
        if answer.status == 404:
            return  # gone already: an earlier try of ours, whose answer was lost
        try:
            await self._outcome(answer, deadline)
        except OutcomeUnknown as unknown:
            if await self._discovery.system_holding(host, deadline) is not None:
                raise FabricUnreachable(f"DELETE {path}: {unknown}") from unknown

    async def _created_by_looking(self, host: str, tag: CompositionTag, deadline: Deadline) -> str:
        system = await self._discovery.system_holding(host, deadline)
        mark = mapping.host_mark(system) if system is not None else None
        if system is None or mark is None or not mark.has(tag):
            raise FabricUnreachable(f"compose {tag.machine} on {host}: accepted, but not found")
        return mapping.resource_id(system)

    async def _request_composition(
        self, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str | None:
        """POST the composition the way the service takes it; the new system's Id if told."""
        service = await self._discovery.service_map(deadline)
        request = _composition_request(service.resource_blocks, blocks, tag)
        if service.compose_target is not None:
            answer = await self._transport.request(
                "POST", service.compose_target, deadline, payload=_manifest(request, tag.machine)
            )
            final = await self._outcome(answer, deadline)
            return capabilities.composed_system_id(final.document() if final.body else {})
        answer = await self._transport.request("POST", service.systems, deadline, payload=request)
        final = await self._outcome(answer, deadline)
        location = final.headers.get("Location") if final.status in (201, 204) else None
        created = location or (mapping.uri_of(final.document()) if final.body else None)
        systems = mapping.normalized(service.systems) + "/"
        return mapping.id_from_uri(created) if created and systems in created else None

    async def _outcome(self, answer: Response, deadline: Deadline) -> Response:
        return await outcome(
            self._transport, answer, deadline, poll_max=self._timeouts.task_poll_max
        )


def _composition_request(
    blocks_uri: str, blocks: Sequence[str], tag: CompositionTag
) -> dict[str, Any]:
    """A ComputerSystem to create: the compute block first, then the devices, and our mark."""
    return {
        "Name": f"{tag.owner} ({tag.machine})",
        "Links": {"ResourceBlocks": _references(blocks_uri, blocks)},
        "Oem": {OEM_KEY: mapping.mark_object(HostMark.of(tag))},
    }


def _references(blocks_uri: str, blocks: Sequence[str]) -> list[dict[str, str]]:
    return [{"@odata.id": f"{blocks_uri}/{quote(b, safe='')}"} for b in blocks]


def _if_match(read: Response) -> dict[str, str]:
    etag = read.etag()
    return {"If-Match": etag} if etag else {}


def _refuse_unless_ours(host: str, system: Document, tag: CompositionTag) -> None:
    """DeviceInUse unless ``system`` carries the mark of ``tag``'s hub."""
    holder = host_taken_by(
        mapping.host_mark(system),
        marked=dig(system, "Oem", OEM_KEY) is not None,
        attached=mapping.system_block_ids(system) or [host],
        hub=tag.hub,
    )
    if holder:
        raise DeviceInUse(f"host {host} is already composed for {holder}")


def _one_machine_each(host: str, mark: HostMark) -> DeviceInUse:
    machines = ", ".join(f"{m.machine} of {m.owner}" for m in mark.machines)
    return DeviceInUse(
        f"host {host} is already composed for machine {machines}: this fabric keeps a "
        "composed system's blocks until it is deleted (Links.ResourceBlocks is not "
        "writable), so each composed system carries one machine; place on another host"
    )


async def _pause(reads: int) -> None:
    """A short random wait before reading again, so machines racing for one system
    do not collide in step."""
    await asyncio.sleep(random.uniform(0, STALE_PAUSE * reads))


def _manifest(request: Document, stanza_id: str) -> dict[str, Any]:
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": stanza_id, "Request": request}
    return {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}
