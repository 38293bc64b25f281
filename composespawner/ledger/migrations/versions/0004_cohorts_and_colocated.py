"""Cohorts (a hub group's dates, sessions, stacks, kit and reservation), machines noting
theirs, and co-located devices registered to an owner group (and lent).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cohorts",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("title", sa.String(255), nullable=False),
        sa.Column("starts_on", sa.Date(), nullable=True),
        sa.Column("ends_on", sa.Date(), nullable=True),
        sa.Column("sessions", sa.JSON(), nullable=False),
        sa.Column("stacks", sa.JSON(), nullable=True),
        sa.Column("starter_kit", sa.String(255), nullable=True),
        sa.Column("reserved_model", sa.String(255), nullable=True),
        sa.Column("reserved_gpus", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cohorts")),
    )
    # The cohort whose reservation a machine's GPUs were claimed under (members in session).
    op.add_column("machines", sa.Column("cohort", sa.String(255), nullable=True))
    op.create_table(
        "colocated",
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("owner_group", sa.String(255), nullable=False),
        sa.Column("lent_to_user", sa.String(255), nullable=True),
        sa.Column("lent_to_group", sa.String(255), nullable=True),
        sa.Column("lent_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("block_id", name=op.f("pk_colocated")),
    )


def downgrade() -> None:
    op.drop_table("colocated")
    with op.batch_alter_table("machines") as batch:
        batch.drop_column("cohort")
    op.drop_table("cohorts")
