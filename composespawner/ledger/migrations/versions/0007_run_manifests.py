"""Run manifests: what each server ran on, for the portal and "launch again identically".

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_manifests",
        sa.Column("machine_id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name=op.f("fk_run_manifests_machine_id_machines")
        ),
        sa.PrimaryKeyConstraint("machine_id", name=op.f("pk_run_manifests")),
    )
    op.create_index("ix_run_manifests_user", "run_manifests", ["user_name", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_run_manifests_user", table_name="run_manifests")
    op.drop_table("run_manifests")
