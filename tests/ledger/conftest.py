"""Fixtures for the ledger: every test runs on SQLite (a temp file) and on PostgreSQL.

PostgreSQL is the local server on 127.0.0.1:5432 (trust auth): two scratch
databases per test session, dropped at the end: one whose schema is dropped
before each migration test, one migrated once and emptied of rows before each
other test. If the server cannot be reached the tests fail; they are never
skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from composespawner.ledger import Ledger
from harness.postgres import connectable_admin_engine, scratch_database

from .support import GPUS, PATHS, Clock, MachineMaker, gpu_ids, inventory

TABLES = (
    "usage_days",
    "usage_model_days",
    "usage_active_days",
    "usage_given_back_days",
    "usage_records",
    "machine_events",
    "devices",
    "machines",
    "quota_accounts",
    "reconcile_actions",
    "quota_rules",
    "audit_log",
    "cohorts",
    "colocated",
    "host_rooms",
    "device_shares",
    "run_manifests",
    "kit_submissions",
    "gpu_watches",
    "gpu_givebacks",
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[tuple[sa.Engine, str]]:
    """An AUTOCOMMIT engine on the server's ``postgres`` database, and the user it works as."""
    admin, user = connectable_admin_engine()
    try:
        yield admin, user
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_empty(postgres_server: tuple[sa.Engine, str]) -> Iterator[str]:
    """A scratch database whose schema each test using it starts without."""
    with scratch_database(postgres_server) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_migrated(postgres_server: tuple[sa.Engine, str]) -> Iterator[str]:
    """A scratch database migrated once; emptied of rows before each test using it."""
    with scratch_database(postgres_server) as url:
        _upgrade(url)
        yield url


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file migrated once, copied for each test (faster than migrating each time)."""
    path = tmp_path_factory.mktemp("ledger-template") / "ledger.sqlite"
    _upgrade(f"sqlite:///{path}")
    return path


def _upgrade(url: str) -> None:
    ledger = Ledger(url)
    try:
        ledger.upgrade()
    finally:
        ledger.close()  # SQLite: the last close checkpoints the WAL into the file


def _autocommit(url: str, *statements: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database on ``backend``: no tables at all."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    url: str = request.getfixturevalue("postgres_empty")
    _autocommit(url, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
    return url


@pytest.fixture
def migrated_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database on ``backend`` at the head revision, with no rows."""
    if backend == "sqlite":
        path = tmp_path / "ledger.sqlite"
        shutil.copyfile(request.getfixturevalue("sqlite_migrated"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_migrated")
    # Replica mode skips triggers, so the append-only event log can be emptied too.
    deletes = [f"DELETE FROM {table}" for table in TABLES]
    _autocommit(url, "SET session_replication_role = replica", *deletes)
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_ledger(migrated_url: str, clock: Clock) -> Iterator[Callable[[], Ledger]]:
    """Open more Ledgers (engines) on the test's database; all closed at teardown."""
    opened: list[Ledger] = []

    def _open() -> Ledger:
        ledger = Ledger(migrated_url, clock=clock, timeout=30.0)
        opened.append(ledger)
        return ledger

    yield _open
    for ledger in opened:
        ledger.close()


@pytest.fixture
def ledger(migrated_url: str, clock: Clock) -> Iterator[Ledger]:
    """A migrated, stocked ledger (see :func:`inventory`)."""
    ledger = Ledger(migrated_url, clock=clock)
    try:
        ledger.sync_devices(inventory())
        yield ledger
    finally:
        ledger.close()


@pytest.fixture
def gpus() -> list[str]:
    """The stocked ledger's pooled GPUs (no owner group)."""
    return gpu_ids(GPUS)


@pytest.fixture
def colocated() -> list[str]:
    """The stocked ledger's co-located GPUs, reserved to group 'physics'."""
    return gpu_ids(2, "colo")


@pytest.fixture
def machine_in(ledger: Ledger) -> MachineMaker:
    """Make a machine and walk it to ``state``; a claim takes ``blocks``."""
    servers = iter(range(1_000_000))

    def _make(
        state: str, user: str = "alice", server: str | None = None, blocks: Sequence[str] = ()
    ) -> str:
        name = f"s{next(servers)}" if server is None else server
        machine_id = ledger.request_machine(user, name, {"gpus": len(blocks)})
        for step in PATHS[state]:
            if step == "claimed":
                ledger.claim(machine_id, host_id="host-1", zone="rack-1", block_ids=blocks)
            else:
                ledger.transition(machine_id, step, f"to {step}")
        return machine_id

    return _make
