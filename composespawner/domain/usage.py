"""GPU-hours over time: how a period of use splits into days, and the usage report.

Pure: the ledger keeps GPU-seconds per day, user and model (written as each
machine ends), and hands this module the sums for a date range; the portal
shows the report as charts and tables and exports it as CSV.

A cohort's usage is that of its members (the hub group's users now), so a
user in two cohorts counts in both; the site's total counts everyone once.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo

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


@dataclass(frozen=True)
class DayUse:
    """GPU-seconds one user used of one model on one day."""

    day: date
    user: str
    model: str
    seconds: float


@dataclass
class UsageReport:
    """GPU-hours in a period: per day and model, and totals per user, cohort and model."""

    period: Period
    by_day: dict[date, dict[str, float]] = field(default_factory=dict)  # day → model → hours
    by_user: dict[str, float] = field(default_factory=dict)
    by_cohort: dict[str, float] = field(default_factory=dict)
    by_model: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.by_model.values())

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
) -> UsageReport:
    """The report for ``period`` from the ledger's sums of ended use (seconds per day
    and model, and per user) and running machines' use so far; ``members``: cohort → users.
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
    by_cohort = {
        cohort: sum(by_user.get(user, 0.0) for user in set(users))
        for cohort, users in members.items()
    }
    return UsageReport(period, by_day, dict(by_user), by_cohort, dict(by_model))
