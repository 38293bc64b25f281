"""GPU-seconds of work the reclaimer saw, per day, user and model (the usage page's *used*).

Nothing is filled in: the watches' ``active_s`` before this have no days.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_active_days",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "user_name", "model", name=op.f("pk_usage_active_days")),
    )


def downgrade() -> None:
    op.drop_table("usage_active_days")
