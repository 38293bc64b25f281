"""The schema comes only from the Alembic migrations, and matches the ORM models."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from composespawner.ledger import Ledger, migrate
from composespawner.ledger.database import SQLITE_PAGE_SIZE, writing
from composespawner.ledger.models import Base

TABLES = {
    "devices",
    "machines",
    "machine_events",
    "usage_records",
    "usage_days",
    "usage_model_days",
    "run_manifests",
    "kit_submissions",
    "host_rooms",
    "device_shares",
    "quota_rules",
    "audit_log",
    "cohorts",
    "colocated",
    "quota_accounts",
    "reconcile_actions",
    "gpu_watches",
    "gpu_givebacks",
    "usage_active_days",
    "usage_given_back_days",
}


@pytest.fixture
def empty(db_url: str) -> Iterator[Ledger]:
    ledger = Ledger(db_url)
    try:
        yield ledger
    finally:
        ledger.close()


def _tables(ledger: Ledger) -> set[str]:
    return set(sa.inspect(ledger.engine).get_table_names()) - {"alembic_version"}


def _diffs(ledger: Ledger) -> list[object]:
    with ledger.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))


def test_upgrade_from_empty_creates_every_table(empty: Ledger) -> None:
    assert _tables(empty) == set()
    assert empty.schema_revision() is None
    empty.upgrade()
    assert _tables(empty) == TABLES
    head = ScriptDirectory.from_config(_config(empty)).get_current_head()
    assert empty.schema_revision() == head == "0016"


def test_models_match_the_migrated_schema(empty: Ledger) -> None:
    empty.upgrade()
    assert _diffs(empty) == []


def test_live_server_index_is_partial_and_unique(empty: Ledger) -> None:
    empty.upgrade()
    indexes = {ix["name"]: ix for ix in sa.inspect(empty.engine).get_indexes("machines")}
    live = indexes["uq_machines_live_server"]
    assert live["unique"]
    assert live["column_names"] == ["user_name", "server_name"]
    where = next(value for key, value in live["dialect_options"].items() if key.endswith("_where"))
    assert "released" in str(where)
    assert "failed" in str(where)


def test_downgrade_to_base_then_upgrade_again(empty: Ledger) -> None:
    empty.upgrade()
    with writing(empty.engine).begin() as connection:
        migrate.downgrade(connection, "base")
    assert _tables(empty) == set()
    assert empty.schema_revision() is None
    empty.upgrade()
    assert _tables(empty) == TABLES
    assert _diffs(empty) == []


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO machine_events (machine_id, at, to_state, message) "
        "VALUES ('no-such-machine', CURRENT_TIMESTAMP, 'requested', '')",
        "INSERT INTO devices (block_id, kind, model, zone_ids, chassis, machine_id, held_since, "
        "first_seen, last_seen) VALUES ('b', 'gpu', 'm', 'z', 'c', 'no-such-machine', "
        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        "INSERT INTO devices (block_id, kind, model, zone_ids, chassis, first_seen, last_seen) "
        "VALUES ('b', 'fpga', 'm', 'z', 'c', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        "INSERT INTO reconcile_actions (at, kind, outcome, reason) "
        "VALUES (CURRENT_TIMESTAMP, 'reattach', 'maybe', '')",
    ],
    ids=["event-of-unknown-machine", "holder-unknown", "kind-unknown", "outcome-unknown"],
)
def test_the_database_enforces_references_and_kinds(empty: Ledger, sql: str) -> None:
    empty.upgrade()
    with pytest.raises(sa.exc.IntegrityError), empty.engine.begin() as connection:
        connection.exec_driver_sql(sql)
    assert empty.devices() == []


def test_upgrade_twice_is_harmless(empty: Ledger) -> None:
    empty.upgrade()
    empty.upgrade()
    assert empty.schema_revision() == migrate.head_revision()


def test_a_ledger_of_the_first_version_upgrades_keeping_its_machines(empty: Ledger) -> None:
    with writing(empty.engine).begin() as connection:
        migrate.upgrade(connection, "0001")
    machine_id = empty.request_machine("alice", "", {"gpu_count": 1})

    empty.upgrade()

    assert empty.schema_revision() == migrate.head_revision() != "0001"
    assert empty.machine(machine_id) is not None
    assert _diffs(empty) == []


def test_the_package_never_creates_tables_by_itself(empty: Ledger) -> None:
    # Using the ledger before upgrade() must fail, not silently create a schema.
    with pytest.raises(sa.exc.DatabaseError):
        empty.request_machine("alice", "", {})
    assert _tables(empty) == set()


def _config(ledger: Ledger) -> Config:
    with ledger.engine.connect() as connection:
        return migrate.alembic_config(connection)


def _pragma(ledger: Ledger, name: str) -> object:
    with ledger.engine.connect() as connection:
        return connection.exec_driver_sql(f"PRAGMA {name}").scalar()


def test_a_new_sqlite_ledger_has_small_pages_and_a_write_ahead_log(tmp_path: Path) -> None:
    with closing(Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")) as ledger:
        ledger.upgrade()
        assert _pragma(ledger, "page_size") == SQLITE_PAGE_SIZE
        assert _pragma(ledger, "journal_mode") == "wal"


def test_an_older_sqlite_ledger_keeps_its_page_size(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with closing(sqlite3.connect(path)) as made_before:  # as an earlier release made it
        made_before.execute("PRAGMA page_size = 4096")
        made_before.execute("PRAGMA journal_mode = WAL")
    with closing(Ledger(f"sqlite:///{path}")) as ledger:
        ledger.upgrade()
        machine_id = ledger.request_machine("alice", "", {"gpu_count": 1})
        assert _pragma(ledger, "page_size") == 4096
        assert ledger.machine(machine_id) is not None
