"""Running the packaged Alembic migrations on a connection the ledger opened.

The schema is created only here (never ``metadata.create_all``), so a database
made by any version of composespawner can be brought to head.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

PACKAGE_DIR = Path(__file__).resolve().parent


def _packaged_config() -> Config:
    config = Config(str(PACKAGE_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(PACKAGE_DIR / "migrations"))
    return config


def alembic_config(connection: Connection, usage_zone: tzinfo = UTC) -> Config:
    """Alembic's config for the packaged migrations, running on ``connection``;
    ``usage_zone``, the site's, splits the days a migration fills usage into."""
    config = _packaged_config()
    # migrations/env.py uses this connection instead of making its own engine.
    config.attributes["connection"] = connection
    config.attributes["usage_zone"] = usage_zone
    return config


def upgrade(connection: Connection, revision: str = "head", usage_zone: tzinfo = UTC) -> None:
    command.upgrade(alembic_config(connection, usage_zone), revision)


def downgrade(connection: Connection, revision: str) -> None:
    command.downgrade(alembic_config(connection), revision)


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The revision the packaged migrations end at: what this version's code expects."""
    head = ScriptDirectory.from_config(_packaged_config()).get_current_head()
    assert head is not None, "the packaged migrations have one head"
    return head
