"""Growing and shrinking a running machine in the ledger, alone and in races.

A grow is checked as a claim is (known, owned, free, within quota counting the
machine's own GPUs) in one transaction; only a running machine grows. Races
run on SQLite and PostgreSQL: concurrent grows never pass the quota nor give a
device two holders, and a grow racing a stop either loses or is given back
with the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest

from composespawner.domain.quotas import Quota
from composespawner.ledger import (
    DevicesTaken,
    Ledger,
    Machine,
    NotOwner,
    NotRunning,
    QuotaExceeded,
)

from .support import Clock, MachineMaker
from .test_ledger_races import RACERS, race, racers

RUNNING = ("claimed", "composed", "launching", "running")


def running_machine(ledger: Ledger, user: str, blocks: list[str], server: str = "") -> str:
    machine_id = ledger.request_machine(user, server, {})
    ledger.claim(machine_id, host_id="host-1", zone="rack-1", block_ids=blocks)
    ledger.advance(machine_id, *((state, state) for state in RUNNING[1:]))
    return machine_id


def test_a_grow_adds_devices_to_a_running_machine(ledger: Ledger, gpus: list[str]) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:1])
    grown = ledger.grow(machine_id, block_ids=gpus[1:3], quota=Quota.site_default(3))
    assert grown.block_ids == tuple(gpus[:3])
    assert grown.state == "running"
    assert ledger.held_by(machine_id) == gpus[:3]
    assert ledger.events(machine_id)[-1].message == f"grew by {gpus[1]}, {gpus[2]}"


@pytest.mark.parametrize("state", ["requested", "claimed", "launching", "stopping", "released"])
def test_only_a_running_machine_grows(
    ledger: Ledger, machine_in: MachineMaker, gpus: list[str], state: str
) -> None:
    machine_id = machine_in(state, blocks=gpus[:1])
    with pytest.raises(NotRunning) as refused:
        ledger.grow(machine_id, block_ids=gpus[1:2])
    assert f"is {state}: only a running server can grow or shrink" in refused.value.user_message
    assert gpus[1] in ledger.free_blocks()


def test_a_grow_counts_the_machines_own_gpus_against_the_quota(
    ledger: Ledger, gpus: list[str]
) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:2])
    running_machine(ledger, "alice", gpus[2:3], server="other")
    with pytest.raises(QuotaExceeded) as refused:
        ledger.grow(machine_id, block_ids=gpus[3:4], quota=Quota.site_default(3))
    assert refused.value.limit == "gpus_held"
    assert ledger.held_by(machine_id) == gpus[:2]
    assert gpus[3] in ledger.free_blocks()


def test_a_grow_of_a_held_or_foreign_device_changes_nothing(
    ledger: Ledger, gpus: list[str], colocated: list[str]
) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:1])
    running_machine(ledger, "bob", gpus[1:2])
    with pytest.raises(DevicesTaken):
        ledger.grow(machine_id, block_ids=[gpus[2], gpus[1]])
    with pytest.raises(NotOwner):
        ledger.grow(machine_id, block_ids=colocated[:1], groups=frozenset({"chemistry"}))
    assert ledger.held_by(machine_id) == gpus[:1]
    assert {gpus[2], colocated[0]} <= ledger.free_blocks()


def test_give_back_frees_some_devices_and_counts_their_use(
    ledger: Ledger, gpus: list[str], clock: Clock
) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:1])
    ledger.grow(machine_id, block_ids=gpus[1:3])
    clock.advance(hours=2)
    after = ledger.give_back(machine_id, [gpus[2], "not-mine"], "gave back")
    assert after.block_ids == tuple(gpus[:2])
    [record] = ledger.usage("alice")
    assert record.block_id == gpus[2]
    assert (record.ended_at - record.started_at).total_seconds() == 2 * 3600
    ledger.give_back(machine_id, [gpus[1]], "not attached", used=False)
    assert [r.block_id for r in ledger.usage("alice")] == [gpus[2]]
    assert ledger.held_by(machine_id) == gpus[:1]


def test_a_stop_after_a_grow_gives_back_the_grown_devices(ledger: Ledger, gpus: list[str]) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:1])
    ledger.grow(machine_id, block_ids=gpus[1:2])
    stopping = ledger.transition(machine_id, "stopping", "stop")
    assert stopping.block_ids == tuple(gpus[:2])  # what the release takes apart on the fabric
    ledger.release(machine_id)
    assert set(gpus[:2]) <= ledger.free_blocks()


def test_concurrent_grows_never_pass_the_quota(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    machine_id = running_machine(ledger, "alice", gpus[:1])
    ledgers = racers(open_ledger, len(gpus) - 1)
    calls = [
        partial(lg.grow, machine_id, block_ids=[gpu], quota=Quota.site_default(3))
        for lg, gpu in zip(ledgers, gpus[1:], strict=True)
    ]
    outcomes = race(calls)
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 2, "QuotaExceeded": 5}
    assert len(ledger.held_by(machine_id)) == 3


def test_concurrent_grows_of_different_machines_never_share_a_gpu(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    machines = [running_machine(ledger, f"user{i}", [], server="") for i in range(RACERS)]
    ledgers = racers(open_ledger)
    wanted = gpus[:3]  # each racer asks for a pair from three: at most one pair wins
    calls = [
        partial(lg.grow, machine, block_ids=[wanted[i % 3], wanted[(i + 1) % 3]])
        for i, (lg, machine) in enumerate(zip(ledgers, machines, strict=True))
    ]
    outcomes = race(calls)
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 1, "DevicesTaken": 19}
    holders = ledger.holders()
    assert len({holders[gpu] for gpu in wanted if gpu in holders}) == 1


def test_a_grow_racing_a_stop_loses_or_is_given_back(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    for round_ in range(10):
        machine_id = running_machine(ledger, "alice", gpus[:1], server=f"s{round_}")
        grower, stopper = racers(open_ledger, 2)
        grown, stopped = race(
            [
                partial(grower.grow, machine_id, block_ids=gpus[1:2]),
                partial(stopper.transition, machine_id, "stopping", "stop"),
            ]
        )
        assert isinstance(stopped, Machine)
        if isinstance(grown, Machine):
            assert gpus[1] in stopped.block_ids  # the stop takes it apart with the rest
        else:
            assert isinstance(grown, NotRunning)
            assert stopped.block_ids == tuple(gpus[:1])
        ledger.release(machine_id)
        assert set(gpus[:2]) <= ledger.free_blocks()
