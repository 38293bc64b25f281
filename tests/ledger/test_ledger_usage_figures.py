"""The usage page's *used* and *given back* GPU-hours as the ledger keeps them: seconds of
work added by the reclaimer's passes to their day, GPUs given back counted to their
machine's end (written to their days as it ends). On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from composespawner.domain.reclaim import Decision, GpuWatch
from composespawner.domain.usage import DayUse, DayUserSeconds, Period, UsageReport, usage_report
from composespawner.ledger import Ledger, migrate
from composespawner.ledger import usage_sums as usage_sums_module
from composespawner.ledger.database import writing
from composespawner.ledger.usage_sums import (
    GIVEBACKS,
    MACHINES,
    USAGE_GIVEN_BACK_DAYS,
    add_used,
    used_sums,
)

from .support import Clock, MachineMaker, inventory
from .test_ledger_shares import claim_share

MODEL = "A100-80GB"
MARCH = Period(date(2025, 3, 1), date(2025, 3, 31))
FIRST, SECOND = date(2025, 3, 1), date(2025, 3, 2)
WATCH = GpuWatch(since=0.0, last_at=0.0)  # what it says does not matter here
DETACH = Decision("detach", "nothing held it for 700 s", {"unheld_s": 700.0})


@pytest.fixture
def alice(machine_in: MachineMaker, gpus: list[str]) -> str:
    """alice's server 'lab', running on the first two GPUs."""
    return machine_in("running", "alice", "lab", gpus[:2])


def test_work_counts_on_the_day_of_the_pass_that_saw_it_across_midnight(
    ledger: Ledger, clock: Clock, alice: str, machine_in: MachineMaker, gpus: list[str]
) -> None:
    bob = machine_in("running", "bob", "", gpus[2:3])
    watches = {(alice, gpus[0]): WATCH, (alice, gpus[1]): WATCH, (bob, gpus[2]): WATCH}
    clock.now = datetime(2025, 3, 1, 23, 59, 45, tzinfo=UTC)
    ledger.reclaims.save_watches(watches, {(alice, gpus[0]): 15.0, (alice, gpus[1]): 15.0})
    clock.advance(seconds=30)  # the next pass is on the 2nd
    ledger.reclaims.save_watches(watches, {(alice, gpus[0]): 30.0, (bob, gpus[2]): 30.0})
    ledger.reclaims.save_watches(watches, {(alice, gpus[0]): 30.0})

    sums = ledger.usage_sums(MARCH)

    assert sums.used == DayUserSeconds(
        days=[(FIRST, 30.0), (SECOND, 90.0)], users=[("alice", 90.0), ("bob", 30.0)]
    )
    assert ledger.reclaims.usage_figures(MARCH) == [
        DayUse(FIRST, "alice", MODEL, 30.0, "used"),
        DayUse(SECOND, "alice", MODEL, 60.0, "used"),
        DayUse(SECOND, "bob", MODEL, 30.0, "used"),
    ]
    assert used_sums_of(ledger, Period(SECOND, SECOND)).days == [(SECOND, 90.0)]


def used_sums_of(ledger: Ledger, period: Period) -> DayUserSeconds:
    with ledger.engine.begin() as connection:
        return used_sums(connection, period)


def test_work_on_a_gpu_no_longer_held_is_not_counted(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str]
) -> None:
    ledger.give_back(alice, [gpus[1]], "alice shrank her server")
    watches = {(alice, gpus[0]): WATCH, (alice, gpus[1]): WATCH}
    ledger.reclaims.save_watches(watches, {(alice, gpus[0]): 10.0, (alice, gpus[1]): 20.0})

    assert ledger.usage_sums(MARCH).used == DayUserSeconds([(FIRST, 10.0)], [("alice", 10.0)])


def test_work_on_a_share_counts_its_fraction_as_holding_it_does(
    ledger: Ledger, gpus: list[str]
) -> None:
    quarter = claim_share(ledger, "carol", gpus[0], size=4)
    ledger.reclaims.save_watches({(quarter.id, gpus[0]): WATCH}, {(quarter.id, gpus[0]): 40.0})

    assert ledger.usage_sums(MARCH).used.users == [("carol", 10.0)]


