"""Host rooms: the cores, memory and device slots machines hold of a shared host.

How invariant 10 (a host is never over capacity) holds here: every change to
what is held is one ``UPDATE host_rooms`` whose WHERE clause compares what
would be held with the capacity, and its row count is checked (compare-and-set,
correct on SQLite and PostgreSQL: PostgreSQL re-checks the WHERE clause on the
row a concurrent transaction just changed); the table's CHECK constraints
refuse any write that would overcommit a host even so. Each step runs in its
caller's transaction, next to the devices it claims or frees, so the room and
the devices move together or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Row, Table, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.domain.rooms import HostUse, Room
from composespawner.ledger.errors import HostFull
from composespawner.ledger.models import HostRoomRow
from composespawner.ledger.records import HostRecord, RoomClaim

HOST_ROOMS = cast(Table, HostRoomRow.__table__)

_ROOM = HOST_ROOMS.c
_TAKE = (
    update(HOST_ROOMS)
    .where(
        _ROOM.host_id == bindparam("b_host"),
        _ROOM.cores_held + bindparam("b_cores") <= _ROOM.cores,
        _ROOM.memory_gib_held + bindparam("b_memory") <= _ROOM.memory_gib,
        _ROOM.slots_held + bindparam("b_slots") <= _ROOM.slots,
    )
    .values(
        cores_held=_ROOM.cores_held + bindparam("b_cores"),
        memory_gib_held=_ROOM.memory_gib_held + bindparam("b_memory"),
        slots_held=_ROOM.slots_held + bindparam("b_slots"),
        machines=_ROOM.machines + bindparam("b_machines"),
        updated_at=bindparam("b_now"),
    )
)
# Giving back never fails for room: only what a machine took is given, so the
# held figures cannot go below zero (the CHECK constraints say so too).
_GIVE = (
    update(HOST_ROOMS)
    .where(_ROOM.host_id == bindparam("b_host"))
    .values(
        cores_held=_ROOM.cores_held - bindparam("b_cores"),
        memory_gib_held=_ROOM.memory_gib_held - bindparam("b_memory"),
        slots_held=_ROOM.slots_held - bindparam("b_slots"),
        machines=_ROOM.machines - bindparam("b_machines"),
        updated_at=bindparam("b_now"),
    )
)
_IN_USE = select(HOST_ROOMS).where(_ROOM.machines > 0)


def take_room(connection: Connection, claim: RoomClaim, slots: int, now: datetime) -> None:
    """Take ``claim``'s cores and memory and ``slots`` device slots of its host, for one
    new machine; :class:`HostFull`, having taken nothing, when the host lacks any of them."""
    know_hosts(connection, [claim.host], now)
    _change(connection, claim.host.host_id, claim.cores, claim.memory_gib, slots, 1, now)


def take_slots(connection: Connection, host_id: str, slots: int, now: datetime) -> None:
    """Take ``slots`` more device slots on a running machine's host (a grow)."""
    _change(connection, host_id, 0, 0, slots, 0, now)


def give_slots(connection: Connection, host_id: str, slots: int, now: datetime) -> None:
    """Give back ``slots`` device slots of a host that no one machine held (a split GPU's)."""
    connection.execute(
        _GIVE,
        {
            "b_host": host_id,
            "b_cores": 0,
            "b_memory": 0,
            "b_slots": slots,
            "b_machines": 0,
            "b_now": now,
        },
    )


def give_room(
    connection: Connection,
    machine: Row[Any],
    slots: int,
    now: datetime,
    *,
    ending: bool,
) -> None:
    """Give back ``slots`` device slots of ``machine``'s host and, if it is ``ending``, its
    cores, memory and place among the host's machines. Machines from before hosts
    were shared (``cores`` None) held their host's block instead: nothing here."""
    if machine.cores is None or machine.host_id is None:
        return
    cores, memory = (machine.cores, machine.memory_gib) if ending else (0, 0)
    connection.execute(
        _GIVE,
        {
            "b_host": machine.host_id,
            "b_cores": cores,
            "b_memory": memory,
            "b_slots": slots,
            "b_machines": 1 if ending else 0,
            "b_now": now,
        },
    )


def host_use(connection: Connection) -> dict[str, HostUse]:
    """What live machines hold on each host they are on."""
    return {
        row.host_id: HostUse(row.cores_held, row.memory_gib_held, row.slots_held, row.machines)
        for row in connection.execute(_IN_USE)
    }


def all_rooms(connection: Connection) -> list[tuple[HostRecord, HostUse]]:
    """Every host the ledger knows, and what live machines hold of it."""
    return [
        (
            HostRecord(row.host_id, row.block_id, Room(row.cores, row.memory_gib, row.slots)),
            HostUse(row.cores_held, row.memory_gib_held, row.slots_held, row.machines),
        )
        for row in connection.execute(select(HOST_ROOMS).order_by(_ROOM.host_id))
    ]


def device_slots(kinds: Iterable[str]) -> int:
    """Slots a machine's blocks take: one per device (a host's own block takes none)."""
    return sum(1 for kind in kinds if kind != "host")


def _change(
    connection: Connection,
    host_id: str,
    cores: int,
    memory: int,
    slots: int,
    machines: int,
    now: datetime,
) -> None:
    result = connection.execute(
        _TAKE,
        {
            "b_host": host_id,
            "b_cores": cores,
            "b_memory": memory,
            "b_slots": slots,
            "b_machines": machines,
            "b_now": now,
        },
    )
    if cast(CursorResult[Any], result).rowcount != 1:
        what = (
            f"{cores} cores, {memory} GiB and {slots} devices" if machines else f"{slots} devices"
        )
        raise HostFull(host_id, what)


def know_hosts(connection: Connection, hosts: Iterable[HostRecord], now: datetime) -> None:
    """A row for each host, with the capacity the fabric says.

    A host's capacity changes only with its hardware; a change that what its
    machines hold would not fit waits until they have ended, so what is held is
    never above what the row says the host has.
    """
    rows = [
        {
            "host_id": host.host_id,
            "block_id": host.block_id,
            "cores": host.capacity.cores,
            "memory_gib": host.capacity.memory_gib,
            "slots": host.capacity.slots,
            "cores_held": 0,
            "memory_gib_held": 0,
            "slots_held": 0,
            "machines": 0,
            "updated_at": now,
        }
        # In one order, so that two hubs' syncs lock the rows alike (PostgreSQL).
        for host in sorted(hosts, key=lambda h: h.host_id)
    ]
    if not rows:
        return
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    statement = insert(HOST_ROOMS)
    new = statement.excluded
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=["host_id"],
            set_={
                "block_id": new.block_id,
                "cores": new.cores,
                "memory_gib": new.memory_gib,
                "slots": new.slots,
            },
            # A change while machines are on the host only if what they hold still fits.
            where=(
                (_ROOM.machines == 0)
                | (
                    (_ROOM.cores_held <= new.cores)
                    & (_ROOM.memory_gib_held <= new.memory_gib)
                    & (_ROOM.slots_held <= new.slots)
                )
            )
            & (
                (_ROOM.cores != new.cores)
                | (_ROOM.memory_gib != new.memory_gib)
                | (_ROOM.slots != new.slots)
                | (_ROOM.block_id != new.block_id)
            ),
        ),
        rows,
    )
