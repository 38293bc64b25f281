"""Where each watched GPU's stretch without work (nothing holding it) began.

A window is counted from the first reading of its stretch, not from the last busy one,
so a GPU is never taken up to a pass before its window has passed. Rows from before are
left NULL: their stretches start again at the next reading (unknown is not idle).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_watches") as batch:
        batch.add_column(sa.Column("idle_from", sa.Float(), nullable=True))
        batch.add_column(sa.Column("unheld_from", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_watches") as batch:
        batch.drop_column("unheld_from")
        batch.drop_column("idle_from")