def test_work_counts_on_the_sites_day(ledger: Ledger, alice: str, gpus: list[str]) -> None:
    late = datetime(2025, 3, 1, 23, 30, tzinfo=UTC)  # 00:30 on the 2nd in Berlin
    with ledger.engine.begin() as connection:
        add_used(connection, {(alice, gpus[0]): 12.0}, late, ZoneInfo("Europe/Berlin"))
        add_used(connection, {(alice, gpus[0]): 0.0, ("no-such-machine", gpus[0]): 5.0}, late, UTC)

    assert used_sums_of(ledger, MARCH) == DayUserSeconds([(SECOND, 12.0)], [("alice", 12.0)])


def test_a_gpu_given_back_counts_until_its_machine_ends_across_midnight(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str]
) -> None:
    clock.now = datetime(2025, 3, 1, 22, 0, tzinfo=UTC)
    ledger.give_back(alice, [gpus[0]], "the reclaimer detached it")
    ledger.reclaims.gave_back(alice, gpus[0], DETACH, "reclaimer")
    clock.advance(hours=3)  # 01:00 on the 2nd, still running: counted until now

    assert ledger.usage_sums(MARCH).given_back == DayUserSeconds(
        days=[(FIRST, 7200.0), (SECOND, 3600.0)], users=[("alice", 10800.0)]
    )
    clock.advance(hours=1)
    ledger.transition(alice, "stopping", "stop")
    ledger.release(alice)
    clock.advance(hours=5)  # after its end: nothing more

    sums = ledger.usage_sums(MARCH)

    assert sums.given_back == DayUserSeconds(
        days=[(FIRST, 7200.0), (SECOND, 7200.0)], users=[("alice", 14400.0)]
    )
    assert ledger.reclaims.usage_figures(Period(SECOND, SECOND)) == [
        DayUse(SECOND, "alice", MODEL, 7200.0, "given_back")
    ]
    report = usage_report(
        MARCH, sums.days, sums.users, sums.live, {"cs-101": ["alice"], "other": ["bob"]},
        used=sums.used, given_back=sums.given_back,
    )  # fmt: skip
    assert report.given_back_by_day[FIRST] == report.given_back_by_day[SECOND] == 2.0
    assert report.given_back_by_cohort == {"cs-101": 4.0, "other": 0.0}
    assert report.given_back_total == 4.0


def test_a_machines_end_writes_what_it_gave_back_to_its_days_and_the_report_stays_the_same(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str]
) -> None:
    clock.now = datetime(2025, 3, 1, 22, 0, tzinfo=UTC)
    ledger.reclaims.gave_back(alice, gpus[0], DETACH, "reclaimer")
    clock.advance(hours=1)  # it asked for no gpu_count: one GPU given back at a time
    ledger.reclaims.gave_back(alice, gpus[1], DETACH, "reclaimer")
    clock.advance(hours=2)  # 01:00 on the 2nd
    running = report_of(ledger, MARCH), ledger.reclaims.usage_figures(MARCH)
    assert given_back_days(ledger) == []  # a running machine's are counted when read

    ledger.transition(alice, "stopping", "stop")
    ledger.release(alice)

    assert given_back_days(ledger) == [
        (FIRST, "alice", MODEL, 7200.0),
        (SECOND, "alice", MODEL, 3600.0),
    ]
    assert (report_of(ledger, MARCH), ledger.reclaims.usage_figures(MARCH)) == running
    assert running[0].given_back_by_day[FIRST] == 2.0
    clock.advance(hours=5)  # after its end: nothing more
    assert (report_of(ledger, MARCH), ledger.reclaims.usage_figures(MARCH)) == running
    assert ledger.usage_sums(Period(SECOND, SECOND)).given_back == DayUserSeconds(
        [(SECOND, 3600.0)], [("alice", 3600.0)]
    )


def report_of(ledger: Ledger, period: Period) -> UsageReport:
    sums = ledger.usage_sums(period)
    return usage_report(
        period, sums.days, sums.users, sums.live, {"cs-101": ["alice"]},
        used=sums.used, given_back=sums.given_back,
    )  # fmt: skip


