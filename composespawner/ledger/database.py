"""Engines for the ledger: SQLite (one file, the embedded default) or PostgreSQL.

SQLite serialises writers with a file lock. Python's sqlite3 driver would start
transactions lazily (and only before DML), so a claim could read, then fail to
upgrade its lock, or read stale rows; we take transaction control from the
driver (SQLAlchemy's documented pysqlite recipe) and start every writing
transaction with ``BEGIN IMMEDIATE``: it waits (up to the busy timeout) for the
write lock *before* reading, so read-then-write inside it is safe. WAL lets
readers go on meanwhile.

PostgreSQL runs at READ COMMITTED; the ledger's writes are conditional UPDATEs
checked by rowcount plus explicit row locks, which is correct there.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, tzinfo
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url

# Execution option on the engine that writing sessions use.
WRITE_OPTION = "composespawner_ledger_write"
SQLITE_PAGE_SIZE = 1024  # bytes; a new ledger file's


def create_ledger_engine(url: str | URL, *, timeout: float, echo: bool = False) -> Engine:
    """An engine for ``url``; ``timeout`` bounds connecting and every wait for a lock."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, timeout=timeout, echo=echo)
    if backend == "postgresql":
        return _postgresql_engine(parsed, timeout=timeout, echo=echo)
    raise ValueError(f"the ledger supports sqlite and postgresql URLs, not {backend!r}")


def writing(engine: Engine) -> Engine:
    """The same engine (same pool), marked so SQLite starts its transactions IMMEDIATE."""
    return engine.execution_options(**{WRITE_OPTION: True})


def log_ahead(db: sqlite3.Connection | sqlite3.Cursor) -> None:
    """Put an SQLite connection on a write-ahead log that syncs only at checkpoints.

    SQLite's advice for WAL: with ``synchronous = NORMAL`` a commit appends to
    the log without an fsync. A crash of the process loses nothing; a power cut
    may lose the last commits, never the file. The ledger and, in the embedded
    default, JupyterHub's own database use it.
    """
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")


def _sqlite_engine(url: URL, *, timeout: float, echo: bool) -> Engine:
    if url.database in (None, "", ":memory:") or url.query.get("mode") == "memory":
        # Each pooled connection would see its own empty database (or all
        # threads would share one connection and one transaction).
        raise ValueError("the ledger needs an SQLite file (sqlite:///path), not an in-memory db")
    engine = create_engine(
        url,
        echo=echo,
        pool_timeout=timeout,
        connect_args={"timeout": timeout, "check_same_thread": False},
    )
    busy_ms = math.ceil(timeout * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        # Stop the driver from issuing BEGIN itself; _on_begin does it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            # Only a new file takes it (WAL then fixes it). A commit writes every
            # page it touched, whole, to the log, and the ledger's rows are small:
            # with 1 KiB pages a spawn's commits write 43 KiB instead of 114 KiB,
            # and a storm of 200 spawns (benchmarks/spawn_storm) was ready sooner.
            cursor.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
            # A power cut may lose the last commits: the reconciler then frees
            # what our tags show but the ledger lacks.
            log_ahead(cursor)
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        immediate = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgresql_engine(url: URL, *, timeout: float, echo: bool) -> Engine:
    connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(timeout))}
    if "options" not in url.query:
        # A claim waits on another claim's row locks; never forever.
        connect_args["options"] = f"-c lock_timeout={math.ceil(timeout * 1000)}"
    return create_engine(
        url,
        echo=echo,
        pool_pre_ping=True,  # the hub runs for months; the database restarts meanwhile
        pool_timeout=timeout,
        connect_args=connect_args,
    )


class LedgerPart:
    """A part of the ledger (its policy, its kit submissions) on the ledger's engine:
    reads through ``_engine``, writes through the ledger's ``_write`` (its turn and
    transaction), times from its clock."""

    def __init__(
        self,
        engine: Engine,
        write: Callable[[], AbstractContextManager[Connection]],
        now: Callable[[], datetime],
    ) -> None:
        self._engine = engine
        self._write = write
        self._now = now

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """A read whose statements all see one state of the ledger: figures read in parts
        (ended machines' days, then the running machines) agree, so a machine that ends
        meanwhile is counted once. PostgreSQL's default, READ COMMITTED, gives each
        statement a snapshot of its own; a SQLite transaction already keeps one."""
        with self._engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                yield connection


class ZonedLedgerPart(LedgerPart):
    """A part that also splits use into days, in the site's time zone (usage records)."""

    def __init__(
        self,
        engine: Engine,
        write: Callable[[], AbstractContextManager[Connection]],
        now: Callable[[], datetime],
        usage_zone: tzinfo,
    ) -> None:
        super().__init__(engine, write, now)
        self._usage_zone = usage_zone
