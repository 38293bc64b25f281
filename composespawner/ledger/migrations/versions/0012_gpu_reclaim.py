"""Idle GPUs given back: the reclaimer's watch of each held GPU, what it gave back, and
cohorts' reclaim policies.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_watches",
        sa.Column("machine_id", sa.String(32), nullable=False),
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("last_at", sa.Float(), nullable=False),
        sa.Column("last_work_at", sa.Float(), nullable=True),
        sa.Column("last_held_at", sa.Float(), nullable=True),
        sa.Column("utilization", sa.Float(), nullable=False, server_default="0"),
        sa.Column("memory_used_mib", sa.Float(), nullable=False, server_default="0"),
        sa.Column("warned_at", sa.Float(), nullable=True),
        sa.Column("kept_until", sa.Float(), nullable=True),
        sa.Column("keeps_used", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("active_s", sa.Float(), nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["machine_id"],
            ["machines.id"],
            name=op.f("fk_gpu_watches_machine_id_machines"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("machine_id", "block_id", name=op.f("pk_gpu_watches")),
    )
    op.create_table(
        "gpu_givebacks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("machine_id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("server_name", sa.String(255), nullable=False),
        sa.Column("cohort", sa.String(255), nullable=True),
        sa.Column("block_id", sa.String(128), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("figures", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.CheckConstraint("action IN ('detach', 'reclaim')", name=op.f("ck_gpu_givebacks_action")),
        sa.ForeignKeyConstraint(
            ["machine_id"], ["machines.id"], name=op.f("fk_gpu_givebacks_machine_id_machines")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_givebacks")),
    )
    op.create_index("ix_gpu_givebacks_machine_id", "gpu_givebacks", ["machine_id"])
    op.create_index("ix_gpu_givebacks_at", "gpu_givebacks", ["at"])
    # Cohorts from before set nothing of their own: the site's policy is theirs.
    op.add_column("cohorts", sa.Column("reclaim_policy", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cohorts") as batch:
        batch.drop_column("reclaim_policy")
    op.drop_index("ix_gpu_givebacks_at", table_name="gpu_givebacks")
    op.drop_index("ix_gpu_givebacks_machine_id", table_name="gpu_givebacks")
    op.drop_table("gpu_givebacks")
    op.drop_table("gpu_watches")
