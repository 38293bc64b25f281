"""GPU-seconds given back per day, user and model, of machines that ended (the usage page's
*given back*, which was summed from every give-back row on each read); filled from the
give-backs of machines already ended.

Days are split in the site's time zone, as the usage page split them when it read the
give-backs (the ledger passes it; UTC for an upgrade run without it, as by hand).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime

import sqlalchemy as sa
from alembic import op

from composespawner.domain.usage import day_shares, given_back_spans, gpus_asked

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    given_back_days = op.create_table(
        "usage_given_back_days",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "user_name", "model", name=op.f("pk_usage_given_back_days")),
    )
    givebacks = sa.table(
        "gpu_givebacks",
        sa.column("id", sa.Integer),
        sa.column("machine_id", sa.String),
        sa.column("user_name", sa.String),
        sa.column("model", sa.String),
        sa.column("at", sa.DateTime(timezone=True)),
    )
    machines = sa.table(
        "machines",
        sa.column("id", sa.String),
        sa.column("request", sa.JSON),
        sa.column("ended_at", sa.DateTime(timezone=True)),
    )
    g, m = givebacks.c, machines.c
    query = (
        sa.select(g.machine_id, g.at, m.ended_at, m.request, g.user_name, g.model)
        .join(machines, m.id == g.machine_id)
        .where(m.ended_at.is_not(None))
        .order_by(g.at, g.id)
    )
    config = op.get_context().config
    zone = config.attributes.get("usage_zone", UTC) if config is not None else UTC
    spans = given_back_spans(
        (machine, _aware(at), _aware(ended), gpus_asked(request), (user, model))
        for machine, at, ended, request, user, model in op.get_bind().execute(query)
    )
    seconds: dict[tuple[date, str, str], float] = defaultdict(float)
    for begin, end, (user, model) in spans:
        for day, share in day_shares(begin, end, zone):
            seconds[day, user, model] += share
    if seconds:
        op.bulk_insert(
            given_back_days,
            [
                {"day": day, "user_name": user, "model": model, "gpu_seconds": value}
                for (day, user, model), value in sorted(seconds.items())
            ],
        )


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes; the ledger stores them in UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def downgrade() -> None:
    op.drop_table("usage_given_back_days")
