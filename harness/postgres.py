"""The local PostgreSQL server (127.0.0.1:5432, trust auth) and scratch databases on it.

If the server cannot be reached the tests that need it fail; they are never skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

PG_ADDRESS = "127.0.0.1:5432"
PG_USERS = ("postgres", "root")


def connectable_admin_engine() -> tuple[sa.Engine, str]:
    errors = []
    for user in PG_USERS:
        url = f"postgresql+psycopg://{user}@{PG_ADDRESS}/postgres"
        engine = sa.create_engine(
            url,
            isolation_level="AUTOCOMMIT",
            poolclass=NullPool,
            connect_args={"connect_timeout": 5},
        )
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        except sa.exc.OperationalError as err:
            errors.append(f"as {user}: {str(err).splitlines()[0]}")
            engine.dispose()
            continue
        return engine, user
    pytest.fail(
        f"PostgreSQL is not reachable on {PG_ADDRESS} (tried users {', '.join(PG_USERS)} with "
        f"trust auth): {'; '.join(errors)}. Start it (e.g. `service postgresql start`) or run "
        "only the SQLite half with `-m 'not postgres'`.",
        pytrace=False,
    )


@contextmanager
def scratch_database(server: tuple[sa.Engine, str]) -> Iterator[str]:
    """Create a database for this test session; drop it (and its connections) afterwards."""
    admin, user = server
    name = f"composespawner_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{user}@{PG_ADDRESS}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
