"""GPU-seconds per day, user and model: written as machines end, summed for reports.

The per-day table keeps a report over months to a sum of days in the
database, however many periods of use it covers. The *used* figure has its own
per-day table, added to by the reclaimer's passes; so has *given back*, added to as
machines end, running machines' counted when read (see :mod:`composespawner.domain.usage`
for the three figures).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any, cast

from sqlalchemy import Connection, Table, case, func, literal, null, select, text, union_all
from sqlalchemy import cast as cast_to
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.domain.usage import (
    DayUse,
    DayUserSeconds,
    Period,
    day_shares,
    given_back_spans,
    gpus_asked,
)
from composespawner.ledger.models import (
    LIVE_MACHINE_WHERE,
    DeviceRow,
    DeviceShareRow,
    GpuGiveBackRow,
    MachineRow,
    UsageActiveDayRow,
    UsageDayRow,
    UsageGivenBackDayRow,
    UsageModelDayRow,
)

USAGE_DAYS = cast(Table, UsageDayRow.__table__)
USAGE_MODEL_DAYS = cast(Table, UsageModelDayRow.__table__)
USAGE_ACTIVE_DAYS = cast(Table, UsageActiveDayRow.__table__)
USAGE_GIVEN_BACK_DAYS = cast(Table, UsageGivenBackDayRow.__table__)
GIVEBACKS = cast(Table, GpuGiveBackRow.__table__)
DEVICES = cast(Table, DeviceRow.__table__)
MACHINES = cast(Table, MachineRow.__table__)
SHARES = cast(Table, DeviceShareRow.__table__)


@dataclass(frozen=True)
class UsageSums:
    """A period's GPU use as the ledger knows it (see ``usage.usage_report``)."""

    days: list[tuple[date, str, float]]  # day, model, seconds: ended use
    users: list[tuple[str, float]]  # user, seconds: ended use
    live: list[DayUse]  # running machines' use so far
    used: DayUserSeconds = field(default_factory=DayUserSeconds)  # seconds of work seen
    given_back: DayUserSeconds = field(default_factory=DayUserSeconds)  # see given_back_uses


def add_day_use(
    connection: Connection, user: str, held: Sequence[Any], now: datetime, zone: tzinfo
) -> None:
    """Add the GPU-seconds of ``held`` (device rows, held until ``now``; a share's with the
    ``fraction`` of its GPU it counts for) to their days."""
    seconds: dict[tuple[date, str], float] = defaultdict(float)
    for device in held:
        if device.kind == "gpu":
            fraction = getattr(device, "fraction", 1.0)
            for day, share in day_shares(device.held_since or now, now, zone):
                seconds[day, device.model] += share * fraction
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


DaySums = list[tuple[date, str, float]]  # (day, model, seconds), in that order


@dataclass
class _Known:
    days: DaySums  # the daily model sums read (just) before these
    totals: dict[str, float]  # seconds per user over the period
    last_day: dict[str, float]  # seconds per user on the period's last day


class UserSums:
    """Per-user sums of periods already read, each kept with the daily model sums read
    just before them. Both tables grow in one transaction (and only grow), so while the
    daily sums are unchanged so are the users'; when only the period's last day changed
    (as every server stopping today changes it), that day alone is read again. A
    period's 10,000 users are summed again only when an older day changed."""

    MOST_PERIODS = 16

    def __init__(self) -> None:
        self._known: dict[tuple[date, date], _Known] = {}
        self._lock = threading.Lock()  # the ledger's callers' threads share it

    def read(self, connection: Connection, period: Period, days: DaySums) -> dict[str, float]:
        key = (period.first, period.last)
        with self._lock:
            known = self._known.get(key)
        if known is not None and known.days == days:
            return known.totals
        if known is not None and _before(known.days, period.last) == _before(days, period.last):
            last_day = _day_user_sums(connection, period.last)
            totals = dict(known.totals)
            for user, seconds in known.last_day.items():
                totals[user] -= seconds
            for user, seconds in last_day.items():
                totals[user] = totals.get(user, 0.0) + seconds
        else:
            totals, last_day = _user_sums(connection, period)
        with self._lock:
            if key not in self._known and len(self._known) >= self.MOST_PERIODS:
                self._known.pop(next(iter(self._known)))
            self._known[key] = _Known(days, totals, last_day)
        return totals


def _before(days: DaySums, last: date) -> DaySums:
    return [entry for entry in days if entry[0] < last]


