"""A value read at most once per a few seconds, shared by every caller that waits for it.

The fabric's inventory and the ledger's holders are read this way: a spawn
storm of hundreds asks for them at once, and one read serves them all.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Snapshot(Generic[T]):
    """A value read at most once per ``ttl`` seconds; one read at a time serves all waiting.

    The read runs as a task of its own: a caller that stops waiting (a budget ran
    out, a request was cancelled) leaves it running for the others and the next
    caller. ``fresh``: a read that began after the call did will do.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.value: T | None = None
        self.began = -math.inf  # when the read behind ``value`` began
        self._forgotten = -math.inf  # reads that began before this are out of date
        self._reading: asyncio.Task[T] | None = None
        self._reading_began = -math.inf

    def forget(self) -> None:
        """The next get() reads again (``value`` stays for who can use any snapshot)."""
        self._forgotten = time.monotonic()

    def current(self, *, fresh: bool = False) -> T | None:
        """The value if get() would return it without reading, else None; never awaits."""
        if fresh or self.value is None:
            return None
        oldest = max(self._forgotten, time.monotonic() - self.ttl)
        return self.value if self.began >= oldest else None

    async def get(self, read: Callable[[], Awaitable[T]], *, fresh: bool = False) -> T:
        asked = time.monotonic()
        while True:
            # Reads that began before this are too old for this call.
            floor = max(self._forgotten, asked if fresh else asked - self.ttl)
            if self.value is not None and self.began >= floor:
                return self.value
            if self._reading is None:
                self._start(read)
            reading = self._reading
            assert reading is not None
            if self._reading_began >= floor:
                return await asyncio.shield(reading)
            await asyncio.wait([reading])  # too old for us: let it land, then read again

    async def get_within(
        self, read: Callable[[], Awaitable[T]], budget: float
    ) -> tuple[T, float | None]:
        """The value, waiting at most ``budget`` seconds for a read; its age if it is old.

        A read that takes longer goes on in the background, and the last value
        comes back with its age in seconds (None when the value is current).
        Raises TimeoutError when there is no value at all yet.
        """
        deadline = asyncio.timeout(budget)
        try:
            async with deadline:
                return await self.get(read), None
        except TimeoutError:
            if self.value is None or not deadline.expired():
                raise
            return self.value, time.monotonic() - self.began

    def _start(self, read: Callable[[], Awaitable[T]]) -> None:
        began = time.monotonic()

        async def reading() -> T:
            try:
                value = await read()
                self.value, self.began = value, began
                return value
            finally:
                self._reading = None

        self._reading, self._reading_began = asyncio.ensure_future(reading()), began
        # A read nobody waits for any more must not log "exception never retrieved".
        self._reading.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
