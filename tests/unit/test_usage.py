"""How periods of use split into days, and what a usage report sums."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from composespawner.domain.usage import (
    DayUse,
    DayUserSeconds,
    InvalidPeriod,
    Period,
    day_shares,
    given_back_spans,
    usage_report,
)

BERLIN = ZoneInfo("Europe/Berlin")


def test_a_period_within_one_day_is_one_share() -> None:
    start = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert list(day_shares(start, start.replace(hour=11))) == [(date(2026, 3, 2), 7200.0)]


def test_an_empty_or_backward_period_has_no_share() -> None:
    start = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert list(day_shares(start, start)) == []
    assert list(day_shares(start, start.replace(hour=8))) == []


def test_a_day_with_a_clock_change_has_its_real_length() -> None:
    # Berlin's clocks go forward on 29 March 2026: that day has 23 hours.
    start = datetime(2026, 3, 29, 0, 0, tzinfo=BERLIN)
    end = datetime(2026, 3, 30, 0, 0, tzinfo=BERLIN)
    assert list(day_shares(start, end, BERLIN)) == [(date(2026, 3, 29), 23 * 3600.0)]


def test_the_default_range_is_the_last_thirty_days() -> None:
    period = Period.parse(None, None, today=date(2026, 3, 31))
    assert (period.first, period.last) == (date(2026, 3, 2), date(2026, 3, 31))
    assert len(period.days()) == 30


def test_a_report_has_every_day_of_its_range_and_ranks_users() -> None:
    period = Period(date(2026, 3, 1), date(2026, 3, 3))
    report = usage_report(
        period,
        days=[(date(2026, 3, 1), "t4", 7200.0), (date(2026, 3, 3), "a100", 3600.0)],
        users=[("bob", 3600.0), ("alice", 7200.0)],
        live=[
            DayUse(date(2026, 3, 3), "carol", "a100", 3600.0),
            DayUse(date(2026, 2, 28), "carol", "a100", 3600.0),  # before the range
        ],
        members={"cs-101": ["alice", "carol", "alice"], "empty": []},
    )
    assert report.by_day == {
        date(2026, 3, 1): {"t4": 2.0},
        date(2026, 3, 2): {},
        date(2026, 3, 3): {"a100": 2.0},
    }
    assert report.by_model == {"t4": 2.0, "a100": 2.0}
    assert report.top_users() == [("alice", 2.0), ("bob", 1.0), ("carol", 1.0)]
    assert report.by_cohort == {"cs-101": 3.0, "empty": 0.0}
    assert report.total == 4.0
    assert report.models() == ["a100", "t4"]


def test_used_and_given_back_are_per_day_and_per_cohort_its_members_sums() -> None:
    period = Period(date(2026, 3, 1), date(2026, 3, 2))
    given_back = DayUserSeconds.of(
        [
            DayUse(date(2026, 3, 1), "alice", "t4", 1800.0, "given_back"),
            DayUse(date(2026, 3, 2), "alice", "a100", 3600.0, "given_back"),
            DayUse(date(2026, 3, 2), "bob", "t4", 7200.0, "given_back"),
        ]
    )
    report = usage_report(
        period,
        days=[(date(2026, 3, 1), "t4", 7200.0)],
        users=[("alice", 7200.0)],
        live=[],
        members={"cs-101": ["alice", "bob", "alice"], "ml": ["bob"], "empty": []},
        used=DayUserSeconds([(date(2026, 3, 1), 3600.0)], [("alice", 2700.0), ("bob", 900.0)]),
        given_back=given_back,
    )
    assert given_back.users == [("alice", 5400.0), ("bob", 7200.0)]
    assert report.used_by_day == {date(2026, 3, 1): 1.0, date(2026, 3, 2): 0.0}
    assert report.used_by_cohort == {"cs-101": 1.0, "ml": 0.25, "empty": 0.0}
    assert report.used_total == 1.0
    assert report.given_back_by_day == {date(2026, 3, 1): 0.5, date(2026, 3, 2): 3.0}
    assert report.given_back_by_cohort == {"cs-101": 3.5, "ml": 2.0, "empty": 0.0}
    assert report.given_back_total == 3.5
    assert report.held_on(date(2026, 3, 1)) == report.total == 2.0


def test_a_report_without_used_or_given_back_counts_none_of_them() -> None:
    period = Period(date(2026, 3, 1), date(2026, 3, 1))
    report = usage_report(period, [], [], [], {"cs-101": ["alice"]})
    assert report.used_by_day == report.given_back_by_day == {date(2026, 3, 1): 0.0}
    assert report.used_by_cohort == report.given_back_by_cohort == {"cs-101": 0.0}
    assert report.used_total == report.given_back_total == 0.0


def test_a_range_before_the_calendar_begins_is_refused() -> None:
    with pytest.raises(InvalidPeriod, match="too early"):
        Period.parse(None, "0001-01-01", today=date(2026, 3, 31))


def test_a_machine_gives_back_no_more_gpus_at_once_than_it_started_with() -> None:
    day = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

    def at(minutes: int) -> datetime:
        return day + timedelta(minutes=minutes)

    end = at(480)
    spans = given_back_spans(
        [
            # One GPU, got again and lost again every 20 minutes: one GPU's time given back.
            ("m1", at(10), end, 1, "ada"),
            ("m1", at(30), end, 1, "ada"),
            ("m1", at(50), end, 1, "ada"),
            # Two GPUs given back one after the other: both count to the end.
            ("m2", at(10), end, 2, "bob"),
            ("m2", at(40), end, 2, "bob"),
            # A machine that ended before a later row's time: nothing negative.
            ("m3", at(60), at(30), 1, "cy"),
        ]
    )

    assert sorted(spans, key=lambda s: (s[2], s[0])) == [
        (at(10), at(30), "ada"),
        (at(30), at(50), "ada"),
        (at(50), end, "ada"),
        (at(10), end, "bob"),
        (at(40), end, "bob"),
        (at(60), at(60), "cy"),
    ]
    ada = sum((b - a).total_seconds() for a, b, who in spans if who == "ada")
    assert ada == (end - at(10)).total_seconds()  # at most one GPU at a time
