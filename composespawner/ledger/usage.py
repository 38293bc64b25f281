"""GPU-seconds per day, user and model: written as machines end, summed for reports.

The per-day table keeps a report over months to a sum of days in the
database, however many periods of use it covers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, tzinfo
from typing import Any, cast

from sqlalchemy import Connection, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.ledger.models import DeviceRow, MachineRow, UsageDayRow, UsageModelDayRow
from composespawner.usage import DayUse, Period, day_shares

USAGE_DAYS = cast(Table, UsageDayRow.__table__)
USAGE_MODEL_DAYS = cast(Table, UsageModelDayRow.__table__)
DEVICES = cast(Table, DeviceRow.__table__)
MACHINES = cast(Table, MachineRow.__table__)


@dataclass(frozen=True)
class UsageSums:
    """A period's GPU use as the ledger knows it (see ``usage.usage_report``)."""

    days: list[tuple[date, str, float]]  # day, model, seconds: ended use
    users: list[tuple[str, float]]  # user, seconds: ended use
    live: list[DayUse]  # running machines' use so far


def add_day_use(
    connection: Connection, user: str, held: Sequence[Any], now: datetime, zone: tzinfo
) -> None:
    """Add the GPU-seconds of ``held`` (device rows, held until ``now``) to their days."""
    seconds: dict[tuple[date, str], float] = defaultdict(float)
    for device in held:
        if device.kind == "gpu":
            for day, share in day_shares(device.held_since or now, now, zone):
                seconds[day, device.model] += share
    if not seconds:
        return
    by_day = sorted(seconds.items())
    rows = [{"day": day, "model": model, "gpu_seconds": value} for (day, model), value in by_day]
    _add(connection, USAGE_DAYS, [{**row, "user_name": user} for row in rows])
    _add(connection, USAGE_MODEL_DAYS, rows)  # one user's: the same days and models


def _add(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Add each row's gpu_seconds to its key's (a new key starts from nothing)."""
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table)
    keys = [column.name for column in table.primary_key.columns]
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=keys,
            set_={"gpu_seconds": table.c.gpu_seconds + statement.excluded.gpu_seconds},
        ),
        rows,
    )


def usage_sums(connection: Connection, period: Period, now: datetime, zone: tzinfo) -> UsageSums:
    within = USAGE_DAYS.c.day.between(period.first, period.last)
    seconds = func.sum(USAGE_DAYS.c.gpu_seconds)
    days = connection.execute(
        select(
            USAGE_MODEL_DAYS.c.day, USAGE_MODEL_DAYS.c.model, USAGE_MODEL_DAYS.c.gpu_seconds
        ).where(USAGE_MODEL_DAYS.c.day.between(period.first, period.last))
    )
    users = connection.execute(
        select(USAGE_DAYS.c.user_name, seconds).where(within).group_by(USAGE_DAYS.c.user_name)
    )
    return UsageSums(
        days=[(day, model, float(total)) for day, model, total in days],
        users=[(user, float(total)) for user, total in users],
        live=live_uses(connection, period, now, zone),
    )


def day_uses(connection: Connection, period: Period) -> list[DayUse]:
    """Every stored day, user and model in ``period`` with its ended use, in that order."""
    rows = connection.execute(
        select(USAGE_DAYS)
        .where(USAGE_DAYS.c.day.between(period.first, period.last))
        .order_by(USAGE_DAYS.c.day, USAGE_DAYS.c.user_name, USAGE_DAYS.c.model)
    )
    return [DayUse(row.day, row.user_name, row.model, row.gpu_seconds) for row in rows]


def live_uses(connection: Connection, period: Period, now: datetime, zone: tzinfo) -> list[DayUse]:
    """Running machines' GPU use in ``period``, up to ``now``."""
    held = connection.execute(
        select(MACHINES.c.user_name, DEVICES.c.model, DEVICES.c.held_since)
        .join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
        .where(DEVICES.c.kind == "gpu")
    )
    return [
        DayUse(day, user, model, share)
        for user, model, since in held
        for day, share in day_shares(since or now, now, zone)
        if period.first <= day <= period.last
    ]
