"""GPU-seconds per day and model (the usage chart's stacks), and a covering index for
the usage page's per-user sums; filled from usage_days.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_model_days",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "model", name=op.f("pk_usage_model_days")),
    )
    op.execute(
        "INSERT INTO usage_model_days (day, model, gpu_seconds)"
        " SELECT day, model, sum(gpu_seconds) FROM usage_days GROUP BY day, model"
    )
    op.create_index(
        "ix_usage_days_covering", "usage_days", ["day", "user_name", "model", "gpu_seconds"]
    )


def downgrade() -> None:
    op.drop_index("ix_usage_days_covering", table_name="usage_days")
    op.drop_table("usage_model_days")
