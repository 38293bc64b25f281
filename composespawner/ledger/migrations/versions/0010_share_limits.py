"""Shared hosts in policy: quotas on cores and memory held at once, cohorts' sizes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rules from before set neither limit: NULL leaves it to the level below.
    op.add_column("quota_rules", sa.Column("cores_held", sa.Integer(), nullable=True))
    op.add_column("quota_rules", sa.Column("memory_gib_held", sa.Integer(), nullable=True))
    # Cohorts from before allow every size (NULL), as they did.
    op.add_column("cohorts", sa.Column("sizes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cohorts") as batch:
        batch.drop_column("sizes")
    with op.batch_alter_table("quota_rules") as batch:
        batch.drop_column("memory_gib_held")
        batch.drop_column("cores_held")
