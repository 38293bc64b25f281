"""Alembic environment for the ledger.

Run by ``Ledger.upgrade()`` with the ledger's own connection in
``config.attributes["connection"]`` (so SQLite gets the ledger's pragmas and
``BEGIN IMMEDIATE``), or from the command line with ``-x url=...``.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text

from composespawner.ledger.database import create_ledger_engine, writing
from composespawner.ledger.models import Base

# Any fixed number: the key of the PostgreSQL advisory lock that keeps two hubs
# starting at once from migrating the same database at the same time.
MIGRATION_LOCK_KEY = 0x636F6D706F7365

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database URL: pass -x url=sqlite:///path or postgresql+psycopg://...")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite can alter tables only by copying them
        # Our SQLite engine issues BEGIN itself (see database.py), so DDL is
        # transactional there too: a failed migration leaves nothing half-done.
        transactional_ddl=True,
        compare_type=True,
    )


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            lock = text("SELECT pg_advisory_xact_lock(:key)")
            connection.execute(lock, {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # Command-line use: the hub's logging is not ours to configure otherwise.
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    engine = create_ledger_engine(_url(), timeout=30.0)
    try:
        with writing(engine).connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
