"""GPU shares: a GPU split into holder slots, its holders, fractional usage, shared reservations.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The same conditions as composespawner.ledger.models.DeviceRow's.
SHARE_CHECKS = {
    "whole_or_split": "machine_id IS NULL OR share_size IS NULL",
    "split_where": "(share_size IS NULL) = (share_host IS NULL)",
    "share_holders": "share_holders >= 0 AND share_holders <= COALESCE(share_size, 0)",
}


def upgrade() -> None:
    # Every GPU before this one was held whole (or not at all): none is split.
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("share_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("share_host", sa.String(128), nullable=True))
        batch.add_column(
            sa.Column("share_holders", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("share_closer", sa.String(32), nullable=True))
        for name, condition in SHARE_CHECKS.items():
            batch.create_check_constraint(name, condition)
    op.create_table(
        "device_shares",
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=False),
        sa.Column("held_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("leaving", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.ForeignKeyConstraint(
            ["block_id"], ["devices.block_id"], name="fk_device_shares_block_id_devices"
        ),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name="fk_device_shares_machine_id_machines"
        ),
        sa.PrimaryKeyConstraint("block_id", "machine_id", name="pk_device_shares"),
    )
    op.create_index("ix_device_shares_machine_id", "device_shares", ["machine_id"])
    op.add_column("machines", sa.Column("gpu_share", sa.Integer(), nullable=True))
    # Records from before are of whole devices.
    op.add_column(
        "usage_records",
        sa.Column("fraction", sa.Float(), nullable=False, server_default="1"),
    )
    # Reservations from before are of whole GPUs.
    op.add_column(
        "cohorts", sa.Column("reserved_share", sa.Integer(), nullable=False, server_default="1")
    )


def downgrade() -> None:
    with op.batch_alter_table("cohorts") as batch:
        batch.drop_column("reserved_share")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("fraction")
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("gpu_share")
    op.drop_index("ix_device_shares_machine_id", table_name="device_shares")
    op.drop_table("device_shares")
    with op.batch_alter_table("devices") as batch:
        for name in SHARE_CHECKS:
            batch.drop_constraint(name, type_="check")
        batch.drop_column("share_closer")
        batch.drop_column("share_holders")
        batch.drop_column("share_host")
        batch.drop_column("share_size")
