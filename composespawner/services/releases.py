"""Releases that go on in the background until the fabric confirms them.

A stop must not wait on the fabric (its timeouts and retries can take a
minute), and a release the fabric did not confirm must be tried again: the
devices stay held in the ledger meanwhile (unknown is not dead). If the hub
dies first, the reconciler finishes what is left ``stopping``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from composespawner.fabric.base import FabricError

Release = Callable[[str, str, bool], Awaitable[None]]  # machine id, reason, failed


class BackgroundReleases:
    """One retrying task per machine, with jittered exponential backoff."""

    def __init__(
        self,
        release: Release,
        *,
        retry_max: float,
        log: logging.Logger,
        first_retry: float = 0.5,
    ) -> None:
        self._release = release
        self.retry_max = retry_max
        self.first_retry = first_retry
        self.log = log
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, machine_id: str, *, reason: str, failed: bool) -> None:
        """Release in the background until the fabric confirms; once per machine at a time."""
        if machine_id in self._tasks and not self._tasks[machine_id].done():
            return
        task = asyncio.ensure_future(self._until_done(machine_id, reason, failed))
        self._tasks[machine_id] = task

    async def _until_done(self, machine_id: str, reason: str, failed: bool) -> None:
        delay = self.first_retry
        while True:
            try:
                await self._release(machine_id, reason, failed)
                return
            except FabricError as e:
                self.log.warning(
                    "Release of %s not confirmed (%s); retry in %.1fs", machine_id, e, delay
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.retry_max)

    async def wait(self, machine_id: str, *, within: float | None) -> bool:
        """Whether this process's background release of the machine ends within ``within`` s."""
        task = self._tasks.get(machine_id)
        if task is None:
            return False
        done, _ = await asyncio.wait([task], timeout=within)
        return bool(done)

    @property
    def pending(self) -> int:
        """Releases going on that the fabric has not confirmed yet."""
        return sum(not task.done() for task in self._tasks.values())

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()
