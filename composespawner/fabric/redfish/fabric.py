"""RedfishFabric: the Fabric protocol over a DMTF Redfish CompositionService.

The protocol's door: each method bounds its work by the operation deadline and
hands it to a collaborator on the same transport — :class:`Discovery` (reads,
the inventory), :class:`ExpandableSystems` (attach, detach, the mark) or
:class:`WholeSystems` (compose and decompose on services that create systems).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from composespawner.domain.hardware import CompositionTag, Device, HostMark, Inventory
from composespawner.fabric.base import (
    FabricDeadlineExceeded,
    Progress,
    compose_by_attaching,
    decompose_by_detaching,
)
from composespawner.fabric.redfish import mapping
from composespawner.fabric.redfish.composition import WholeSystems
from composespawner.fabric.redfish.discovery import Discovery
from composespawner.fabric.redfish.expandable import ATTACH, DETACH, ExpandableSystems
from composespawner.fabric.redfish.transport import (
    MAX_IN_FLIGHT,
    Deadline,
    RedfishRetry,
    RedfishTimeouts,
    RedfishTransport,
)

T = TypeVar("T")

DEFAULT_LOGGER = "composespawner.fabric.redfish"
DEFAULT_TIMEOUTS = RedfishTimeouts()
DEFAULT_RETRY = RedfishRetry()


class RedfishFabric:
    """The :class:`~composespawner.fabric.base.Fabric` protocol over DMTF Redfish.

    Devices are attached to expandable hosts with the ``AddResourceBlock`` /
    ``RemoveResourceBlock`` actions the host's ComputerSystem advertises;
    machines join and leave a host's mark, ``Oem.ComposeSpawner``. Every method
    is bounded by ``timeouts.operation`` and raises only errors of the
    ``base.py`` tree.
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
        self._discovery = Discovery(self._transport, self._log)
        self._expandable = ExpandableSystems(
            self._transport, self._discovery, timeouts=timeouts, retry=retry, log=self._log
        )
        self._whole = WholeSystems(
            self._transport, self._discovery, timeouts=timeouts, retry=retry, log=self._log
        )

    # -- the protocol ---------------------------------------------------------------------

    async def inventory(self) -> Inventory:
        return await self._within_deadline("inventory", self._discovery.inventory)

    async def compose(
        self, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
    ) -> str:
        if await self._within_deadline(f"read {host}", self._is_expandable(host)):
            return await compose_by_attaching(self, host, devices, tag, progress)
        progress(f"composing {_count_devices(devices)} on {host}")
        blocks = [host, *(d.block_id for d in devices)]
        return await self._within_deadline(
            f"compose {tag.machine} on {host}",
            lambda deadline: self._whole.compose(host, blocks, tag, deadline),
        )

    async def decompose(self, host: str, blocks: Sequence[str], tag: CompositionTag) -> bool:
        if await self._within_deadline(f"read {host}", self._is_expandable(host)):
            return await decompose_by_detaching(self, host, blocks, tag)
        return await self._within_deadline(
            f"decompose {tag.machine} on {host}",
            lambda deadline: self._whole.decompose(host, blocks, tag, deadline),
        )

    async def attach(self, system_id: str, block_id: str) -> None:
        await self._within_deadline(
            f"attach {block_id} to {system_id}",
            lambda deadline: self._expandable.change(system_id, block_id, ATTACH, deadline),
        )

    async def detach(self, system_id: str, block_id: str) -> None:
        await self._within_deadline(
            f"detach {block_id} from {system_id}",
            lambda deadline: self._expandable.change(system_id, block_id, DETACH, deadline),
        )

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        discovery = self._discovery

        async def read(deadline: Deadline) -> tuple[HostMark | None, tuple[str, ...]]:
            if not await discovery.is_expandable(system_id, deadline):
                found = await discovery.system_holding(system_id, deadline)
                document = found or {}
                blocks = mapping.system_block_ids(document) or [system_id]
                return mapping.host_mark(document), tuple(blocks)
            _, system = await discovery.system(system_id, deadline)
            discovery.remember(system_id, system)
            document = system.document()
            return mapping.host_mark(document), tuple(mapping.system_block_ids(document))

        return await self._within_deadline(f"read {system_id}", read)

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._within_deadline(
            f"mark {system_id}", lambda deadline: self._expandable.join(system_id, tag, deadline)
        )

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._within_deadline(
            f"unmark {system_id}", lambda deadline: self._expandable.leave(system_id, tag, deadline)
        )

    def seconds_since_answer(self) -> float:
        return time.monotonic() - self._transport.answered_at

    async def close(self) -> None:
        await self._transport.close()

    def _is_expandable(self, host: str) -> Callable[[Deadline], Awaitable[bool]]:
        return lambda deadline: self._discovery.is_expandable(host, deadline)

    async def _within_deadline(self, what: str, work: Callable[[Deadline], Awaitable[T]]) -> T:
        seconds = self._timeouts.operation
        try:
            async with asyncio.timeout(seconds):
                return await work(Deadline(seconds))
        except TimeoutError as exc:
            raise FabricDeadlineExceeded(f"{what}: not done within {seconds:g} s") from exc


def _count_devices(devices: Sequence[Device]) -> str:
    counts = Counter(d.kind for d in devices)
    words = {"gpu": "GPU", "nic": "network card", "nvme": "scratch NVMe"}
    parts = [f"{n} {words[k]}{'s' if n > 1 else ''}" for k, n in counts.items()]
    return ", ".join(parts) or "no devices"
