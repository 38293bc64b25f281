"""Changes to expandable systems: attaching and detaching blocks, and the host's mark.

Devices are attached to expandable hosts with the ``AddResourceBlock`` /
``RemoveResourceBlock`` actions the host's ComputerSystem advertises; machines
join and leave a shared host's mark, ``Oem.ComposeSpawner``, through one writer
per host that puts every change waiting in one PATCH against the system's ETag.
An unclear answer is settled by looking at the system.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from composespawner.domain.hardware import CompositionTag, HostMark
from composespawner.fabric.base import (
    OEM_KEY,
    DeviceInUse,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    NotExpandable,
    StaleETag,
    host_taken_by,
)
from composespawner.fabric.redfish import mapping
from composespawner.fabric.redfish.discovery import MODE_WORDS, Discovery, Seen
from composespawner.fabric.redfish.errors import NOT_ATTACHED_IDS, has_message
from composespawner.fabric.redfish.mapping import Document, dig
from composespawner.fabric.redfish.tasks import OutcomeUnknown, outcome
from composespawner.fabric.redfish.transport import (
    Deadline,
    RedfishRetry,
    RedfishTimeouts,
    RedfishTransport,
    Response,
)


@dataclass(frozen=True, slots=True)
class MarkChange:
    """One machine's change of a host's mark, waiting for the host's writer."""

    what: str  # for logs
    done: Callable[[Seen | Response], bool]  # whether a read of the host has it already
    change: Callable[[HostMark | None], HostMark | None]
    result: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class Change:
    """One direction of ``attach``/``detach``."""

    verb: str
    action: str  # key under the system's Actions
    attach: bool
    tolerated: frozenset[str]  # message ids meaning "maybe done already: look"


# Seconds, times the fresh reads so far: the most a write waits before it reads again
# after a stale ETag.
STALE_PAUSE = 0.01

ATTACH = Change(
    "attach", "#ComputerSystem.AddResourceBlock", True, frozenset({"ResourceBlockInUse"})
)
DETACH = Change("detach", "#ComputerSystem.RemoveResourceBlock", False, NOT_ATTACHED_IDS)


class ExpandableSystems:
    """Attach, detach and tag on expandable systems, each a write against the ETag."""

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
        self._action_targets: dict[tuple[str, str], str] = {}
        # Mark changes waiting for a host's writer, and the writer of each host busy now.
        self._pending: dict[str, list[MarkChange]] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}

    async def refuse_unless_expandable(self, host: str, what: str, deadline: Deadline) -> None:
        if not await self._discovery.is_expandable(host, deadline):
            service = await self._discovery.service_map(deadline)
            raise NotExpandable(
                f"{what}: {host} is no expandable system, and this fabric composes whole "
                f"systems ({MODE_WORDS[service.composition]}): use compose/decompose"
            )

    async def change(
        self, system_id: str, block_id: str, change: Change, deadline: Deadline
    ) -> None:
        await self.refuse_unless_expandable(system_id, f"{change.verb} {block_id}", deadline)
        service = await self._discovery.service_map(deadline)
        block_uri = f"{service.resource_blocks}/{quote(block_id, safe='')}"
        what = f"{change.verb} {block_id} / {system_id}"

        def done(system: Seen | Response) -> bool:
            document = system.document()
            if (block_id in mapping.system_block_ids(document)) == change.attach:
                return True
            _refuse_unless_takes_devices(system_id, document, what)
            return False

        async def request(path: str, system: Seen | Response) -> None:
            try:
                await self._request_change(system_id, system, block_uri, change, deadline)
            except StaleETag:
                raise  # a FabricRefused, but _write_system's to handle: read again
            except (FabricRefused, FabricTaskFailed, OutcomeUnknown) as exc:
                await self._settle(system_id, block_id, change, exc, deadline)

        wrote = await self._write_system(system_id, what, done, request, deadline)
        self._log.debug("%s: %s", what, "done" if wrote else "already done")

    async def join(self, system_id: str, tag: CompositionTag, deadline: Deadline) -> None:
        """Put ``tag``'s machine on the host's mark (see ``Fabric.join_host``)."""
        await self.refuse_unless_expandable(system_id, f"mark {system_id}", deadline)

        def done(system: Seen | Response) -> bool:
            document = system.document()
            current = mapping.host_mark(document)
            if current is not None and current.has(tag):
                return True
            # Check first, write second: a mark on a host that takes no devices
            # would stand for a machine that can never be composed there.
            _refuse_unless_takes_devices(system_id, document, f"mark {system_id}")
            _refuse_if_taken(system_id, document, tag.hub)
            return False

        def joined(current: HostMark | None) -> HostMark | None:
            return current.joined(tag) if current is not None else HostMark.of(tag)

        await self._write_mark(
            system_id, f"join {tag.machine} to {system_id}", done, joined, deadline
        )

    async def leave(self, system_id: str, tag: CompositionTag, deadline: Deadline) -> None:
        """Take ``tag``'s machine off the host's mark (see ``Fabric.leave_host``)."""
        await self.refuse_unless_expandable(system_id, f"unmark {system_id}", deadline)

        def done(system: Seen | Response) -> bool:
            current = mapping.host_mark(system.document())
            return current is None or not current.has(tag)

        def left(current: HostMark | None) -> HostMark | None:
            return current.left(tag) if current is not None else None

        await self._write_mark(system_id, f"{tag.machine} leaves {system_id}", done, left, deadline)

    async def _write_mark(
        self,
        system_id: str,
        what: str,
        done: Callable[[Seen | Response], bool],
        change: Callable[[HostMark | None], HostMark | None],
        deadline: Deadline,
    ) -> None:
        """Have ``change`` written into the host's mark, with every change of it waiting.

        A class starting at once puts many machines on one host, each joining its
        mark. Written one by one, against each other every write but one would find
        the ETag changed and read the host again, and the last to join would wait
        for all the others; so one writer per host takes every change waiting and
        writes them in one PATCH (group commit), against the ETag of what it read.
        """
        del deadline  # the writer runs under its own: it writes others' changes too
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(system_id, []).append(MarkChange(what, done, change, waiting))
        if system_id not in self._writers:
            self._writers[system_id] = asyncio.create_task(self._write_marks(system_id))
        await waiting

    async def _write_marks(self, system_id: str) -> None:
        """Write a host's waiting mark changes, a batch at a time, until none waits."""
        try:
            while batch := [c for c in self._pending.pop(system_id, []) if not c.result.done()]:
                try:
                    await self._write_batch(system_id, batch)
                except BaseException as error:  # each caller hears it, as if it wrote alone
                    for c in batch:
                        if not c.result.done():
                            c.result.set_exception(error)
                    if not isinstance(error, Exception):
                        raise  # cancelled (the client closing): the callers were told
                else:
                    for c in batch:
                        if not c.result.done():
                            c.result.set_result(None)
        finally:
            del self._writers[system_id]

    async def _write_batch(self, system_id: str, batch: list[MarkChange]) -> None:
        deadline = Deadline(self._timeouts.operation)
        what = "; ".join(c.what for c in batch)

        def done(system: Seen | Response) -> bool:
            return all([c.done(system) for c in batch])  # every check runs: refusals too

        async def write(path: str, system: Seen | Response) -> None:
            mark = mapping.host_mark(system.document())
            for c in batch:
                mark = c.change(mark)
            written = await self._patch_mark(path, system, mapping.mark_object(mark), deadline)
            if written is not None:
                self._discovery.remember(system_id, written)

        wrote = await self._write_system(system_id, what, done, write, deadline)
        self._log.debug("%s: %s", what, "done" if wrote else "already so")

    async def _write_system(
        self,
        system_id: str,
        what: str,
        done: Callable[[Seen | Response], bool],
        write: Callable[[str, Seen | Response], Awaitable[None]],
        deadline: Deadline,
    ) -> bool:
        """Write to a system against its ETag; False if a fresh read says it is done.

        The first try starts from the system's remembered answer, if one is
        recent and ``done`` neither says it is done nor raises (it refuses a
        taken host): only a fresh read may decide those. A stale ETag means
        reading the system again, ``etag_attempts`` fresh reads at most.
        """
        path = await self._discovery.system_path(system_id, deadline)
        system: Seen | Response | None = self._discovery.recall(system_id)
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
                path, system = await self._discovery.system(system_id, deadline)
                if done(system):
                    return False
            try:
                await write(path, system)
            except StaleETag:
                if fresh and fresh_reads >= self._retry.etag_attempts:
                    raise
                # A remembered answer going stale is expected now and then, and so is a
                # neighbour's write on a shared host: no warning. A short random wait
                # keeps machines joining one host at once from colliding in step.
                self._log.debug("%s: ETag went stale", what)
                system = None
                await asyncio.sleep(random.uniform(0, STALE_PAUSE * fresh_reads))
                continue
            return True

    async def _request_change(
        self,
        system_id: str,
        system: Seen | Response,
        block_uri: str,
        change: Change,
        deadline: Deadline,
    ) -> None:
        target = self._action_target(system_id, system.document(), change.action)
        # No ComputerSystemETag: on a shared host every neighbour's attach and detach
        # changes the system's ETag, and the block itself is what must not change
        # hands, which the service refuses anyway (ResourceBlockInUse).
        payload: dict[str, Any] = {"ResourceBlock": {"@odata.id": block_uri}}
        response = await self._transport.request("POST", target, deadline, payload=payload)
        await outcome(self._transport, response, deadline, poll_max=self._timeouts.task_poll_max)

    async def _settle(
        self, system_id: str, block_id: str, change: Change, error: Exception, deadline: Deadline
    ) -> None:
        """Look at the system after an unclear answer; re-raise unless it is done.

        Answers like ResourceBlockInUse on attach arrive when an earlier try of
        ours succeeded but its answer was lost: done, if the block is here.
        """
        ids = getattr(error, "message_ids", ())
        if not isinstance(error, OutcomeUnknown) and not has_message(ids, change.tolerated):
            raise error
        _, system = await self._discovery.system(system_id, deadline)
        if (block_id in mapping.system_block_ids(system.document())) == change.attach:
            return
        if isinstance(error, OutcomeUnknown):
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

    async def _patch_mark(
        self, path: str, system: Seen | Response, wanted: dict[str, Any] | None, deadline: Deadline
    ) -> Response | None:
        """PATCH the mark; returns the answer if it is the system as the PATCH left it."""
        etag = system.etag()
        headers = {"If-Match": etag} if etag else {}
        payload = {"Oem": {OEM_KEY: wanted}}
        response = await self._transport.request(
            "PATCH", path, deadline, payload=payload, headers=headers
        )
        try:
            await outcome(
                self._transport, response, deadline, poll_max=self._timeouts.task_poll_max
            )
        except OutcomeUnknown as unknown:
            if dig(await self._discovery.document(path, deadline), "Oem", OEM_KEY) != wanted:
                raise FabricUnreachable(f"PATCH {path}: {unknown}") from unknown
            return None
        return response if response.status == 200 else None


def _refuse_if_taken(system_id: str, system: Document, hub: str) -> None:
    # A system lists its own ComputerSystem block among Links.ResourceBlocks;
    # anything beyond that one is an attached device.
    blocks = mapping.system_block_ids(system)
    holder = host_taken_by(
        mapping.host_mark(system),
        marked=dig(system, "Oem", OEM_KEY) is not None,
        attached=blocks[1:],
        hub=hub,
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
