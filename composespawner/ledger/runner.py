"""How code on an event loop calls the synchronous ledger: the one way, for every process.

The hub's spawners, the reconciler and the portal all call the ledger through
:class:`LedgerRunner`, so each call either runs on the loop or in a worker
thread by the same rule, and lands or fails as a whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from composespawner.ledger.store import Ledger

T = TypeVar("T")


class LedgerRunner:
    """Runs ledger calls for async code: on the loop for SQLite, in a thread otherwise.

    An SQLite ledger is a local file and each call a short transaction (well
    under a millisecond): it runs on the event loop, as JupyterHub's own
    database does. In a worker thread it cost more than the call itself:
    handing over and back, and the GIL that the thread and the event loop then
    pass back and forth (every hub commit waited for it). A database server's
    round trips go to a worker thread.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.inline = ledger.is_local_file

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``func(*args, **kwargs)``, a ledger method; it lands or fails as a whole."""
        if self.inline:
            return func(*args, **kwargs)
        return await whole_in_thread(func, *args, **kwargs)


async def whole_in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func`` in a worker thread; it lands (or fails) as a whole even if the caller is cancelled.

    Cancelling a coroutine does not stop its worker thread. Without waiting for
    the thread, the caller's undo could run before a write commits, miss it,
    and leave devices claimed by a machine nobody will ever release.
    """
    future = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise
