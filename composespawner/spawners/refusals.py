"""Refusals: what the user is told when a start cannot go on, and that nothing is left of it.

A refused request leaves no trace in the hub: its options are not kept for the
next start (nor stored at all when oversized), and a named server's record
made for it is removed. What that takes of JupyterHub's internals is in
:mod:`composespawner.launchers.jupyterhub_internals`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jupyterhub.spawner import Spawner
from tornado.log import app_log

from composespawner.domain.request import MAX_OPTIONS_BYTES, RequestError, options_size
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.jupyterhub_internals import (
    log_name,
    remove_server_record,
    store_user_options,
)
from composespawner.services.failures import ComposeFailed, ComposeRefused

# Removals of refused servers' records, kept referenced until they finish.
_removals: set[asyncio.Future[None]] = set()


@contextmanager
def refused_options() -> Iterator[None]:
    """Options that cannot be a request of ours, refused saying what is wrong with them."""
    try:
        yield
    except RequestError as e:
        raise SpawnRefused(str(e), reason="invalid-options", status_code=e.status) from e


@contextmanager
def refused_compose() -> Iterator[None]:
    """The composer's refusals and failures, as the user sees them."""
    try:
        yield
    except ComposeRefused as e:
        raise SpawnRefused(str(e), reason="no-capacity", status_code=e.status) from e
    except ComposeFailed as e:
        raise SpawnRefused(str(e), reason="fabric", status_code=503) from e


@contextmanager
def refused_if_ended() -> Iterator[None]:
    """The machine ended (released, failed) while its notebook was starting."""
    try:
        yield
    except ComposeRefused as e:
        raise SpawnRefused(str(e), reason="machine-ended", status_code=e.status) from e


def ledger_upgrading() -> SpawnRefused:
    return SpawnRefused(
        "The GPU pool is not available right now: it is being upgraded."
        " Try again later, and tell the admins if it persists.",
        reason="ledger-schema",
        status_code=503,
    )


def fabric_unreadable() -> SpawnRefused:
    return SpawnRefused(
        "The GPU fabric is not answering right now, so nothing was claimed."
        " Try again in a few minutes, and tell the admins if it persists.",
        reason="fabric",
        status_code=503,
    )


def options_to_store(server: str, value: Any, previous: Any) -> Any:
    """What JupyterHub may write as a server's ``user_options`` before start().

    Oversized ones would stay there (a 10 MB body grew the database by as
    much) and be offered to the next start: what was stored stays instead.
    start() refuses the request itself (``Spawner.user_options`` keeps it).
    """
    size = 0 if value is None else options_size(value)
    if size <= MAX_OPTIONS_BYTES:
        return value
    app_log.warning("Not storing %d bytes of user_options for server %r", size, server)
    return previous if isinstance(previous, dict) else None


def forget_refused(spawner: Spawner, accepted: dict[str, Any], record_is_new: bool) -> None:
    """Leave nothing of a refused request: its options, or a record made for it.

    JupyterHub stored the options before start() and would pass them to the
    next start without options, and to the form: the last ``accepted`` ones
    take their place. ``record_is_new``: the hub made the server's record for
    this request (:func:`~composespawner.launchers.jupyterhub_internals.is_new_record`).
    """
    spawner.user_options = dict(accepted)
    store_user_options(spawner, dict(accepted))
    if spawner.name and record_is_new:
        remove_refused_record(spawner)


def remove_refused_record(spawner: Spawner) -> None:
    """Delete a named server's hub record once the hub has finished failing its spawn.

    As the hub's own DELETE with ``remove`` does it. The record counts toward
    ``named_server_limit_per_user`` however it ended.
    """
    removal = asyncio.ensure_future(_remove_record(spawner))
    _removals.add(removal)
    removal.add_done_callback(_removals.discard)


async def _remove_record(spawner: Spawner) -> None:
    try:
        removed = await remove_server_record(spawner)
    except Exception:
        spawner.log.exception("Could not remove the record of refused server %s", log_name(spawner))
        return
    if removed:  # else a newer request for this name took over
        spawner.log.info("Removed the record of %s: its first start was refused", log_name(spawner))
