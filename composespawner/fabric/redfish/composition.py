"""Whole systems: composing and decomposing where the service makes new systems.

Two modes of Redfish composition create a ComputerSystem from a compute block
and devices: specific composition (POST to the Systems collection) and the
``CompositionService.Compose`` action (a manifest). Either way the new system
carries our mark, so a lost answer is settled by looking for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from composespawner.domain.hardware import CompositionTag, HostMark
from composespawner.fabric.base import (
    OEM_KEY,
    DeviceInUse,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    host_taken_by,
)
from composespawner.fabric.redfish import mapping
from composespawner.fabric.redfish.discovery import Discovery
from composespawner.fabric.redfish.errors import has_message
from composespawner.fabric.redfish.expandable import ATTACH
from composespawner.fabric.redfish.mapping import Document, dig
from composespawner.fabric.redfish.tasks import OutcomeUnknown, outcome
from composespawner.fabric.redfish.transport import (
    Deadline,
    RedfishTimeouts,
    RedfishTransport,
    Response,
)


class WholeSystems:
    """Compose and decompose by creating and deleting systems (specific composition,
    the Compose action)."""

    def __init__(
        self,
        transport: RedfishTransport,
        discovery: Discovery,
        *,
        timeouts: RedfishTimeouts,
        log: logging.Logger,
    ) -> None:
        self._transport = transport
        self._discovery = discovery
        self._timeouts = timeouts
        self._log = log

    async def compose(
        self, host: str, blocks: Sequence[str], tag: CompositionTag, deadline: Deadline
    ) -> str:
        """Create the system unless ours is there; a lost answer is settled by looking."""
        existing = await self._ours_or_refuse(host, tag, deadline)
        if existing is not None:
            self._log.debug("compose %s: already composed as %s", tag.machine, existing)
            return existing
        try:
            created = await self._request_composition(blocks, tag, deadline)
        except (FabricRefused, FabricTaskFailed, OutcomeUnknown) as exc:
            # ResourceBlockInUse may be our own earlier try, whose answer was lost.
            ids = getattr(exc, "message_ids", ())
            if not isinstance(exc, OutcomeUnknown) and not has_message(ids, ATTACH.tolerated):
                raise
            found = await self._ours_or_refuse(host, tag, deadline)
            if found is not None:
                return found
            if isinstance(exc, OutcomeUnknown):
                raise FabricUnreachable(f"compose {tag.machine} on {host}: {exc}") from exc
            raise
        return created or await self._created_by_looking(host, tag, deadline)

    async def decompose(self, host: str, tag: CompositionTag, deadline: Deadline) -> bool:
        system = await self._discovery.system_holding(host, deadline)
        mark = mapping.host_mark(system) if system is not None else None
        if system is None or mark is None or not mark.has(tag):
            return False
        path = mapping.uri_of(system) or await self._discovery.system_path(
            mapping.resource_id(system), deadline
        )
        answer = await self._transport.request("DELETE", path, deadline)
        if answer.status == 404:
            return True  # gone already: an earlier try of ours, whose answer was lost
        try:
            await self._outcome(answer, deadline)
        except OutcomeUnknown as unknown:
            if await self._discovery.system_holding(host, deadline) is not None:
                raise FabricUnreachable(f"DELETE {path}: {unknown}") from unknown
        return True

    async def _ours_or_refuse(
        self, host: str, tag: CompositionTag, deadline: Deadline
    ) -> str | None:
        """The Id of ``tag``'s system on ``host`` if composed; DeviceInUse if another's is."""
        system = await self._discovery.system_holding(host, deadline)
        if system is None:
            return None
        mark = mapping.host_mark(system)
        if mark is not None and mark.has(tag):
            return mapping.resource_id(system)
        # A whole system is one machine's: another machine of this hub on it holds it too.
        holder = (
            host_taken_by(
                mark,
                marked=dig(system, "Oem", OEM_KEY) is not None,
                attached=mapping.system_block_ids(system) or [host],
                hub=tag.hub,
            )
            or f"machine {', '.join(m.machine for m in mark.machines) if mark else '?'}"
        )
        raise DeviceInUse(f"host {host} is already composed for {holder}")

    async def _created_by_looking(self, host: str, tag: CompositionTag, deadline: Deadline) -> str:
        found = await self._ours_or_refuse(host, tag, deadline)
        if found is None:
            raise FabricUnreachable(f"compose {tag.machine} on {host}: accepted, but not found")
        return found

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
            return mapping.composed_system_id(final.document() if final.body else {})
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
        "Links": {
            "ResourceBlocks": [{"@odata.id": f"{blocks_uri}/{quote(b, safe='')}"} for b in blocks]
        },
        "Oem": {OEM_KEY: mapping.mark_object(HostMark.of(tag))},
    }


def _manifest(request: Document, stanza_id: str) -> dict[str, Any]:
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": stanza_id, "Request": request}
    return {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}