def _user_sums(connection: Connection, period: Period) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per user over the period, and on its last day: one statement, one snapshot."""
    seconds = USAGE_DAYS.c.gpu_seconds
    on_last = func.sum(case((USAGE_DAYS.c.day == period.last, seconds), else_=0.0))
    rows = connection.execute(
        select(USAGE_DAYS.c.user_name, func.sum(seconds), on_last)
        .where(USAGE_DAYS.c.day.between(period.first, period.last))
        .group_by(USAGE_DAYS.c.user_name)
    )
    totals, last_day = {}, {}
    for user, total, last in rows:
        totals[user] = float(total)
        if last:
            last_day[user] = float(last)
    return totals, last_day


def _day_user_sums(connection: Connection, day: date) -> dict[str, float]:
    rows = connection.execute(
        select(USAGE_DAYS.c.user_name, func.sum(USAGE_DAYS.c.gpu_seconds))
        .where(USAGE_DAYS.c.day == day)
        .group_by(USAGE_DAYS.c.user_name)
    )
    return {user: float(total) for user, total in rows}


def usage_sums(
    connection: Connection, period: Period, now: datetime, zone: tzinfo, known: UserSums
) -> UsageSums:
    """The period's sums; the per-user ones through ``known`` (see UserSums)."""
    days = [
        (day, model, float(total))
        for day, model, total in connection.execute(
            select(USAGE_MODEL_DAYS.c.day, USAGE_MODEL_DAYS.c.model, USAGE_MODEL_DAYS.c.gpu_seconds)
            .where(USAGE_MODEL_DAYS.c.day.between(period.first, period.last))
            .order_by(USAGE_MODEL_DAYS.c.day, USAGE_MODEL_DAYS.c.model)
        )
    ]
    # Read after the daily sums: a use that ends in between is in the users' sums but not
    # in the days kept with them, so the next read looks again; nothing is counted twice.
    users = [
        (user, total) for user, total in known.read(connection, period, days).items() if total > 0
    ]
    return UsageSums(
        days=days,
        users=users,
        live=live_uses(connection, period, now, zone),
        used=used_sums(connection, period),
        given_back=given_back_sums(connection, period, now, zone),
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
    whole = (
        select(MACHINES.c.user_name, DEVICES.c.model, DEVICES.c.held_since, literal(1.0))
        .join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
        .where(DEVICES.c.kind == "gpu")
    )
    # A share of 1/n counts 1/n of each second it is held.
    shares = select(
        MACHINES.c.user_name, DEVICES.c.model, SHARES.c.held_since, 1.0 / DEVICES.c.share_size
    ).select_from(
        SHARES.join(DEVICES, DEVICES.c.block_id == SHARES.c.block_id).join(
            MACHINES, MACHINES.c.id == SHARES.c.machine_id
        )
    )
    return [
        DayUse(day, user, model, seconds * fraction)
        for user, model, since, fraction in connection.execute(union_all(whole, shares))
        for day, seconds in day_shares(since or now, now, zone)
        if period.first <= day <= period.last
    ]


# -- used: the seconds of work the reclaimer saw -----------------------------------------


def add_used(
    connection: Connection, active: Mapping[tuple[str, str], float], now: datetime, zone: tzinfo
) -> None:
    """Add each (machine id, block id)'s seconds of work to its machine's user and its GPU's
    model on the day of ``now`` (the reclaimer's pass that saw them); a share of 1/n counts
    1/n, as it does when held. Keys of machines or GPUs the ledger lacks add nothing."""
    active = {key: value for key, value in active.items() if value > 0}
    if not active:
        return
    machines = sorted({machine_id for machine_id, _ in active})
    blocks = sorted({block_id for _, block_id in active})
    users: dict[str, str] = {
        machine_id: user
        for machine_id, user in connection.execute(
            select(MACHINES.c.id, MACHINES.c.user_name).where(MACHINES.c.id.in_(machines))
        )
    }
    devices = {
        row.block_id: row
        for row in connection.execute(
            select(
                DEVICES.c.block_id, DEVICES.c.model, DEVICES.c.machine_id, DEVICES.c.share_size
            ).where(DEVICES.c.block_id.in_(blocks))
        )
    }
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for (machine_id, block_id), value in active.items():
        device = devices.get(block_id)
        if machine_id not in users or device is None:
            continue
        whole = device.machine_id == machine_id or not device.share_size
        seconds[users[machine_id], device.model] += value if whole else value / device.share_size
    day = now.astimezone(zone).date()
    rows = [
        {"day": day, "user_name": user, "model": model, "gpu_seconds": value}
        for (user, model), value in sorted(seconds.items())  # one order: no deadlocks
    ]
    if rows:
        _add(connection, USAGE_ACTIVE_DAYS, rows)


def used_sums(connection: Connection, period: Period) -> DayUserSeconds:
    """The period's seconds of work per day and per user, summed in the database."""
    return _figure_sums(connection, USAGE_ACTIVE_DAYS, period)


def _figure_sums(connection: Connection, table: Table, period: Period) -> DayUserSeconds:
    """A per-day figure's sums over ``period`` per day and per user: one statement (one
    round trip, one snapshot), the days' rows without a user, the users' without a day."""
    c = table.c
    in_period = c.day.between(period.first, period.last)
    total = func.sum(c.gpu_seconds)
    no_day, no_user = cast_to(null(), c.day.type), cast_to(null(), c.user_name.type)
    by_day = select(c.day, no_user, total).where(in_period).group_by(c.day)
    by_user = select(no_day, c.user_name, total).where(in_period).group_by(c.user_name)
    days, users = [], []
    for day, user, value in connection.execute(union_all(by_day, by_user)):
        if user is None:
            days.append((day, float(value)))
        else:
            users.append((user, float(value)))
    return DayUserSeconds(days=sorted(days), users=sorted(users))


def used_uses(connection: Connection, period: Period) -> list[DayUse]:
    """Every stored day, user and model in ``period`` with its seconds of work."""
    c = USAGE_ACTIVE_DAYS.c
    rows = connection.execute(
        select(USAGE_ACTIVE_DAYS)
        .where(c.day.between(period.first, period.last))
        .order_by(c.day, c.user_name, c.model)
    )
    return [DayUse(row.day, row.user_name, row.model, row.gpu_seconds, "used") for row in rows]


# -- given back: what the reclaimer freed ------------------------------------------------
# Each GPU the reclaimer took at ``at`` counts from then to its machine's end, the time the
# machine would otherwise have held it. A machine's end writes its seconds to their days
# (add_given_back); only running machines' are counted when read, up to now.

DayUserModel = tuple[date, str, str]


def add_given_back(connection: Connection, machine: Any, now: datetime, zone: tzinfo) -> None:
    """At ``machine``'s end (``now``): add the GPU-seconds it gave back to their days in
    ``zone``, per user and model. Call it in the transaction that ends it."""
    g = GIVEBACKS.c
    givebacks = connection.execute(
        select(g.at, g.user_name, g.model).where(g.machine_id == machine.id).order_by(g.at, g.id)
    )
    most = gpus_asked(machine.request)
    spans = given_back_spans(
        (machine.id, at, now, most, (user, model)) for at, user, model in givebacks
    )
    seconds = _by_day(spans, zone)
    rows = [
        {"day": day, "user_name": user, "model": model, "gpu_seconds": value}
        for (day, user, model), value in sorted(seconds.items())  # one order: no deadlocks
    ]
    if rows:
        _add(connection, USAGE_GIVEN_BACK_DAYS, rows)


def given_back_uses(
    connection: Connection, period: Period, now: datetime, zone: tzinfo
) -> list[DayUse]:
    """GPU-seconds given back in ``period`` per day, user and model: ended machines' as their
    ends wrote them, running ones' up to ``now``; the days are ``zone``'s."""
    c = USAGE_GIVEN_BACK_DAYS.c
    seconds = _running_given_back(connection, period, now, zone)
    for day, user, model, value in connection.execute(
        select(c.day, c.user_name, c.model, c.gpu_seconds).where(
            c.day.between(period.first, period.last)
        )
    ):
        seconds[day, user, model] += value
    return [
        DayUse(day, user, model, value, "given_back")
        for (day, user, model), value in sorted(seconds.items())
    ]


def given_back_sums(
    connection: Connection, period: Period, now: datetime, zone: tzinfo
) -> DayUserSeconds:
    """The period's GPU-seconds given back per day and per user (see given_back_uses):
    ended machines' summed in the database."""
    ended = _figure_sums(connection, USAGE_GIVEN_BACK_DAYS, period)
    running = _running_given_back(connection, period, now, zone)
    if not running:
        return ended
    days: dict[date, float] = defaultdict(float, ended.days)
    users: dict[str, float] = defaultdict(float, ended.users)
    for (day, user, _), value in running.items():
        days[day] += value
        users[user] += value
    return DayUserSeconds(days=sorted(days.items()), users=sorted(users.items()))


def _running_given_back(
    connection: Connection, period: Period, now: datetime, zone: tzinfo
) -> defaultdict[DayUserModel, float]:
    """Running machines' GPU-seconds given back up to ``now``, per day of ``period``."""
    start = datetime.combine(period.first, time.min, zone).astimezone(UTC)
    end = datetime.combine(period.last + timedelta(days=1), time.min, zone).astimezone(UTC)
    g, m = GIVEBACKS.c, MACHINES.c
    # The live machines first (the partial index on them, its very condition), then their
    # give-backs by machine: a join lets SQLite's planner walk every give-back before
    # ``end`` by its time index instead.
    asked = {
        machine: gpus_asked(request)
        for machine, request in connection.execute(
            select(m.id, m.request).where(text(LIVE_MACHINE_WHERE))
        )
    }
    if not asked:
        return defaultdict(float)
    rows = connection.execute(
        select(g.machine_id, g.at, g.user_name, g.model)
        .where(g.machine_id.in_(sorted(asked)), g.at < end)
        .order_by(g.at, g.id)
    )
    spans = given_back_spans(
        (machine, at, min(now, end), asked[machine], (user, model))
        for machine, at, user, model in rows
    )
    # Days before the period are not counted: not split either.
    seconds = _by_day(
        (
            (max(begin, start), finish, counted)
            for begin, finish, counted in spans
            if finish > start
        ),
        zone,
    )
    return defaultdict(
        float,
        {key: value for key, value in seconds.items() if period.first <= key[0] <= period.last},
    )


def _by_day(
    spans: Iterable[tuple[datetime, datetime, tuple[str, str]]], zone: tzinfo
) -> dict[DayUserModel, float]:
    """Spans of (user, model) split into the seconds of each day in ``zone``."""
    seconds: dict[DayUserModel, float] = defaultdict(float)
    for begin, finish, (user, model) in spans:
        for day, share in day_shares(begin, finish, zone):
            seconds[day, user, model] += share
    return seconds
