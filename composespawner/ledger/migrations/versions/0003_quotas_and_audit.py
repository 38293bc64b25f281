"""Quota rules (site default, cohort, user) and the audit log of admin and staff actions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_rules",
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("gpus_held", sa.Integer(), nullable=True),
        sa.Column("gpus_per_server", sa.Integer(), nullable=True),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("gpu_hours_week", sa.Float(), nullable=True),
        sa.Column("servers", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.CheckConstraint(
            "level IN ('cohort', 'site', 'user')", name=op.f("ck_quota_rules_level")
        ),
        sa.PrimaryKeyConstraint("level", "subject", name=op.f("pk_quota_rules")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("origin", sa.String(255), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        # The user an action was about (a stopped server's owner), to tell them.
        sa.Column("about_user", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_about_user", "audit_log", ["about_user"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_about_user", table_name="audit_log")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("quota_rules")