def given_back_days(ledger: Ledger) -> list[tuple[date, str, str, float]]:
    with ledger.engine.begin() as connection:
        rows = connection.execute(sa.select(USAGE_GIVEN_BACK_DAYS).order_by("day", "user_name"))
        return [tuple(row) for row in rows]


def test_a_machine_ending_without_gpus_still_writes_what_it_gave_back(
    ledger: Ledger, clock: Clock, machine_in: MachineMaker, gpus: list[str]
) -> None:
    bob = machine_in("running", "bob", "", gpus[2:3])
    ledger.give_back(bob, [gpus[2]], "the reclaimer detached it")
    ledger.reclaims.gave_back(bob, gpus[2], DETACH, "reclaimer")
    clock.advance(minutes=30)

    ledger.transition(bob, "stopping", "stop")
    ledger.release(bob)

    assert given_back_days(ledger) == [(FIRST, "bob", MODEL, 1800.0)]


@pytest.mark.parametrize(
    ("zone", "written", "days"),
    [
        (
            "UTC",
            [(FIRST, "alice", MODEL, 3600.0), (SECOND, "alice", MODEL, 2 * 3600.0)],
            [(FIRST, 2 * 3600.0), (SECOND, 4 * 3600.0)],
        ),
        # The site's days, as the page split them when it read the give-backs: in Tokyo
        # everything here is on the 2nd.
        ("Asia/Tokyo", [(SECOND, "alice", MODEL, 3 * 3600.0)], [(SECOND, 6 * 3600.0)]),
    ],
)
def test_the_upgrade_fills_the_days_given_back_by_machines_already_ended(
    db_url: str,
    clock: Clock,
    zone: str,
    written: list[tuple[date, str, str, float]],
    days: list[tuple[date, float]],
) -> None:
    ledger = Ledger(db_url, clock=clock, usage_zone=ZoneInfo(zone))
    try:
        with writing(ledger.engine).begin() as connection:
            migrate.upgrade(connection, "0014")
        ended = ledger.request_machine("alice", "", {"gpu_count": 2})
        running = ledger.request_machine("bob", "", {})
        at = datetime(2025, 3, 1, 23, 0, tzinfo=UTC)
        # What 0014's code left: give-back rows, and the end of alice's machine.
        with ledger.engine.begin() as connection:
            connection.execute(
                sa.insert(GIVEBACKS),
                [
                    giveback_row(ended, "alice", "gpu-1", at),
                    giveback_row(ended, "alice", "gpu-2", at + timedelta(hours=1)),
                    giveback_row(running, "bob", "gpu-3", at),
                ],
            )
            connection.execute(
                sa.update(MACHINES)
                .where(MACHINES.c.id == ended)
                .values(state="released", ended_at=at + timedelta(hours=2))
            )
        clock.now = at + timedelta(hours=3)

        ledger.upgrade()

        assert given_back_days(ledger) == written
        assert ledger.usage_sums(MARCH).given_back == DayUserSeconds(
            days=days, users=[("alice", 3 * 3600.0), ("bob", 3 * 3600.0)]
        )
    finally:
        ledger.close()


def giveback_row(machine: str, user: str, block: str, at: datetime) -> dict[str, object]:
    return {
        "machine_id": machine,
        "user_name": user,
        "server_name": "",
        "block_id": block,
        "model": MODEL,
        "action": "detach",
        "at": at,
        "figures": {},
        "actor": "reclaimer",
    }


def test_a_gpu_given_back_before_the_period_counts_from_its_first_day(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str]
) -> None:
    clock.now = datetime(2025, 2, 28, 23, 0, tzinfo=UTC)
    ledger.reclaims.gave_back(alice, gpus[0], DETACH, "reclaimer")
    clock.now = datetime(2025, 3, 1, 2, 0, tzinfo=UTC)

    assert ledger.usage_sums(MARCH).given_back.days == [(FIRST, 7200.0)]
    assert ledger.usage_sums(Period(SECOND, SECOND)).given_back == DayUserSeconds()


