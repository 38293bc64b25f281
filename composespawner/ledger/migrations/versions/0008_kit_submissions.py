"""Starter-kit submissions: each model scored on blind data, for the leaderboards.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kit_submissions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kit", sa.String(64), nullable=False),
        sa.Column("cohort", sa.String(255), nullable=True),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("model_sha256", sa.String(64), nullable=False),
        sa.Column("model", sa.LargeBinary(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kit_submissions")),
    )
    op.create_index("ix_kit_submissions_board", "kit_submissions", ["kit", "cohort", "score"])


def downgrade() -> None:
    op.drop_index("ix_kit_submissions_board", table_name="kit_submissions")
    op.drop_table("kit_submissions")
