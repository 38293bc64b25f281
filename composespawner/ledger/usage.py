"""GPU-seconds per day, user and model: written as machines end, summed for reports.

The per-day table keeps a report over months to a sum of days in the
database, however many periods of use it covers.
"""

from __future__ import annotations

import threading
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


class UserSums:
    """Per-user sums of periods already read, each kept with the daily model sums it was
    read with: as long as those are unchanged, so are the users' (both tables grow in
    the same transaction, and only grow), so a period's 10,000 users are summed again
    only after someone's use ended in it."""

    MOST_PERIODS = 16

    def __init__(self) -> None:
        self._known: dict[tuple[date, date], tuple[list[Any], list[tuple[str, float]]]] = {}
        self._lock = threading.Lock()  # the ledger's callers' threads share it

    def get(self, period: Period, days: list[Any]) -> list[tuple[str, float]] | None:
        with self._lock:
            known = self._known.get((period.first, period.last))
        return known[1] if known is not None and known[0] == days else None

    def put(self, period: Period, days: list[Any], users: list[tuple[str, float]]) -> None:
        with self._lock:
            if len(self._known) >= self.MOST_PERIODS:
                self._known.pop(next(iter(self._known)))
            self._known[period.first, period.last] = (days, users)


def usage_sums(
    connection: Connection, period: Period, now: datetime, zone: tzinfo, known: UserSums
) -> UsageSums:
    """The period's sums; the per-user ones from ``known`` while the daily ones match."""
    days = [
        (day, model, float(total))
        for day, model, total in connection.execute(
            select(USAGE_MODEL_DAYS.c.day, USAGE_MODEL_DAYS.c.model, USAGE_MODEL_DAYS.c.gpu_seconds)
            .where(USAGE_MODEL_DAYS.c.day.between(period.first, period.last))
            .order_by(USAGE_MODEL_DAYS.c.day, USAGE_MODEL_DAYS.c.model)
        )
    ]
    users = known.get(period, days)
    if users is None:
        # Read after the daily sums: a use that ended in between is in these users' sums
        # but not in the days kept with them, so the next read sums the users again.
        seconds = func.sum(USAGE_DAYS.c.gpu_seconds)
        rows = connection.execute(
            select(USAGE_DAYS.c.user_name, seconds)
            .where(USAGE_DAYS.c.day.between(period.first, period.last))
            .group_by(USAGE_DAYS.c.user_name)
        )
        users = [(user, float(total)) for user, total in rows]
        known.put(period, days, users)
    return UsageSums(days=days, users=users, live=live_uses(connection, period, now, zone))


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
