"""``FaultyFabric``: the strict in-process fabric, with faults switched on cue.

An :class:`~tests.support.inprocess.InProcessFabric` (so it refuses whatever
the simulator refuses) whose calls can be made to fail, hang, or fail at the
k-th attach, in the ways a real fabric manager does. The switches live in a
:class:`Faults`, apart from the fabric, so that they outlive a hub restart (a
new client of the same fabric), and they count what was called and what failed,
so a test can tell a retry happened or that a failure came from the fabric.

For the real simulator's own fault switches, over HTTP, see
``harness/simulator.py``.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from composespawner.domain.hardware import CompositionTag, HostMark, Inventory
from composespawner.fabric.base import (
    FabricError,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    StaleETag,
)
from fabricsim.state import FabricState
from tests.support.inprocess import InProcessFabric

T = TypeVar("T")

# How an attach fails: refused (500) or no answer, both before acting; the
# answer lost after the attach took effect; a failed asynchronous task
# (nothing attached); held until the test lets it go on.
AttachFailure = Literal["refused", "no-answer", "answer-lost", "task-failed", "hang"]


@dataclass
class AttachFault:
    """The attach after ``after`` more have gone through fails as ``how``, once."""

    after: int
    how: AttachFailure
    reached: asyncio.Event = field(default_factory=asyncio.Event)  # set when it fires
    released: asyncio.Event = field(default_factory=asyncio.Event)  # what a "hang" waits for


@dataclass
class Faults:
    """The fault switches of a fabric, and what came of them."""

    unreachable: bool = False  # every call raises FabricUnreachable before acting
    stale_etags: bool = False  # every write is refused with StaleETag (412) before acting
    hung: asyncio.Event | None = None  # every call waits until it is set: a frozen fabric
    detaches_left: int | None = None  # that many detaches go through, then none is answered
    attach_fault: AttachFault | None = None
    calls: Counter[str] = field(default_factory=Counter)  # every call, by operation
    errors_raised: int = 0  # fabric errors raised, injected or the strict fake's refusals

    def fail_attach(self, *, after: int, how: AttachFailure) -> AttachFault:
        """Arm the attach after ``after`` more (0: the next one) to fail as ``how``."""
        self.attach_fault = AttachFault(after, how)
        return self.attach_fault

    def heal(self) -> None:
        """The fabric answers again: every fault off, calls held by one go on."""
        self.unreachable = self.stale_etags = False
        self.detaches_left = None
        if self.hung is not None:
            self.hung.set()
            self.hung = None
        if self.attach_fault is not None:
            self.attach_fault.released.set()
            self.attach_fault = None

    def take_attach_fault(self) -> AttachFault | None:
        """The fault this attach meets, if any (and then it is spent)."""
        fault = self.attach_fault
        if fault is None:
            return None
        if fault.after > 0:
            fault.after -= 1
            return None
        self.attach_fault = None
        fault.reached.set()
        return fault


class FaultyFabric(InProcessFabric):
    """The strict in-process fake behind the switches of ``faults``.

    Every tag written is recorded in ``tags_written``, so a test can learn the
    machine and host of a compose that never returned. Subclasses may judge the
    fake's own refusals in :meth:`refused`.
    """

    def __init__(self, state: FabricState, faults: Faults | None = None) -> None:
        super().__init__(state)
        self.faults = faults if faults is not None else Faults()
        self.tags_written: list[tuple[str, CompositionTag | None]] = []

    async def inventory(self) -> Inventory:
        await self._reach("inventory")
        return await self._answer(super().inventory())

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        await self._reach("host_mark")
        return await self._answer(super().host_mark(system_id))

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._reach("join_host")
        self._write("join_host")
        self.tags_written.append((system_id, tag))
        await self._answer(super().join_host(system_id, tag))

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._reach("leave_host")
        self._write("leave_host")
        self.tags_written.append((system_id, None))
        await self._answer(super().leave_host(system_id, tag))

    async def attach(self, system_id: str, block_id: str) -> None:
        await self._reach("attach")
        self._write("attach")
        fault = self.faults.take_attach_fault()
        how = fault.how if fault is not None else None
        if fault is not None and how == "hang":
            await fault.released.wait()
        if how == "refused":
            self._raise(FabricRefused(f"test: refused attaching {block_id}", status=500))
        if how == "no-answer":
            self._raise(FabricUnreachable(f"test: no answer attaching {block_id}"))
        if how == "task-failed":
            self._raise(FabricTaskFailed(f"test: the task attaching {block_id} failed"))
        await self._answer(super().attach(system_id, block_id))
        if how == "answer-lost":
            self._raise(FabricUnreachable(f"test: answer lost after attaching {block_id}"))

    async def detach(self, system_id: str, block_id: str) -> None:
        await self._reach("detach")
        self._write("detach")
        left = self.faults.detaches_left
        if left == 0:
            self._raise(FabricUnreachable(f"test: no answer detaching {block_id}"))
        if left is not None:
            self.faults.detaches_left = left - 1
        await self._answer(super().detach(system_id, block_id))

    def refused(self, error: FabricError) -> None:
        """The strict fake refused a call (no fault did): a subclass may judge it."""
        del error

    async def _reach(self, call: str) -> None:
        self.faults.calls[call] += 1
        if self.faults.hung is not None:
            await self.faults.hung.wait()
        if self.faults.unreachable:
            self._raise(FabricUnreachable(f"test: fabric unreachable ({call})"))

    def _write(self, call: str) -> None:
        if self.faults.stale_etags:
            self._raise(StaleETag(f"test: stale ETag on {call}", status=412))

    def _raise(self, error: FabricError) -> None:
        self.faults.errors_raised += 1
        raise error

    def seconds_since_answer(self) -> float:
        """Infinite while hung or unreachable: a frozen fabric answers nothing."""
        return math.inf if self.faults.hung is not None or self.faults.unreachable else 0.0

    async def _answer(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except FabricError as error:
            self.faults.errors_raised += 1
            self.refused(error)
            raise
