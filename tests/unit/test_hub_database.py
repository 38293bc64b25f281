"""The embedded default's hub database: JupyterHub's own engine, on a write-ahead log."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from jupyterhub import orm

from composespawner.commands.embedded import hub_database_kwargs

SYNCHRONOUS_NORMAL = 1


def test_each_connection_logs_ahead_and_syncs_only_at_checkpoints(tmp_path: Path) -> None:
    connect = hub_database_kwargs(tmp_path / "jupyterhub.sqlite")["creator"]
    with closing(connect()) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA synchronous").fetchone() == (SYNCHRONOUS_NORMAL,)


def test_jupyterhub_keeps_its_users_in_a_write_ahead_logged_file(tmp_path: Path) -> None:
    path = tmp_path / "jupyterhub.sqlite"
    make_session = orm.new_session_factory(f"sqlite:///{path}", **hub_database_kwargs(path))
    with make_session() as db:
        db.add(orm.User(name="student1"))
        db.commit()
        # JupyterHub's own listener still enforces foreign keys on these connections.
        assert db.connection().exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    make_session.kw["bind"].dispose()
    with closing(sqlite3.connect(path)) as reader:
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert reader.execute("SELECT name FROM users").fetchall() == [("student1",)]
