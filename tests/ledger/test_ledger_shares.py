"""GPU shares in the ledger: a split GPU's holder slots, claimed compare-and-set, never whole
and split at once, never over its size; its last holder closes it; quota and usage count
the fraction. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from composespawner.domain.quotas import NO_QUOTA, Limit, Quota
from composespawner.domain.rooms import HostUse, Room
from composespawner.domain.shares import SplitGpu
from composespawner.ledger import (
    DevicesTaken,
    HostRecord,
    Ledger,
    Machine,
    QuotaExceeded,
    RoomClaim,
    ShareClaim,
    SharesDoNotGrow,
)

from .support import Clock
from .test_ledger_races import race, racers

HOST, OTHER = "host-1", "host-2"
CAPACITY = Room(cores=32, memory_gib=256, slots=4)


def room(host: str = HOST) -> RoomClaim:
    return RoomClaim(HostRecord(host, f"{host}-block", CAPACITY), 2, 8)


def claim_share(
    ledger: Ledger,
    user: str,
    gpu: str,
    size: int = 4,
    host: str = HOST,
    server: str = "",
    quota: Quota = NO_QUOTA,
) -> Machine:
    machine_id = ledger.request_machine(user, server, {})
    return ledger.claim(
        machine_id,
        host_id=host,
        zone="rack-1",
        block_ids=[],
        room=room(host),
        share=ShareClaim(gpu, size, host),
        quota=quota,
    )


def run(ledger: Ledger, machine_id: str) -> None:
    for to in ("composed", "launching", "running"):
        ledger.transition(machine_id, to, to)


def split(ledger: Ledger) -> dict[str, SplitGpu]:
    return ledger.holds().split


def test_four_quarters_share_one_gpu_and_a_fifth_is_refused(
    ledger: Ledger, gpus: list[str]
) -> None:
    holders = [claim_share(ledger, f"student{i}", gpus[0]) for i in range(4)]
    assert all(m.shared == (gpus[0],) and m.gpu_share == 4 for m in holders)
    assert split(ledger) == {gpus[0]: SplitGpu(HOST, 4, 4)}
    # The GPU takes one device slot on its host, however many hold it.
    assert ledger.holds().use[HOST] == HostUse(8, 32, 1, 4)

    with pytest.raises(DevicesTaken):
        claim_share(ledger, "late", gpus[0])  # no slot left
    with pytest.raises(DevicesTaken):
        claim_share(ledger, "half", gpus[0], size=2)  # never two sizes at once
    machine_id = ledger.request_machine("whole", "", {})
    with pytest.raises(DevicesTaken):  # never whole and split at once
        ledger.claim(machine_id, host_id=OTHER, zone="rack-1", block_ids=[gpus[0]], room=room())
    assert gpus[0] in ledger.holds().held
    assert gpus[0] not in ledger.free_blocks()


def test_a_share_elsewhere_or_of_another_size_does_not_join(
    ledger: Ledger, gpus: list[str]
) -> None:
    claim_share(ledger, "ada", gpus[0], size=2)
    with pytest.raises(DevicesTaken):
        claim_share(ledger, "bob", gpus[0], size=4)
    with pytest.raises(DevicesTaken):
        claim_share(ledger, "cy", gpus[0], size=2, host=OTHER)
    claim_share(ledger, "dee", gpus[0], size=2)
    assert split(ledger) == {gpus[0]: SplitGpu(HOST, 2, 2)}


def test_the_last_holder_closes_the_gpu_and_its_end_frees_it(
    ledger: Ledger, gpus: list[str]
) -> None:
    first, second = (claim_share(ledger, u, gpus[0]) for u in ("ada", "bob"))
    for machine in (first, second):
        run(ledger, machine.id)
        ledger.transition(machine.id, "stopping", "stopped")

    assert ledger.leave_shares(first.id) == ()  # bob still holds it: not first's to detach
    assert ledger.leave_shares(first.id) == ()  # idempotent
    # A slot a leaving holder let go of is free for a newcomer...
    third = claim_share(ledger, "cy", gpus[0])
    ledger.release(first.id)
    assert split(ledger) == {gpus[0]: SplitGpu(HOST, 4, 2)}
    ledger.transition(third.id, "stopping", "compose failed")
    ledger.release(third.id, to="failed")  # (an end leaves too)
    assert ledger.leave_shares(second.id) == (gpus[0],)  # the last: it detaches the GPU
    assert split(ledger)[gpus[0]].closing
    with pytest.raises(DevicesTaken):  # ...but nobody joins a GPU being detached
        claim_share(ledger, "dee", gpus[0])
    assert ledger.holds().use[HOST].slots == 1  # the GPU's slot is held until it is gone

    ledger.release(second.id)
    assert split(ledger) == {}
    assert HOST not in ledger.holds().use  # nobody left: the slot went with it
    assert gpus[0] in ledger.free_blocks()
    whole = ledger.request_machine("eve", "", {})
    ledger.claim(whole, host_id=OTHER, zone="rack-1", block_ids=[gpus[0]], room=room(OTHER))


def test_a_share_counts_its_fraction_against_the_quota(ledger: Ledger, gpus: list[str]) -> None:
    quota = Quota(gpus_held=Limit(1, "site"))

    def take(server: str, gpu: str, size: int) -> Machine:
        machine_id = ledger.request_machine("ada", server, {})
        share = ShareClaim(gpu, size, HOST)
        return ledger.claim(
            machine_id, host_id=HOST, zone="rack-1", block_ids=[], room=room(), share=share
        )

    take("a", gpus[0], 2)
    take("b", gpus[1], 4)
    take("c", gpus[2], 4)
    assert sorted(u.gpus for u in ledger.gpu_use("ada")) == [0.25, 0.25, 0.5]
    with pytest.raises(QuotaExceeded, match=r"1 GPU at once.*and 1 is in use"):
        claim_share(ledger, "ada", gpus[3], server="d", quota=quota)


def test_usage_and_gpu_hours_count_a_quarter_as_a_quarter(
    ledger: Ledger, gpus: list[str], clock: Clock
) -> None:
    machine = claim_share(ledger, "ada", gpus[0])
    run(ledger, machine.id)
    clock.advance(hours=2)
    assert ledger.gpu_hours("ada") == pytest.approx(0.5)
    ledger.transition(machine.id, "stopping", "stopped")
    ledger.release(machine.id)
    [record] = ledger.usage("ada")
    assert (record.block_id, record.fraction) == (gpus[0], 0.25)
    assert record.device_seconds == pytest.approx(1800)
    assert ledger.gpu_hours("ada") == pytest.approx(0.5)


def test_a_share_does_not_grow(ledger: Ledger, gpus: list[str]) -> None:
    machine = claim_share(ledger, "ada", gpus[0])
    run(ledger, machine.id)
    with pytest.raises(SharesDoNotGrow):
        ledger.grow(machine.id, block_ids=[gpus[1]])
    assert gpus[1] in ledger.free_blocks()


def test_the_database_refuses_a_gpu_held_whole_and_split(ledger: Ledger, gpus: list[str]) -> None:
    """The CHECK constraints hold even for a statement that forgets to compare."""
    machine = claim_share(ledger, "ada", gpus[0])
    bad = (
        f"UPDATE devices SET machine_id = '{machine.id}', held_since = CURRENT_TIMESTAMP"
        f" WHERE block_id = '{gpus[0]}'",
        f"UPDATE devices SET share_holders = 5 WHERE block_id = '{gpus[0]}'",
        f"UPDATE devices SET share_host = NULL WHERE block_id = '{gpus[0]}'",
    )
    for statement in bad:
        with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as connection:
            connection.execute(sa.text(statement))
    assert split(ledger) == {gpus[0]: SplitGpu(HOST, 4, 1)}


def test_racing_quarters_fill_a_gpu_and_no_more(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    claim_share(ledger, "zed", gpus[0])  # 3 slots left
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(len(ledgers))]

    def claimer(i: int) -> Callable[[], Machine]:
        return lambda: ledgers[i].claim(
            machines[i],
            host_id=HOST,
            zone="rack-1",
            block_ids=[],
            room=room(),
            share=ShareClaim(gpus[0], 4, HOST),
        )

    outcomes = race([claimer(i) for i in range(len(ledgers))])
    names = Counter(type(o).__name__ for o in outcomes)
    assert names["Machine"] == 3, names
    assert set(names) <= {"Machine", "DevicesTaken"}, names
    assert split(ledger) == {gpus[0]: SplitGpu(HOST, 4, 4)}


def test_holders_stopping_together_close_the_gpu_once_and_leave_a_new_holder_alone(
    ledger: Ledger, gpus: list[str]
) -> None:
    """A left first, then B left, detached and ended while A's detach was still out: A's
    end (or a retry of its leave) must not close the GPU again, whoever has it by then."""
    a, b = (claim_share(ledger, u, gpus[0]) for u in ("ada", "bob"))
    for machine in (a, b):
        run(ledger, machine.id)
        ledger.transition(machine.id, "stopping", "stopped")
    assert ledger.leave_shares(a.id) == ()
    assert ledger.leave_shares(b.id) == (gpus[0],)
    ledger.release(b.id)
    assert split(ledger) == {}

    taker = ledger.request_machine("cy", "", {})
    ledger.claim(taker, host_id=HOST, zone="rack-1", block_ids=[gpus[0]], room=room())
    assert ledger.leave_shares(a.id) == ()  # a retry: not A's to detach, it is cy's now
    ledger.release(a.id)
    assert ledger.holders() == {gpus[0]: taker}
    assert split(ledger) == {}
    [usage] = ledger.usage("ada")
    assert usage.fraction == 0.25
    released = ledger.machine(a.id)
    assert released is not None
    assert released.state == "released"


def test_nine_ninths_fit_a_one_gpu_limit(ledger: Ledger, gpus: list[str]) -> None:
    """Fractions sum as floats (nine ninths are 1.0000000000000002): never refused for it."""
    quota = Quota(gpus_held=Limit(1, "site"))
    for i in range(9):
        claim_share(ledger, "ada", gpus[0], size=9, server=f"s{i}", quota=quota)
    assert sum(u.gpus for u in ledger.gpu_use("ada")) == pytest.approx(1)


def test_the_inventory_shows_a_split_gpus_holders_and_no_whole_holder(
    ledger: Ledger, gpus: list[str]
) -> None:
    ada = claim_share(ledger, "ada", gpus[0])
    run(ledger, ada.id)
    bob = claim_share(ledger, "bob", gpus[0], server="gpu")
    by_block = {h.device.block_id: h for h in ledger.holdings()}

    quartered = by_block[gpus[0]]
    assert quartered.share_size == 4
    assert quartered.machine_id is None  # held by nobody whole
    assert quartered.user is None
    assert sorted((s.user, s.server, s.state, s.host, s.leaving) for s in quartered.shares) == [
        ("ada", "", "running", HOST, False),
        ("bob", "gpu", "claimed", HOST, False),
    ]
    assert by_block[gpus[1]].share_size is None
    assert by_block[gpus[1]].shares == ()
    assert [h.device.block_id for h in ledger.holdings(held_only=True)] == [gpus[0]]

    ledger.transition(bob.id, "stopping", "stopped")
    assert ledger.leave_shares(bob.id) == ()  # ada holds it still
    shares = next(h.shares for h in ledger.holdings() if h.device.block_id == gpus[0])
    (leaving,) = [s for s in shares if s.user == "bob"]
    assert leaving.leaving
    assert leaving.state == "stopping"
