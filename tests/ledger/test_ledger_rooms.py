"""Shared hosts in the ledger: room (cores, memory, slots) claimed with the devices, never
overcommitted (invariant 10), given back with them; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from composespawner.domain.rooms import HostUse, Room
from composespawner.ledger import HostFull, HostRecord, Ledger, Machine, RoomClaim

from .test_ledger_races import race, racers

HOST = "host-1"
CAPACITY = Room(cores=8, memory_gib=64, slots=3)


def room(cores: int = 2, memory: int = 8, capacity: Room = CAPACITY) -> RoomClaim:
    return RoomClaim(HostRecord(HOST, f"{HOST}-block", capacity), cores, memory)


def claim(
    ledger: Ledger, user: str, blocks: list[str], share: RoomClaim, server: str = ""
) -> Machine:
    machine_id = ledger.request_machine(user, server, {})
    return ledger.claim(machine_id, host_id=HOST, zone="rack-1", block_ids=blocks, room=share)


def end(ledger: Ledger, machine_id: str) -> None:
    ledger.transition(machine_id, "stopping", "server stopped")
    ledger.release(machine_id)


def use(ledger: Ledger) -> HostUse | None:
    return ledger.holds()[1].get(HOST)


def test_machines_share_a_host_until_its_room_is_gone(ledger: Ledger, gpus: list[str]) -> None:
    first = claim(ledger, "ada", [gpus[0]], room(4, 32))
    second = claim(ledger, "bob", [], room(2, 8))  # CPU only: no slot
    assert (first.cores, first.memory_gib, second.cores) == (4, 32, 2)
    assert use(ledger) == HostUse(cores=6, memory_gib=40, slots=1, machines=2)

    with pytest.raises(HostFull):
        claim(ledger, "cy", [], room(4, 8))  # 10 cores > 8
    with pytest.raises(HostFull):
        claim(ledger, "cy", gpus[1:4], room(1, 1), server="gpu")  # 4 devices > 3 slots
    assert use(ledger) == HostUse(6, 40, 1, 2)
    assert set(ledger.holders()) == {gpus[0]}  # the refused claims took no device either
    assert [m.state for m in ledger.live_machines("cy")] == ["requested", "requested"]


def test_ending_and_giving_back_return_exactly_what_was_held(
    ledger: Ledger, gpus: list[str]
) -> None:
    machine = claim(ledger, "ada", gpus[:2], room(4, 32))
    neighbour = claim(ledger, "bob", [gpus[2]], room(2, 8))
    for to in ("composed", "launching", "running"):
        ledger.transition(machine.id, to, to)

    ledger.give_back(machine.id, [gpus[1]], "shrunk")
    assert use(ledger) == HostUse(6, 40, 2, 2)
    ledger.grow(machine.id, block_ids=[gpus[1]])
    assert use(ledger) == HostUse(6, 40, 3, 2)
    with pytest.raises(HostFull):
        ledger.grow(machine.id, block_ids=[gpus[3]])  # the host's third slot is the last
    assert gpus[3] not in ledger.holders()

    end(ledger, machine.id)
    assert use(ledger) == HostUse(2, 8, 1, 1)
    end(ledger, neighbour.id)
    assert use(ledger) is None  # no machine on it: not in use
    assert claim(ledger, "cy", gpus[:3], room(8, 64)).cores == 8  # the whole room again


def test_a_capacity_change_waits_for_the_host_to_be_empty(ledger: Ledger) -> None:
    first = claim(ledger, "ada", [], room(6, 8))
    smaller = Room(cores=4, memory_gib=64, slots=3)
    # Told 4 cores while 6 are held: the ledger keeps 8 until what is held fits.
    second = claim(ledger, "bob", [], room(2, 8, capacity=smaller))
    assert use(ledger) == HostUse(8, 16, 0, 2)
    end(ledger, first.id)
    end(ledger, second.id)
    claim(ledger, "cy", [], room(1, 1, capacity=smaller))
    with pytest.raises(HostFull):
        claim(ledger, "dee", [], room(4, 1, capacity=smaller))  # now 4 cores: 3 free
    assert use(ledger) == HostUse(1, 1, 0, 1)


def test_the_database_refuses_an_overcommitted_host(ledger: Ledger) -> None:
    """The CHECK constraints hold even for a statement that forgets to compare."""
    claim(ledger, "ada", [], room(2, 8))
    with pytest.raises(sa.exc.IntegrityError), ledger.engine.begin() as connection:
        connection.execute(sa.text("UPDATE host_rooms SET cores_held = cores + 1"))
    assert use(ledger) == HostUse(2, 8, 0, 1)


def test_racing_spawns_for_the_last_room_on_a_host_one_wins(
    ledger: Ledger, open_ledger: Callable[[], Ledger], gpus: list[str]
) -> None:
    claim(ledger, "zed", [], room(6, 8))  # 2 cores left: one more small server
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine(f"user{i}", "", {}) for i in range(len(ledgers))]

    def claimer(i: int) -> Callable[[], Machine]:
        return lambda: ledgers[i].claim(
            machines[i], host_id=HOST, zone="rack-1", block_ids=[gpus[i % 4]], room=room(2, 8)
        )

    outcomes = race([claimer(i) for i in range(len(ledgers))])
    names = Counter(type(o).__name__ for o in outcomes)
    assert names["Machine"] == 1, names
    assert set(names) <= {"Machine", "HostFull", "DevicesTaken"}, names
    assert use(ledger) == HostUse(8, 16, 1, 2)
    winner = next(o for o in outcomes if isinstance(o, Machine))
    assert ledger.holders() == {winner.block_ids[0]: winner.id}


def test_every_host_the_fabric_has_is_known_with_its_room(ledger: Ledger) -> None:
    other = HostRecord("host-2", "host-2-block", Room(64, 512, 16))
    ledger.sync_hosts([HostRecord(HOST, f"{HOST}-block", CAPACITY), other])
    claim(ledger, "ada", [], room(6, 8))
    # The fabric now says the busy host is smaller than what is held, the idle one smaller.
    ledger.sync_hosts(
        [
            HostRecord(HOST, f"{HOST}-block", Room(4, 64, 3)),
            HostRecord("host-2", "host-2-block", Room(32, 256, 16)),
        ]
    )
    rooms = {host.host_id: (host, use) for host, use in ledger.host_rooms()}
    assert rooms[HOST] == (HostRecord(HOST, f"{HOST}-block", CAPACITY), HostUse(6, 8, 0, 1))
    assert rooms["host-2"][0].capacity == Room(32, 256, 16)  # empty: the change is taken
    assert rooms["host-2"][1] == HostUse(0, 0, 0, 0)
    # Bigger than what is held: taken at once, machines on it or not.
    ledger.sync_hosts([HostRecord(HOST, f"{HOST}-block", Room(16, 64, 3))])
    assert dict((h.host_id, h.capacity) for h, _ in ledger.host_rooms())[HOST] == Room(16, 64, 3)
