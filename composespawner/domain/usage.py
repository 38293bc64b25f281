"""GPU-hours over time: how a period of use splits into days, and the usage report.

Pure: the ledger keeps GPU-seconds per day, user and model (written as each
machine ends), and hands this module the sums for a date range; the portal
shows the report as charts and tables and exports it as CSV.

Three figures, each in GPU-hours:

* **held**: a GPU held by a machine, from when it got it until it gave it up (a share of
  1/n counts 1/n of each second);
* **used**: the seconds the reclaimer saw a held GPU do work (``active_s``; the interval
  up to a reading that saw work, its previous reading in the same unbroken run), counted
  on the day of the reclaimer's pass that saw it. GPUs no reclaimer watches count none,
  so used is at most held only where the reclaimer runs;
* **given back**: a GPU the reclaimer took from a running server at ``at`` counts from
  ``at`` to the end of that machine (now, while it runs): the time it would otherwise
  still have held the GPU. A GPU got again later (``grow``) is held again: held and
  given back then overlap, as given back is what the reclaimer freed, not what stayed free.
  A machine is never counted as giving back more GPUs at once than it started with
  (:func:`given_back_spans`): one that gets a GPU, lets it idle and loses it again and
  again gave back one GPU's time, not one per loss.

A cohort's usage is that of its members (the hub group's users now), so a
user in two cohorts counts in both; the site's total counts everyone once.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from itertools import repeat
from typing import Literal, TypeVar

T = TypeVar("T")

MOST_DAYS = 366  # the longest range one report covers
TOP_USERS = 50  # users listed by name in a report (the CSV has all)


class InvalidPeriod(ValueError):
    """A date range a person asked for that cannot be reported; the message says why."""


@dataclass(frozen=True)
class Period:
    """From ``first`` to ``last``, both days included."""

    first: date
    last: date

    @classmethod
    def parse(
        cls, first: str | None, last: str | None, today: date, default_days: int = 30
    ) -> Period:
        """The range from query parameters ``since`` and ``until`` (``YYYY-MM-DD``).

        Missing ends default to the last ``default_days`` days up to ``today``.
        """
        end = _day(last, "until") if last else today
        try:
            start = _day(first, "since") if first else end - timedelta(days=default_days - 1)
        except OverflowError:
            raise InvalidPeriod(f"until ({end}) is too early: give since as well.") from None
        if start > end:
            raise InvalidPeriod(f"since ({start}) is after until ({end}): swap them.")
        if (end - start).days + 1 > MOST_DAYS:
            raise InvalidPeriod(
                f"{start} to {end} is more than {MOST_DAYS} days: ask for a shorter range."
            )
        return cls(start, end)

    def days(self) -> list[date]:
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]


def _day(text: str, name: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidPeriod(f"{name}: {text!r} is not a date; write it as YYYY-MM-DD.") from None


def day_shares(start: datetime, end: datetime, zone: tzinfo = UTC) -> Iterator[tuple[date, float]]:
    """The seconds of ``start`` to ``end`` that fall on each day in ``zone``."""
    # Elapsed time is measured in UTC: within one zone Python subtracts wall-clock
    # times, and a day the clocks change on is not 24 hours long.
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    while start < end:
        day = start.astimezone(zone).date()
        midnight = datetime.combine(day + timedelta(days=1), datetime.min.time(), zone)
        cut = min(midnight.astimezone(UTC), end)
        yield day, (cut - start).total_seconds()
        start = cut


Figure = Literal["held", "used", "given_back"]
FIGURES: tuple[Figure, ...] = ("held", "used", "given_back")


@dataclass(frozen=True)
class DayUse:
    """GPU-seconds of one user and model on one day: held, used or given back."""

    day: date
    user: str
    model: str
    seconds: float
    figure: Figure = "held"


@dataclass(frozen=True)
class DayUserSeconds:
    """One figure's seconds in a period, summed per day (everyone) and per user (all days):
    what the report needs of it, without a row per day and user."""

    days: list[tuple[date, float]] = field(default_factory=list)
    users: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def of(cls, uses: Iterable[DayUse]) -> DayUserSeconds:
        days: dict[date, float] = defaultdict(float)
        users: dict[str, float] = defaultdict(float)
        for use in uses:
            days[use.day] += use.seconds
            users[use.user] += use.seconds
        return cls(sorted(days.items()), sorted(users.items()))


@dataclass
class UsageReport:
    """GPU-hours in a period: per day and model, and totals per user, cohort and model."""

    period: Period
    by_day: dict[date, dict[str, float]] = field(default_factory=dict)  # day → model → hours
    by_user: dict[str, float] = field(default_factory=dict)
    by_cohort: dict[str, float] = field(default_factory=dict)
    by_model: dict[str, float] = field(default_factory=dict)
    # Used and given back (see the module's docstring): day → hours, cohort → hours.
    used_by_day: dict[date, float] = field(default_factory=dict)
    used_by_cohort: dict[str, float] = field(default_factory=dict)
    used_total: float = 0.0
    given_back_by_day: dict[date, float] = field(default_factory=dict)
    given_back_by_cohort: dict[str, float] = field(default_factory=dict)
    given_back_total: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.by_model.values())

    def held_on(self, day: date) -> float:
        return sum(self.by_day.get(day, {}).values())

    def models(self) -> list[str]:
        return sorted(self.by_model)

    def top_users(self, most: int = TOP_USERS) -> list[tuple[str, float]]:
        # The few largest of thousands: a heap, not a sort of everyone.
        return heapq.nsmallest(most, self.by_user.items(), key=lambda item: (-item[1], item[0]))


def usage_report(
    period: Period,
    days: Iterable[tuple[date, str, float]],
    users: Iterable[tuple[str, float]],
    live: Iterable[DayUse],
    members: Mapping[str, Iterable[str]],
    used: DayUserSeconds | None = None,
    given_back: DayUserSeconds | None = None,
) -> UsageReport:
    """The report for ``period`` from the ledger's sums of ended use (seconds per day
    and model, and per user) and running machines' use so far; ``members``: cohort → users;
    ``used`` and ``given_back``: those figures' seconds (none when not given).
    """
    by_day: dict[date, dict[str, float]] = {day: {} for day in period.days()}
    by_user: dict[str, float] = {user: seconds / 3600 for user, seconds in users}
    by_model: dict[str, float] = defaultdict(float)

    def add_day(day: date, model: str, hours: float) -> None:
        if period.first <= day <= period.last:
            models = by_day[day]
            models[model] = models.get(model, 0.0) + hours
            by_model[model] += hours

    for day, model, seconds in days:
        add_day(day, model, seconds / 3600)
    for use in live:
        if period.first <= use.day <= period.last:
            add_day(use.day, use.model, use.seconds / 3600)
            by_user[use.user] = by_user.get(use.user, 0.0) + use.seconds / 3600
    cohorts = {cohort: set(users) for cohort, users in members.items()}
    by_cohort = _by_cohort(by_user, cohorts)
    used_by_day, used_by_cohort, used_total = _figure(period, used, cohorts)
    back_by_day, back_by_cohort, back_total = _figure(period, given_back, cohorts)
    return UsageReport(
        period,
        by_day,
        dict(by_user),
        by_cohort,
        dict(by_model),
        used_by_day=used_by_day,
        used_by_cohort=used_by_cohort,
        used_total=used_total,
        given_back_by_day=back_by_day,
        given_back_by_cohort=back_by_cohort,
        given_back_total=back_total,
    )


def _by_cohort(by_user: Mapping[str, float], cohorts: Mapping[str, set[str]]) -> dict[str, float]:
    if not by_user:  # a figure no one has (no reclaimer runs): no members to look up
        return dict.fromkeys(cohorts, 0.0)
    # Three figures of 500 cohorts of 20: map's lookups, not a generator's, on every page.
    get = by_user.get
    return {cohort: sum(map(get, users, repeat(0.0)), 0.0) for cohort, users in cohorts.items()}


def _figure(
    period: Period, sums: DayUserSeconds | None, cohorts: Mapping[str, set[str]]
) -> tuple[dict[date, float], dict[str, float], float]:
    """A figure's hours per day of ``period`` (every day, 0 where none), per cohort (its
    members' sums), and in all. The per-user sums are the period's already."""
    by_day = dict.fromkeys(period.days(), 0.0)
    by_user: dict[str, float] = {}
    if sums is not None:
        for day, seconds in sums.days:
            if day in by_day:
                by_day[day] += seconds / 3600
        for user, seconds in sums.users:
            by_user[user] = by_user.get(user, 0.0) + seconds / 3600
    return by_day, _by_cohort(by_user, cohorts), sum(by_day.values())


def given_back_spans(
    givebacks: Iterable[tuple[str, datetime, datetime, int, T]],
) -> list[tuple[datetime, datetime, T]]:
    """The spans of GPU time given back, from ``(machine, at, machine's end, GPUs it
    started with, what to count it under)`` rows: each from its ``at`` to the machine's
    end, but when a machine would be giving back more GPUs at once than it started with,
    the oldest of its spans ends where the new one begins."""
    spans: list[tuple[datetime, datetime, T]] = []
    open_spans: dict[str, list[int]] = defaultdict(list)  # machine → indexes, oldest first
    for machine, at, end, most, payload in sorted(givebacks, key=lambda row: row[1]):
        running = [i for i in open_spans[machine] if spans[i][1] > at]
        while running and len(running) >= max(most, 1):
            oldest = running.pop(0)
            start, _, counted = spans[oldest]
            spans[oldest] = (start, at, counted)
        open_spans[machine] = [*running, len(spans)]
        spans.append((at, max(end, at), payload))
    return spans


def gpus_asked(request: object) -> int:
    """The GPUs a machine's request asked for (its stored JSON): what it started with, the
    most it counts as giving back at once (:func:`given_back_spans`); 1 when it does not say."""
    count = request.get("gpu_count") if isinstance(request, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
