"""What launchers/jupyterhub_internals.py relies on in the installed JupyterHub, checked.

An upgrade of jupyterhub that moves any of it fails here, by name, rather than
a hub in production. The parts are used as the adapter uses them, on a real
hub database (JupyterHub's own ORM, in memory); when one fails, read the new
JupyterHub's code for that part and change the adapter (and its docstring).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.spawner import Spawner
from jupyterhub.user import User
from packaging.version import Version
from sqlalchemy.orm import Session

from composespawner.launchers.jupyterhub_internals import (
    guard_stored_user_options,
    hub_templates,
    is_new_record,
    log_name,
    remove_server_record,
    store_user_options,
)


@pytest.fixture
def user() -> Iterator[User]:
    db = orm.new_session_factory("sqlite:///:memory:")()
    orm_user = orm.User(name="student1")
    db.add(orm_user)
    db.commit()
    yield User(orm_user, {"spawner_class": Spawner})
    db.close()


def thesis(user: User) -> Spawner:
    """A named server of ``user``'s, its record made as the hub makes it for a request."""
    spawner: Spawner = user.get_or_create_spawner("thesis", "")
    return spawner


def server_names(user: User) -> set[str]:
    return {s.name for s in user.db.query(orm.Spawner).filter_by(user_id=user.id)}


def test_the_installed_jupyterhub_is_in_the_range_the_adapter_was_written_for() -> None:
    assert Version("6.1") <= Version(version("jupyterhub")) < Version("7")


def test_a_servers_record_keeps_its_options_and_when_it_was_last_active() -> None:
    columns = orm.Spawner.__table__.columns
    assert {"name", "user_options", "last_activity"} <= set(columns.keys())
    assert columns["last_activity"].nullable


def test_a_guard_decides_what_is_stored_as_user_options_once_however_often_installed(
    user: User,
) -> None:
    asked: list[tuple[str, Any, Any]] = []

    def keep_the_previous_large_ones(server: str, value: Any, previous: Any) -> Any:
        asked.append((server, value, previous))
        return previous if value and "large" in value else value

    guard_stored_user_options(keep_the_previous_large_ones)
    guard_stored_user_options(keep_the_previous_large_ones)
    record = thesis(user).orm_spawner
    record.user_options = {"gpu_count": 1}
    record.user_options = {"large": "x"}
    user.db.commit()

    assert [server for server, _, _ in asked] == ["thesis", "thesis"]
    assert user.db.get(orm.Spawner, record.id).user_options == {"gpu_count": 1}


def test_a_record_made_for_this_spawn_is_new_until_the_server_was_active(user: User) -> None:
    spawner = thesis(user)
    assert is_new_record(spawner)
    spawner.orm_spawner.last_activity = datetime.now(UTC)
    assert not is_new_record(spawner)


def test_the_options_kept_for_the_next_start_are_the_records(user: User) -> None:
    spawner = thesis(user)
    store_user_options(spawner, {"gpu_count": 2})
    user.db.commit()
    assert user.db.get(orm.Spawner, spawner.orm_spawner.id).user_options == {"gpu_count": 2}


async def test_a_servers_record_is_removed_as_the_hubs_delete_with_remove_does(
    user: User,
) -> None:
    assert isinstance(user.db, Session)
    spawner = thesis(user)
    assert inspect.getattr_static(Spawner, "_spawn_future") is None  # no spawn under way
    assert isinstance(inspect.getattr_static(Spawner, "active"), property)
    assert "thesis" in server_names(user)

    assert await remove_server_record(spawner)

    assert "thesis" not in server_names(user)
    assert "thesis" not in user.spawners


async def test_a_record_a_newer_request_took_over_is_kept(user: User) -> None:
    first = thesis(user)
    user.spawners.pop("thesis")
    newer = user.get_spawner("thesis")

    assert not await remove_server_record(first)

    assert user.spawners["thesis"] is newer
    assert "thesis" in server_names(user)


def test_a_server_is_named_in_the_log_as_jupyterhub_names_it(user: User) -> None:
    assert isinstance(inspect.getattr_static(Spawner, "_log_name"), property)
    assert log_name(user.spawners[""]) == "student1"
    assert log_name(thesis(user)) == "student1:thesis"


def test_jupyterhubs_templates_are_found() -> None:
    assert (hub_templates() / "page.html").is_file()


def test_importing_the_spawners_changes_nothing_until_one_is_made() -> None:
    """Importing the spawner modules leaves JupyterHub's storage of options as it is.

    The guard against oversized options is installed by the first spawner made.
    """
    check = """
from jupyterhub import orm
from composespawner.domain.request import MAX_OPTIONS_BYTES
import composespawner.spawners.spawner as spawner, composespawner.spawners.kube
big = {"notes": "x" * (MAX_OPTIONS_BYTES + 1)}
record = orm.Spawner(name="thesis")
record.user_options = big
assert record.user_options is big, "importing guarded the stored options"
spawner.ComposeSpawner()
record.user_options = {"notes": "small"}
record.user_options = big
assert record.user_options == {"notes": "small"}, "the first spawner did not guard them"
"""
    subprocess.run([sys.executable, "-W", "error", "-c", check], check=True, timeout=60)
