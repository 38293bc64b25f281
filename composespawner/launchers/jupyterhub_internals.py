"""Every use of JupyterHub's internals, in one place.

Written against jupyterhub >=6.1,<7 (setup.py; 6.1.1 in constraints.txt).
JupyterHub offers no public way to do these, and nothing else of ours touches
its database or names a private part of its objects. This relies on:

- ``jupyterhub.orm.Spawner.user_options``: the column ``User.spawn`` writes a
  start's options to before the spawner's ``start``, and ``Spawner.last_activity``,
  None until the server has been active (so the record was made for this spawn).
  An SQLAlchemy ``set`` event on the first decides what is stored
  (:func:`guard_stored_user_options`).
- ``Spawner.orm_spawner`` (its record), ``Spawner._spawn_future`` (the start
  under way, which the hub fails when it raises), ``User.spawners`` (spawners
  by server name) and ``User.db`` (the hub's session): a refused server's
  record is removed as the REST API's ``DELETE .../servers/:name`` with
  ``remove`` does it (:func:`remove_server_record`).
- ``Spawner._log_name``, "user" or "user:server", the name JupyterHub's own
  log lines give a server (:func:`log_name`).
- ``jupyterhub._data.DATA_FILES_PATH``: where its templates are installed
  (:func:`hub_templates`).

It sits with the launchers, the lowest layer that runs inside the hub, so the
launchers (which are JupyterHub spawners) and the spawners above them share it.
tests/unit/test_jupyterhub_internals.py fails, naming which, when an upgrade
moves any of these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyterhub import orm
from jupyterhub.spawner import Spawner
from jupyterhub.utils import maybe_future
from sqlalchemy import event

StoredOptions = Callable[[str, Any, Any], Any]
"""(server name, the options being stored, those stored before) → what is stored."""

_guards: dict[StoredOptions, Callable[..., Any]] = {}


def guard_stored_user_options(choose: StoredOptions) -> None:
    """Let ``choose`` decide what JupyterHub writes as a server's ``user_options``.

    For every server of this process, from now on. Idempotent: however often it
    is called with the same ``choose``, it is asked once per write.
    """
    if choose in _guards:
        return

    def stored(target: orm.Spawner, value: Any, previous: Any, initiator: Any) -> Any:
        del initiator
        return choose(target.name, value, previous)

    _guards[choose] = stored
    event.listen(orm.Spawner.user_options, "set", stored, retval=True)


def is_new_record(spawner: Spawner) -> bool:
    """Whether the hub made ``spawner``'s record for this spawn: it was never active."""
    record = spawner.orm_spawner
    return record is not None and record.last_activity is None


def store_user_options(spawner: Spawner, options: dict[str, Any]) -> None:
    """Replace the options the hub keeps for ``spawner``'s next start and form."""
    if spawner.orm_spawner is not None:
        spawner.orm_spawner.user_options = options


async def remove_server_record(spawner: Spawner) -> bool:
    """Delete ``spawner``'s record once the hub has finished its spawn; whether it did.

    As the hub's own DELETE with ``remove`` does it. Nothing is removed when a
    newer request for the name took over, or the server is active. On an error
    the session is rolled back and the error raised.
    """
    spawn = spawner._spawn_future
    if spawn is not None:
        await asyncio.wait([spawn])
    user = spawner.user
    if user.spawners.get(spawner.name) is not spawner or spawner.active:
        return False
    try:
        await maybe_future(spawner.delete_forever())
        user.spawners.pop(spawner.name, None)
        user.db.delete(spawner.orm_spawner)
        user.db.commit()
    except Exception:
        user.db.rollback()
        raise
    return True


def log_name(spawner: Spawner) -> str:
    """How JupyterHub's log lines name ``spawner``'s server: "user" or "user:server"."""
    name: str = spawner._log_name
    return name


def hub_templates() -> Path:
    """JupyterHub's templates, wherever its package put them."""
    # Imported here: its import looks for them on disk, which only the portal needs.
    from jupyterhub._data import DATA_FILES_PATH

    return Path(DATA_FILES_PATH) / "templates"
