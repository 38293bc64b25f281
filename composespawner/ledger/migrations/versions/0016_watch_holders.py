"""Who held each watched GPU at its latest reading: the kernels a reclaim shuts down.

NVML names the processes holding a GPU, and so the Jupyter kernels they belong to: a
reclaim then ends those kernels only, and the portal tells a user which of their GPUs
waits for another. NULL (every row from before) is unknown: a reclaim ends every kernel
of the server, as before, until the next reading names the holders.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_watches") as batch:
        batch.add_column(sa.Column("holders", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_watches") as batch:
        batch.drop_column("holders")
