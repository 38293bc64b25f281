"""The ledger's memory of idle GPUs (``ledger.reclaims``): the reclaimer's watches, Keep
presses, GPUs given back and cohorts' reclaim policies. On SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
import sqlalchemy as sa

from composespawner.domain.cohorts import Cohort
from composespawner.domain.reclaim import (
    SITE_DEFAULT,
    Decision,
    GpuWatch,
    KeepRefused,
    ReclaimPolicy,
    record_warning,
)
from composespawner.ledger import Actor, GiveBack, Ledger, UnknownDevices

from .support import Clock, MachineMaker
from .test_ledger_shares import claim_share, run

NOW = 1_750_000_000.0  # the reclaimer's clock: epoch seconds
WATCH = GpuWatch(
    since=NOW - 300,
    last_at=NOW,
    last_work_at=NOW - 200,
    last_held_at=NOW - 100,
    utilization=0.5,
    memory_used_mib=600.0,
    warned_at=NOW - 50,
    kept_until=None,
    keeps_used=0,
)
DETACH = Decision("detach", "nothing held it for 700 s", {"unheld_s": 700.0, "idle_s": 700.0})


@pytest.fixture
def running(machine_in: MachineMaker, gpus: list[str]) -> str:
    """alice's server 'lab', running on the first two GPUs."""
    return machine_in("running", "alice", "lab", gpus[:2])


def active_s(ledger: Ledger) -> dict[tuple[str, str], float]:
    """Every stored row's active seconds, held or not."""
    with ledger.engine.begin() as connection:
        rows = connection.execute(sa.text("SELECT machine_id, block_id, active_s FROM gpu_watches"))
        return {(m, b): s for m, b, s in rows}


def test_watches_round_trip_every_field(ledger: Ledger, running: str, gpus: list[str]) -> None:
    assert ledger.reclaims.watches() == {}
    second = replace(WATCH, since=None, last_work_at=None, warned_at=None, kept_until=NOW + 9)
    ledger.reclaims.save_watches({(running, gpus[0]): WATCH, (running, gpus[1]): second})
    assert ledger.reclaims.watches() == {(running, gpus[0]): WATCH, (running, gpus[1]): second}

    later = replace(WATCH, last_at=NOW + 15, utilization=80.0, last_work_at=NOW + 15)
    ledger.reclaims.save_watches({(running, gpus[0]): later})
    assert ledger.reclaims.watches()[(running, gpus[0])] == later


