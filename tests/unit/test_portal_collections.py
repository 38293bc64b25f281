"""The portal makes full garbage collections on a timer, never inside a request."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from composespawner.portal.app import collect_on_a_timer


async def test_full_collections_come_from_the_timer_only() -> None:
    before = gc.get_threshold()
    full: asyncio.Event = asyncio.Event()

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.set()

    gc.callbacks.append(seen)
    collecting = collect_on_a_timer(0.05)
    try:
        assert gc.get_threshold()[:2] == before[:2]  # young collections as before
        assert gc.get_threshold()[2] >= 1_000_000  # full ones never on CPython's count
        await asyncio.wait_for(full.wait(), timeout=5)  # but on the timer
    finally:
        collecting.cancel()
        gc.callbacks.remove(seen)
        gc.set_threshold(*before)
