"""Concurrent claims: many engines (hub processes) and many threads at once.

Each racer gets its own Ledger (own engine, own connections) unless the test
says otherwise, and all start together at a barrier. Whatever the
interleaving, no device may get two holders (invariant 1) and no user may end
up past their quota (invariant 3).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa

from composespawner.domain.quotas import Quota
from composespawner.ledger import (
    DeviceRecord,
    DevicesTaken,
    IllegalTransition,
    Ledger,
    LedgerError,
    Machine,
    QuotaExceeded,
    ServerBusy,
)

from .support import gpu_ids

RACERS = 20
BARRIER_TIMEOUT = 30.0


def race(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads released together; each result or LedgerError, in order."""
    barrier = threading.Barrier(len(calls), timeout=BARRIER_TIMEOUT)

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except LedgerError as refused:  # anything else (a deadlock, a lock timeout) fails
            return refused

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def claimer(
    ledger: Ledger, machine_id: str, blocks: list[str], limit: int | None
) -> Callable[[], Machine]:
    def _claim() -> Machine:
        return ledger.claim(
            machine_id,
            host_id="host-1",
            zone="rack-1",
            block_ids=blocks,
            quota=Quota.site_default(limit),
        )

    return _claim


def racers(open_ledger: Callable[[], Ledger], count: int = RACERS) -> list[Ledger]:
    ledgers = [open_ledger() for _ in range(count)]
    for ledger in ledgers:
        ledger.machine("warm-up")  # connect now, not at the barrier
    return ledgers


def last_free_gpus(ledger: Ledger, gpus: list[str], free: int) -> list[str]:
    """Hold all but ``free`` GPUs by someone else; the ones left."""
    held = gpus[: len(gpus) - free]
    ledger.claim(
        ledger.request_machine("zed", "", {}),
        host_id="host-2",
        zone="rack-1",
        block_ids=held,
    )
    return gpus[len(gpus) - free :]


def assert_one_holder_each(ledger: Ledger) -> None:
    holders = ledger.holders()
    machines = {m.id: m for m in ledger.live_machines()}
    for block, machine_id in holders.items():
        assert machines[machine_id].state == "claimed", block
    for machine in machines.values():
        assert set(machine.block_ids) == {b for b, m in holders.items() if m == machine.id}


def test_twenty_users_race_for_five_gpus(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    free = last_free_gpus(ledger, gpus, 5)
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(RACERS)]
    calls = [claimer(ledgers[i], machines[i], [free[i % 5]], limit=None) for i in range(RACERS)]
    outcomes = race(calls)
    winners = [o for o in outcomes if isinstance(o, Machine)]
    assert len(winners) == 5
    assert sorted(b for w in winners for b in w.block_ids) == free
    assert all(isinstance(o, DevicesTaken) for o in outcomes if not isinstance(o, Machine))
    assert ledger.free_blocks() & set(gpus) == set()
    assert_one_holder_each(ledger)
    losers = {m for m, o in zip(machines, outcomes, strict=True) if not isinstance(o, Machine)}
    assert all(ledger.held_by(m) == [] for m in losers)


def test_fifty_claims_from_separate_connections_for_ten_free_gpus(
    ledger: Ledger, open_ledger: Callable[[], Ledger]
) -> None:
    pool = gpu_ids(14, "pool")
    ledger.sync_devices(
        DeviceRecord(b, "gpu", "A100-80GB", frozenset({"rack-1"}), "rack-1") for b in pool
    )
    free = last_free_gpus(ledger, pool, 10)
    ledgers = racers(open_ledger, 50)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(50)]
    outcomes = race([claimer(ledgers[i], machines[i], [free[i % 10]], None) for i in range(50)])
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 10, "DevicesTaken": 40}
    winners = [o for o in outcomes if isinstance(o, Machine)]
    assert sorted(b for w in winners for b in w.block_ids) == free
    assert ledger.free_blocks() & set(pool) == set()
    assert_one_holder_each(ledger)


def test_threads_sharing_one_ledger_race_safely(ledger: Ledger, gpus: list[str]) -> None:
    free = last_free_gpus(ledger, gpus, 5)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(RACERS)]
    outcomes = race([claimer(ledger, machines[i], [free[i % 5]], None) for i in range(RACERS)])
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 5, "DevicesTaken": 15}
    assert set(ledger.holders()) >= set(free)
    assert_one_holder_each(ledger)


