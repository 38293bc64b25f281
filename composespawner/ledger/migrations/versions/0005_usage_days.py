"""GPU-seconds per day, user and model, for usage reports; filled from the usage records.

Days already recorded are split in UTC (the site's time zone is not known
here); those written from now on are split in ``site_timezone``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime

import sqlalchemy as sa
from alembic import op

from composespawner.domain.usage import day_shares

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    usage_days = op.create_table(
        "usage_days",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "user_name", "model", name=op.f("pk_usage_days")),
    )
    records = sa.table(
        "usage_records",
        sa.column("user_name", sa.String),
        sa.column("model", sa.String),
        sa.column("kind", sa.String),
        sa.column("started_at", sa.DateTime(timezone=True)),
        sa.column("ended_at", sa.DateTime(timezone=True)),
    )
    query = sa.select(
        records.c.user_name, records.c.model, records.c.started_at, records.c.ended_at
    ).where(records.c.kind == "gpu")
    seconds: dict[tuple[date, str, str], float] = defaultdict(float)
    for user, model, started, ended in op.get_bind().execute(query):
        for day, share in day_shares(_aware(started), _aware(ended)):
            seconds[day, user, model] += share
    if seconds:
        op.bulk_insert(
            usage_days,
            [
                {"day": day, "user_name": user, "model": model, "gpu_seconds": value}
                for (day, user, model), value in seconds.items()
            ],
        )


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes; the ledger stores them in UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def downgrade() -> None:
    op.drop_table("usage_days")
