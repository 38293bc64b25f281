"""What the reconciler did: one row per action, for its history and its metrics.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reconcile_actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(8), nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=True),
        sa.Column("host_id", sa.String(128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "outcome IN ('done', 'error')", name=op.f("ck_reconcile_actions_outcome")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconcile_actions")),
    )
    op.create_index("ix_reconcile_actions_kind_outcome", "reconcile_actions", ["kind", "outcome"])


def downgrade() -> None:
    op.drop_index("ix_reconcile_actions_kind_outcome", table_name="reconcile_actions")
    op.drop_table("reconcile_actions")
