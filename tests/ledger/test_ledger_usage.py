"""GPU-hours per day, user and model: written as machines end, summed for reports."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from composespawner.domain.usage import DayUse, InvalidPeriod, Period, usage_report
from composespawner.ledger import Ledger, migrate
from composespawner.ledger.database import writing
from composespawner.ledger.statements import USAGE
from tests.ledger.support import Clock, MachineMaker, inventory

MODEL = "A100-80GB"
MARCH = Period(date(2025, 3, 1), date(2025, 3, 31))
RECORD = {"user_name": "alice", "server_name": "", "block_id": "gpu-01", "model": MODEL}


def run_until(ledger: Ledger, clock: Clock, machine_id: str, **later: float) -> None:
    clock.advance(**later)
    ledger.transition(machine_id, "stopping", "stop")
    ledger.release(machine_id)


def test_a_machine_across_midnight_counts_on_both_days(
    ledger: Ledger, clock: Clock, machine_in: MachineMaker, gpus: list[str]
) -> None:
    clock.now = datetime(2025, 3, 1, 22, 0, tzinfo=UTC)
    machine = machine_in("running", "alice", blocks=[*gpus[:2], "nic-01"])
    run_until(ledger, clock, machine, hours=4)  # 22:00-02:00, two GPUs; the NIC is no GPU

    sums = ledger.usage_sums(MARCH)

    assert sorted(sums.days) == [
        (date(2025, 3, 1), MODEL, 4 * 3600.0),
        (date(2025, 3, 2), MODEL, 4 * 3600.0),
    ]
    assert sums.users == [("alice", 8 * 3600.0)]
    assert sums.live == []


def test_running_machines_count_until_now_and_ended_ones_add_up(
    ledger: Ledger, clock: Clock, machine_in: MachineMaker, gpus: list[str]
) -> None:
    first = machine_in("running", "alice", blocks=gpus[:1])
    run_until(ledger, clock, first, hours=1)
    second = machine_in("running", "alice", blocks=gpus[:1])
    run_until(ledger, clock, second, hours=2)
    machine_in("running", "bob", blocks=gpus[1:2])
    clock.advance(minutes=30)

    sums = ledger.usage_sums(MARCH)
    report = usage_report(MARCH, sums.days, sums.users, sums.live, {"cs-101": ["alice", "bob"]})

    assert sums.users == [("alice", 3 * 3600.0)]
    assert sums.live == [DayUse(date(2025, 3, 1), "bob", MODEL, 1800.0)]
    assert report.by_user == {"alice": 3.0, "bob": 0.5}
    assert report.by_cohort == {"cs-101": 3.5}
    assert report.by_day[date(2025, 3, 1)] == {MODEL: 3.5}


def test_the_users_sums_are_read_again_once_a_use_ends(
    ledger: Ledger,
    open_ledger: Callable[[], Ledger],
    clock: Clock,
    machine_in: MachineMaker,
    gpus: list[str],
) -> None:
    run_until(ledger, clock, machine_in("running", "alice", blocks=gpus[:1]), hours=1)
    assert ledger.usage_sums(MARCH).users == [("alice", 3600.0)]
    assert ledger.usage_sums(MARCH).users == [("alice", 3600.0)]  # kept
    # Another process (the hub) ends a machine: this ledger's kept sums are stale now.
    other = open_ledger()
    bob = other.request_machine("bob", "", {})
    other.claim(bob, host_id="host-2", zone="rack-1", block_ids=gpus[1:2])
    clock.advance(hours=2)
    other.transition(bob, "stopping", "stop")
    other.release(bob)
    assert sorted(ledger.usage_sums(MARCH).users) == [("alice", 3600.0), ("bob", 7200.0)]


def test_uses_ending_on_the_periods_last_day_and_before_it_are_each_counted_once(
    ledger: Ledger,
    open_ledger: Callable[[], Ledger],
    clock: Clock,
    machine_in: MachineMaker,
    gpus: list[str],
) -> None:
    week = Period(date(2025, 2, 24), date(2025, 3, 2))  # it ends tomorrow
    hub = open_ledger()  # another process ends the machines
    run_until(hub, clock, machine_in("running", "alice", blocks=gpus[:1]), hours=1)  # 10:00
    carol = machine_in("running", "carol", blocks=gpus[2:3])
    assert ledger.usage_sums(week).users == [("alice", 3600.0)]

    clock.advance(hours=15)  # 2025-03-02 01:00, the period's last day
    run_until(hub, clock, machine_in("running", "alice", blocks=gpus[:1]), hours=2)
    # Only the last day changed: it alone is read again, and added once.
    assert ledger.usage_sums(week).users == [("alice", 3 * 3600.0)]
    run_until(hub, clock, machine_in("running", "bob", blocks=gpus[1:2]), hours=1)
    run_until(hub, clock, machine_in("running", "alice", blocks=gpus[:1]), hours=1)
    assert sorted(ledger.usage_sums(week).users) == [("alice", 4 * 3600.0), ("bob", 3600.0)]

    run_until(hub, clock, carol, hours=0)  # since 10:00 yesterday: 14 h then, 5 h today
    assert sorted(ledger.usage_sums(week).users) == [
        ("alice", 4 * 3600.0),
        ("bob", 3600.0),
        ("carol", 19 * 3600.0),
    ]


def test_days_begin_in_the_sites_time_zone(
    migrated_url: str, clock: Clock, gpus: list[str]
) -> None:
    ledger = Ledger(migrated_url, clock=clock, usage_zone=ZoneInfo("Asia/Tokyo"))
    try:
        ledger.sync_devices(inventory())
        clock.now = datetime(2025, 3, 1, 14, 0, tzinfo=UTC)  # 23:00 in Tokyo
        machine = ledger.request_machine("alice", "", {})
        ledger.claim(machine, host_id="host-1", zone="rack-1", block_ids=gpus[:1])
        run_until(ledger, clock, machine, hours=2)

        assert sorted(ledger.usage_sums(MARCH).days) == [
            (date(2025, 3, 1), MODEL, 3600.0),
            (date(2025, 3, 2), MODEL, 3600.0),
        ]
    finally:
        ledger.close()


def test_a_range_outside_the_use_reports_nothing(
    ledger: Ledger, clock: Clock, machine_in: MachineMaker, gpus: list[str]
) -> None:
    machine = machine_in("running", "alice", blocks=gpus[:1])
    run_until(ledger, clock, machine, hours=1)
    april = Period(date(2025, 4, 1), date(2025, 4, 30))
    sums = ledger.usage_sums(april)
    assert (sums.days, sums.users, sums.live) == ([], [], [])


def test_the_upgrade_fills_days_from_the_usage_records(db_url: str, clock: Clock) -> None:
    ledger = Ledger(db_url, clock=clock)
    try:
        with writing(ledger.engine).begin() as connection:
            migrate.upgrade(connection, "0004")
        machine = ledger.request_machine("alice", "", {})
        # What 0004's code wrote as a machine ended: a usage record, no per-day row.
        started = datetime(2025, 3, 1, 23, 0, tzinfo=UTC)
        with ledger.engine.begin() as connection:
            connection.execute(
                sa.insert(USAGE),
                [
                    {
                        **RECORD,
                        "machine_id": machine,
                        "kind": kind,
                        "started_at": started,
                        "ended_at": started + timedelta(hours=2),
                    }
                    for kind in ("gpu", "nic")
                ],
            )

        ledger.upgrade()

        sums = ledger.usage_sums(MARCH)
        assert sorted(sums.days) == [
            (date(2025, 3, 1), MODEL, 3600.0),
            (date(2025, 3, 2), MODEL, 3600.0),
        ]
        assert sums.users == [("alice", 7200.0)]
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        ("2025-03-10", "2025-03-01", "after until"),
        ("yesterday", None, "not a date"),
        ("2024-01-01", "2025-03-01", "more than 366 days"),
    ],
)
def test_a_bad_range_is_refused_with_what_to_do(
    since: str, until: str | None, message: str
) -> None:
    with pytest.raises(InvalidPeriod, match=message):
        Period.parse(since, until, today=date(2025, 3, 31))
