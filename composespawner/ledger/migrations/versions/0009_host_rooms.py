"""Shared hosts: each host's room (cores, memory, slots) and each machine's share of it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_rooms",
        sa.Column("host_id", sa.String(128), nullable=False),
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("cores", sa.Integer(), nullable=False),
        sa.Column("memory_gib", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("cores_held", sa.Integer(), nullable=False),
        sa.Column("memory_gib_held", sa.Integer(), nullable=False),
        sa.Column("slots_held", sa.Integer(), nullable=False),
        sa.Column("machines", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "cores_held >= 0 AND cores_held <= cores", name=op.f("ck_host_rooms_cores_held")
        ),
        sa.CheckConstraint(
            "memory_gib_held >= 0 AND memory_gib_held <= memory_gib",
            name=op.f("ck_host_rooms_memory_gib_held"),
        ),
        sa.CheckConstraint(
            "slots_held >= 0 AND slots_held <= slots", name=op.f("ck_host_rooms_slots_held")
        ),
        sa.CheckConstraint("machines >= 0", name=op.f("ck_host_rooms_machines")),
        sa.PrimaryKeyConstraint("host_id", name=op.f("pk_host_rooms")),
    )
    # Machines from before: None, they held their host's own block instead.
    op.add_column("machines", sa.Column("cores", sa.Integer(), nullable=True))
    op.add_column("machines", sa.Column("memory_gib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("memory_gib")
        batch.drop_column("cores")
    op.drop_table("host_rooms")