@contextmanager
def in_tokyo(url: str, clock: Clock, gpus: list[str]) -> Iterator[tuple[Ledger, str]]:
    """A ledger whose days are Tokyo's, and alice's machine holding the first GPU."""
    ledger = Ledger(url, clock=clock, usage_zone=ZoneInfo("Asia/Tokyo"))
    try:
        ledger.sync_devices(inventory())
        machine = ledger.request_machine("alice", "", {})
        ledger.claim(machine, host_id="host-1", zone="rack-1", block_ids=gpus[:1])
        yield ledger, machine
    finally:
        ledger.close()


def test_the_ledgers_zone_is_the_days_of_work(
    migrated_url: str, clock: Clock, gpus: list[str]
) -> None:
    with in_tokyo(migrated_url, clock, gpus) as (ledger, machine):
        clock.now = datetime(2025, 3, 1, 15, 30, tzinfo=UTC)  # 00:30 on the 2nd in Tokyo
        ledger.reclaims.save_watches({(machine, gpus[0]): WATCH}, {(machine, gpus[0]): 9.0})

        assert ledger.usage_sums(MARCH).used.days == [(SECOND, 9.0)]


def test_a_machines_end_writes_its_given_back_days_in_the_ledgers_zone(
    migrated_url: str, clock: Clock, gpus: list[str]
) -> None:
    with in_tokyo(migrated_url, clock, gpus) as (ledger, machine):
        for state in ("composed", "launching", "running"):
            ledger.transition(machine, state, state)
        clock.now = datetime(2025, 3, 1, 14, 0, tzinfo=UTC)  # 23:00 on the 1st in Tokyo
        ledger.reclaims.gave_back(machine, gpus[0], DETACH, "reclaimer")
        clock.advance(hours=2)  # 01:00 on the 2nd in Tokyo, still the 1st in UTC
        ledger.transition(machine, "stopping", "stop")
        ledger.release(machine)

        assert given_back_days(ledger) == [
            (FIRST, "alice", MODEL, 3600.0),
            (SECOND, "alice", MODEL, 3600.0),
        ]


def test_a_machine_ending_while_the_report_is_read_is_counted_once(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ended machines' days are read, then the running machines: alice's ends between
    # the two. One snapshot for the whole read (REPEATABLE READ on PostgreSQL) still
    # sees her running, so her hours are counted once, not lost (nor, the other way
    # round, counted twice).
    clock.now = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    ledger.reclaims.gave_back(alice, gpus[0], DETACH, "reclaimer")
    clock.advance(hours=1)
    reading = usage_sums_module._running_given_back

    def alice_stops_meanwhile(*args: object, **kwargs: object) -> object:
        ledger.transition(alice, "stopping", "stop")
        ledger.release(alice)
        return reading(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(usage_sums_module, "_running_given_back", alice_stops_meanwhile)

    given = ledger.usage_sums(MARCH).given_back

    assert given == DayUserSeconds([(FIRST, 3600.0)], [("alice", 3600.0)])
    assert given_back_days(ledger) == [(FIRST, "alice", MODEL, 3600.0)]  # it did end


def test_a_give_back_recorded_after_its_machines_end_counts_from_the_end(
    ledger: Ledger, clock: Clock, alice: str, gpus: list[str]
) -> None:
    # The reclaimer's shrink went through, then the server stopped before the give-back
    # was recorded (its clock a second behind the hub's): the end already wrote the
    # machine's days, so the record counts from the end (nothing), and every figure
    # agrees with the days written.
    clock.now = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    ledger.transition(alice, "stopping", "stop")
    ledger.release(alice)
    ended = report_of(ledger, MARCH), ledger.reclaims.usage_figures(MARCH)
    clock.now = datetime(2025, 3, 1, 9, 59, 59, tzinfo=UTC)

    ledger.reclaims.gave_back(alice, gpus[0], DETACH, "reclaimer")

    [record] = ledger.reclaims.givebacks(
        datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 3, 2, tzinfo=UTC)
    )
    assert record.at == datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
    assert (report_of(ledger, MARCH), ledger.reclaims.usage_figures(MARCH)) == ended
    assert given_back_days(ledger) == []