def test_overlapping_multi_gpu_claims_neither_deadlock_nor_share(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    free = last_free_gpus(ledger, gpus, 5)
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(RACERS)]
    # Pairs of neighbours on a ring of five, named in both orders.
    pairs = [[free[i % 5], free[(i + 1) % 5]] for i in range(RACERS)]
    pairs = [pair if i % 2 else pair[::-1] for i, pair in enumerate(pairs)]
    outcomes = race([claimer(ledgers[i], machines[i], pairs[i], None) for i in range(RACERS)])
    winners = [o for o in outcomes if isinstance(o, Machine)]
    # Every pair was tried after its blocks stopped being free or won: the winners
    # form a maximal set of disjoint neighbour pairs on a 5-ring, always two.
    assert len(winners) == 2
    held = [b for w in winners for b in w.block_ids]
    assert len(held) == len(set(held)) == 4
    assert all(isinstance(o, DevicesTaken) for o in outcomes if not isinstance(o, Machine))
    assert_one_holder_each(ledger)


def test_one_user_racing_servers_stays_within_quota(
    ledger: Ledger, open_ledger: Callable[[], Ledger]
) -> None:
    many = gpu_ids(2 * RACERS, "pool")
    ledger.sync_devices(
        DeviceRecord(b, "gpu", "A100-80GB", frozenset({"rack-1"}), "rack-1") for b in many
    )
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine("alice", f"server{i}", {}) for i in range(RACERS)]
    # Each asks for 2 distinct GPUs; the limit of 5 allows two of them at once.
    calls = [
        claimer(ledgers[i], machines[i], many[2 * i : 2 * i + 2], limit=5) for i in range(RACERS)
    ]
    outcomes = race(calls)
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 2, "QuotaExceeded": 18}
    assert sum(use.gpus for use in ledger.gpu_use("alice")) == 4
    refused = [o for o in outcomes if isinstance(o, QuotaExceeded)]
    assert {r.limit for r in refused} == {"gpus_held"}
    assert all("asked for 2 GPUs" in r.user_message for r in refused)
    assert all("4 are in use" in r.user_message for r in refused)
    assert_one_holder_each(ledger)


def test_racing_requests_for_one_server_make_one_machine(
    ledger: Ledger, open_ledger: Callable[[], Ledger]
) -> None:
    ledgers = racers(open_ledger, 10)
    outcomes = race([partial(lg.request_machine, "alice", "", {}) for lg in ledgers])
    made = [o for o in outcomes if isinstance(o, str)]
    assert len(made) == 1
    assert all(
        isinstance(o, ServerBusy) and o.machine_id == made[0] for o in outcomes if o not in made
    )
    assert [m.id for m in ledger.live_machines("alice")] == made


def test_racing_releases_release_once(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    machine_id = ledger.request_machine("alice", "", {})
    ledger.claim(machine_id, host_id="host-1", zone="rack-1", block_ids=gpus[:3])
    ledger.transition(machine_id, "stopping")
    ledgers = racers(open_ledger, 10)
    outcomes = race([partial(lg.release, machine_id) for lg in ledgers])
    assert all(isinstance(o, Machine) and o.state == "released" for o in outcomes)
    assert [u.block_id for u in ledger.usage()] == gpus[:3]  # written once
    assert [e.to_state for e in ledger.events(machine_id)].count("released") == 1


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_transition_loses_to_a_concurrent_writer(
    backend: str, ledger: Ledger, open_ledger: Callable[[], Ledger]
) -> None:
    """A transition reads, then compare-and-sets: a writer in between wins (PostgreSQL).

    SQLite cannot interleave like this: its writers start with BEGIN IMMEDIATE.
    """
    machine_id = ledger.request_machine("alice", "", {})
    ledger.claim(machine_id, host_id="host-1", zone="rack-1", block_ids=[])
    mover = racers(open_ledger, 1)[0]
    with ThreadPoolExecutor(max_workers=1) as pool, ledger.engine.connect() as other:
        stopping = sa.text("UPDATE machines SET state = 'stopping' WHERE id = :id")
        other.execute(stopping, {"id": machine_id})  # uncommitted: holds the row lock
        moved = pool.submit(mover.transition, machine_id, "composed")
        _wait_for_a_lock_waiter(ledger)
        other.commit()
        with pytest.raises(IllegalTransition, match="meanwhile"):
            moved.result(timeout=30)
    assert [e.to_state for e in ledger.events(machine_id)] == ["requested", "claimed"]


def _wait_for_a_lock_waiter(ledger: Ledger, deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    waiting = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while time.monotonic() < end:
        with ledger.engine.connect() as connection:
            if connection.execute(waiting).scalar_one():
                return
        time.sleep(0.01)
    raise AssertionError("the transition never waited for the row lock")
