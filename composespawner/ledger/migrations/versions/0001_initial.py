"""The initial ledger: devices and their holders, machines, events, usage, quota accounts.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of what the models say today: a migration must not change when
# the models do.
STATES = "'claimed', 'composed', 'failed', 'launching', 'released', 'requested', 'running', "
STATES += "'stopping'"
KINDS = "'gpu', 'host', 'nic', 'nvme'"
LIVE_MACHINE_WHERE = "state NOT IN ('failed', 'released')"
APPEND_ONLY = "machine_events is append-only"


def _time(name: str, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "machines",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("host_id", sa.String(128), nullable=True),
        sa.Column("zone", sa.String(128), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("failure", sa.Text(), nullable=True),
        _time("created_at"),
        _time("updated_at"),
        _time("ended_at", nullable=True),
        sa.CheckConstraint(f"state IN ({STATES})", name=op.f("ck_machines_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machines")),
    )
    op.create_index(op.f("ix_machines_user_name"), "machines", ["user_name"])
    op.create_index(
        "uq_machines_live_server",
        "machines",
        ["user_name", "server_name"],
        unique=True,
        sqlite_where=sa.text(LIVE_MACHINE_WHERE),
        postgresql_where=sa.text(LIVE_MACHINE_WHERE),
    )
    op.create_table(
        "devices",
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("zone_ids", sa.String(1024), nullable=False),
        sa.Column("chassis", sa.String(128), nullable=False),
        sa.Column("owner_group", sa.String(255), nullable=True),
        sa.Column("machine_id", sa.String(32), nullable=True),
        _time("held_since", nullable=True),
        _time("first_seen"),
        _time("last_seen"),
        sa.CheckConstraint(f"kind IN ({KINDS})", name=op.f("ck_devices_kind")),
        sa.CheckConstraint(
            "(machine_id IS NULL) = (held_since IS NULL)",
            name=op.f("ck_devices_held_since_with_holder"),
        ),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name=op.f("fk_devices_machine_id_machines")
        ),
        sa.PrimaryKeyConstraint("block_id", name=op.f("pk_devices")),
    )
    op.create_index(op.f("ix_devices_machine_id"), "devices", ["machine_id"])
    op.create_table(
        "machine_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=False),
        _time("at"),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name=op.f("fk_machine_events_machine_id_machines")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machine_events")),
    )
    op.create_index(op.f("ix_machine_events_machine_id"), "machine_events", ["machine_id"])
    op.create_table(
        "usage_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        _time("started_at"),
        _time("ended_at"),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name=op.f("fk_usage_records_machine_id_machines")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index(op.f("ix_usage_records_machine_id"), "usage_records", ["machine_id"])
    op.create_index(op.f("ix_usage_records_user_name"), "usage_records", ["user_name"])
    op.create_table(
        "quota_accounts",
        sa.Column("user_name", sa.String(255), nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("user_name", name=op.f("pk_quota_accounts")),
    )
    _create_append_only_triggers()


def downgrade() -> None:
    _drop_append_only_triggers()
    op.drop_table("quota_accounts")
    op.drop_index(op.f("ix_usage_records_user_name"), table_name="usage_records")
    op.drop_index(op.f("ix_usage_records_machine_id"), table_name="usage_records")
    op.drop_table("usage_records")
    op.drop_index(op.f("ix_machine_events_machine_id"), table_name="machine_events")
    op.drop_table("machine_events")
    op.drop_index(op.f("ix_devices_machine_id"), table_name="devices")
    op.drop_table("devices")
    op.drop_index("uq_machines_live_server", table_name="machines")
    op.drop_index(op.f("ix_machines_user_name"), table_name="machines")
    op.drop_table("machines")


def _create_append_only_triggers() -> None:
    """The event log is append-only in the database too, not only through the ORM."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION machine_events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{APPEND_ONLY}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER machine_events_append_only BEFORE UPDATE OR DELETE "
            "ON machine_events FOR EACH ROW EXECUTE FUNCTION machine_events_append_only()"
        )
        op.execute(
            "CREATE TRIGGER machine_events_no_truncate BEFORE TRUNCATE "
            "ON machine_events FOR EACH STATEMENT EXECUTE FUNCTION machine_events_append_only()"
        )
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER machine_events_no_{action.lower()} BEFORE {action} ON machine_events "
            f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
        )


def _drop_append_only_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER machine_events_no_truncate ON machine_events")
        op.execute("DROP TRIGGER machine_events_append_only ON machine_events")
        op.execute("DROP FUNCTION machine_events_append_only()")
        return
    for action in ("update", "delete"):
        op.execute(f"DROP TRIGGER machine_events_no_{action}")
