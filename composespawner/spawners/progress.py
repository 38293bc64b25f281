"""What a start shows on JupyterHub's progress page: one event per step, followed live."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any


class StartProgress:
    """The steps of the start under way, or of the last one once it has ended.

    JupyterHub's progress page follows them (``Spawner.progress``) until the
    start ends, then sees every step it made.
    """

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self.under_way = False

    def begin(self) -> None:
        self._events.clear()
        self.under_way = True

    def end(self) -> None:
        self.under_way = False
        self._notify()

    def add(self, message: str) -> None:
        self._events.append({"progress": step_percent(len(self._events)), "message": message})
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self) -> AsyncGenerator[dict[str, Any], None]:
        """Each step, as it is made, until the start ends."""
        shown = 0
        while True:
            changed = self._changed
            while shown < len(self._events):
                yield self._events[shown]
                shown += 1
            if not self.under_way:
                return
            await changed.wait()


def step_percent(step: int) -> int:
    """Where the bar stands at ``step``: it counts steps, never reaching the end."""
    return min(10 + step * 12, 90)