def test_holders_round_trip_and_unknown_is_sql_null(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    named = replace(WATCH, holders=("kernel:3f2b", "pid:77"))
    nobody = replace(WATCH, holders=())
    ledger.reclaims.save_watches({(running, gpus[0]): named, (running, gpus[1]): nobody})
    assert ledger.reclaims.watches() == {(running, gpus[0]): named, (running, gpus[1]): nobody}
    # A Keep leaves the holders as the reclaimer read them; an unknown reading clears them.
    kept = ledger.reclaims.keep("alice", "lab", gpus[0], SITE_DEFAULT, NOW + 10)
    assert kept.holders == named.holders
    ledger.reclaims.save_watches({(running, gpus[0]): replace(kept, holders=None)})
    assert ledger.reclaims.watches()[(running, gpus[0])].holders is None
    with ledger.engine.begin() as connection:
        rows = connection.execute(
            sa.text("SELECT block_id FROM gpu_watches WHERE holders IS NULL")
        ).scalars()
        assert list(rows) == [gpus[0]]  # SQL NULL, not JSON null: unknown, as before 0016


def test_active_seconds_add_up_over_passes(ledger: Ledger, running: str, gpus: list[str]) -> None:
    key, other = (running, gpus[0]), (running, gpus[1])
    ledger.reclaims.save_watches({key: WATCH, other: WATCH}, {key: 15.0})
    ledger.reclaims.save_watches({key: WATCH, other: WATCH}, {key: 14.5, other: 3.0})
    ledger.reclaims.save_watches({key: WATCH})
    assert active_s(ledger) == {key: 29.5, other: 3.0}


def test_active_seconds_need_a_watch(ledger: Ledger, running: str, gpus: list[str]) -> None:
    with pytest.raises(ValueError, match="without a watch"):
        ledger.reclaims.save_watches({}, {(running, gpus[0]): 1.0})
    assert active_s(ledger) == {}


def test_keep_by_the_holder_holds_off_and_withdraws_the_warning(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    ledger.reclaims.save_watches({(running, gpus[0]): WATCH})
    kept = ledger.reclaims.keep("alice", "lab", gpus[0], SITE_DEFAULT, NOW + 10)
    assert kept == replace(
        WATCH, kept_until=NOW + 10 + SITE_DEFAULT.keep_for, keeps_used=1, warned_at=None
    )
    assert ledger.reclaims.watches()[(running, gpus[0])] == kept


def test_keep_on_a_gpu_never_watched_starts_a_watch(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    kept = ledger.reclaims.keep("alice", "lab", gpus[1], SITE_DEFAULT, NOW)
    # Nothing was read yet: the watch knows no run (unknown is not idle).
    assert kept == GpuWatch(
        since=None, last_at=NOW, kept_until=NOW + SITE_DEFAULT.keep_for, keeps_used=1
    )
    assert ledger.reclaims.watches() == {(running, gpus[1]): kept}


def test_keep_of_a_share_by_its_holder(ledger: Ledger, gpus: list[str]) -> None:
    machine = claim_share(ledger, "student", gpus[3], server="course")
    run(ledger, machine.id)
    kept = ledger.reclaims.keep("student", "course", gpus[3], SITE_DEFAULT, NOW)
    assert ledger.reclaims.watches() == {(machine.id, gpus[3]): kept}


def test_keep_of_a_gpu_the_user_does_not_hold_is_not_found(
    ledger: Ledger, running: str, machine_in: MachineMaker, gpus: list[str]
) -> None:
    machine_in("running", "bob", "lab", gpus[2:3])
    refusals = []
    for user, server, gpu in [
        ("bob", "lab", gpus[0]),  # alice's GPU
        ("bob", "lab", gpus[5]),  # a free GPU
        ("alice", "lab", gpus[2]),  # bob's GPU, from alice's server
        ("alice", "other", gpus[0]),  # a server alice does not run
        ("alice", "lab", "gpu-99"),  # no such GPU
    ]:
        with pytest.raises(UnknownDevices) as refused:
            ledger.reclaims.keep(user, server, gpu, SITE_DEFAULT, NOW)
        refusals.append(str(refused.value).replace(gpu, "GPU"))
    # Someone else's GPU answers exactly as one that does not exist.
    assert set(refusals) == {"unknown devices: GPU"}
    assert ledger.reclaims.watches() == {}


def test_keep_past_the_policys_presses_is_refused(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    twice = ReclaimPolicy(keeps_allowed=2)
    for n in range(2):
        ledger.reclaims.keep("alice", "lab", gpus[0], twice, NOW + n)
    with pytest.raises(KeepRefused, match=r"2 times"):
        ledger.reclaims.keep("alice", "lab", gpus[0], twice, NOW + 2)
    assert ledger.reclaims.watches()[(running, gpus[0])].keeps_used == 2
    with pytest.raises(KeepRefused, match="turned off"):
        ledger.reclaims.keep("alice", "lab", gpus[1], ReclaimPolicy(keeps_allowed=0), NOW)
    assert (running, gpus[1]) not in ledger.reclaims.watches()


def test_a_keep_since_the_reclaimer_read_wins_over_its_save(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    key = (running, gpus[0])
    ledger.reclaims.save_watches({key: replace(WATCH, warned_at=None)})
    read = ledger.reclaims.watches()[key]  # the reclaimer reads...
    kept = ledger.reclaims.keep("alice", "lab", gpus[0], SITE_DEFAULT, NOW + 5)  # ...alice keeps
    # ...and the reclaimer, which had decided to warn, stores its new reading and warning.
    stale = record_warning(replace(read, last_at=NOW + 15, utilization=0.0), NOW + 15)
    ledger.reclaims.save_watches({key: stale})
    stored = ledger.reclaims.watches()[key]
    assert stored == replace(stale, warned_at=None, kept_until=kept.kept_until, keeps_used=1)

    # A reclaimer that read the keep stores its fields as they are.
    fresh = replace(stored, last_at=NOW + 30, warned_at=NOW + 30)
    ledger.reclaims.save_watches({key: fresh})
    assert ledger.reclaims.watches()[key] == fresh


def test_gave_back_records_it_audits_it_and_forgets_the_watch(
    ledger: Ledger, clock: Clock, gpus: list[str]
) -> None:
    machine_id = ledger.request_machine("alice", "lab", {})
    ledger.claim(machine_id, host_id="h", zone="rack-1", block_ids=gpus[:2], cohort="cs-101")
    run(ledger, machine_id)
    key = (machine_id, gpus[0])
    ledger.reclaims.save_watches({key: WATCH, (machine_id, gpus[1]): WATCH}, {key: 42.0})
    ledger.give_back(machine_id, [gpus[0]], "the reclaimer detached it")  # the shrink's step

    ledger.reclaims.gave_back(machine_id, gpus[0], DETACH, "reclaimer")

    figures = {**DETACH.figures, "active_s": 42.0}
    hour = timedelta(hours=1)
    assert ledger.reclaims.givebacks(clock.now - hour, clock.now + hour) == [
        GiveBack(
            id=ledger.reclaims.givebacks(clock.now, clock.now + hour)[0].id,
            at=clock.now,
            machine_id=machine_id,
            user_name="alice",
            server_name="lab",
            cohort="cs-101",
            block_id=gpus[0],
            model="A100-80GB",
            action="detach",
            figures=figures,
            actor="reclaimer",
        )
    ]
    entry = ledger.policy.audit_log()[0]
    assert (entry.actor, entry.action, entry.about_user) == ("reclaimer", "gpu.detach", "alice")
    assert entry.detail["why"] == DETACH.why
    assert entry.detail["figures"] == figures
    assert ledger.policy.notices("alice", clock.now - hour) == [entry]
    assert key not in active_s(ledger)
    assert ledger.reclaims.watches() == {(machine_id, gpus[1]): WATCH}


def test_givebacks_are_those_of_the_period(
    ledger: Ledger, clock: Clock, running: str, gpus: list[str]
) -> None:
    start = clock.now
    ledger.reclaims.gave_back(running, gpus[0], DETACH, "reclaimer")
    clock.advance(hours=2)
    reclaim = Decision("reclaim", "no work for 3600 s, warned 1800 s ago", {"idle_s": 3600.0})
    ledger.reclaims.gave_back(running, gpus[1], reclaim, "reclaimer")
    hour = timedelta(hours=1)
    assert [g.action for g in ledger.reclaims.givebacks(start, clock.now + hour)] == [
        "detach",
        "reclaim",
    ]
    assert [g.block_id for g in ledger.reclaims.givebacks(start + hour, clock.now)] == []
    assert [g.block_id for g in ledger.reclaims.givebacks(start + hour, clock.now + hour)] == [
        gpus[1]
    ]


def test_gave_back_is_only_for_a_detach_or_a_reclaim(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    with pytest.raises(ValueError, match="'detach' or 'reclaim'"):
        ledger.reclaims.gave_back(running, gpus[0], Decision("warn", "idle"), "reclaimer")
    assert ledger.policy.audit_log() == []


def test_cohort_policy_round_trip(ledger: Ledger) -> None:
    admin = Actor("admin", "192.0.2.1")
    ledger.policy.set_cohort(Cohort("cs-101"), admin)
    assert ledger.reclaims.cohort_policy("cs-101") is None
    overrides = {"detach_after": 120.0, "warn_after": None, "reclaim_after": None}
    assert ledger.reclaims.set_cohort_policy("cs-101", overrides, "admin")
    assert ledger.reclaims.cohort_policy("cs-101") == overrides
    assert ledger.reclaims.cohort_policies() == {"cs-101": overrides}
    entry = ledger.policy.audit_log()[0]
    assert (entry.action, entry.target, entry.detail) == (
        "cohort.reclaim_policy",
        "cohort cs-101",
        {"reclaim_policy": overrides},
    )
    # Changing the cohort's other settings keeps its policy.
    ledger.policy.set_cohort(Cohort("cs-101", title="Intro"), admin)
    assert ledger.reclaims.cohort_policy("cs-101") == overrides

    assert ledger.reclaims.set_cohort_policy("cs-101", None, "admin")
    assert ledger.reclaims.cohort_policy("cs-101") is None
    assert ledger.reclaims.cohort_policies() == {}


def test_cohort_policy_of_no_cohort(ledger: Ledger) -> None:
    assert not ledger.reclaims.set_cohort_policy("nobody", {"detach_after": 60.0}, "admin")
    assert ledger.reclaims.cohort_policy("nobody") is None
    assert ledger.policy.audit_log() == []


def test_ended_machines_watches_are_neither_returned_nor_written(
    ledger: Ledger, running: str, machine_in: MachineMaker, gpus: list[str]
) -> None:
    key = (running, gpus[0])
    ledger.reclaims.save_watches({key: WATCH, (running, gpus[1]): WATCH})
    ledger.transition(running, "stopping", "stop")
    assert set(ledger.reclaims.watches()) == {key, (running, gpus[1])}  # it still holds them
    ledger.transition(running, "released", "done")
    assert ledger.reclaims.watches() == {}

    ended = machine_in("released", "carol", "lab", gpus[2:3])
    ledger.reclaims.save_watches({key: WATCH, (ended, gpus[2]): WATCH}, {key: 10.0})
    assert ledger.reclaims.watches() == {}
    assert (ended, gpus[2]) not in active_s(ledger)
    assert active_s(ledger)[key] == 0.0  # the ended machine's row took nothing more


def test_a_gpu_given_back_otherwise_is_not_watched(
    ledger: Ledger, running: str, gpus: list[str]
) -> None:
    ledger.reclaims.save_watches({(running, gpus[0]): WATCH, (running, gpus[1]): WATCH})
    ledger.give_back(running, [gpus[1]], "alice shrank her server")
    assert set(ledger.reclaims.watches()) == {(running, gpus[0])}
    ledger.reclaims.save_watches({(running, gpus[1]): WATCH})
    assert set(ledger.reclaims.watches()) == {(running, gpus[0])}
