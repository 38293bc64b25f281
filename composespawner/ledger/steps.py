"""Steps inside one ledger transaction that more than one part of the ledger takes,
and the conversions between rows and records.

Every function here runs on a connection whose transaction its caller owns;
none commits. The one-way lifecycle (invariant 7) is enforced here: every state
change is a compare-and-set on the state plus an event appended in the same
transaction, and entering a terminal state frees the machine's devices and
writes their usage records in that transaction too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta, tzinfo
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Row, select
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.ledger.errors import IllegalTransition, UnknownMachine
from composespawner.ledger.lifecycle import REQUESTED, TERMINAL, check_transition
from composespawner.ledger.records import (
    DeviceRecord,
    HoldableKind,
    Machine,
    ServerUse,
)
from composespawner.ledger.rooms import device_slots, give_room
from composespawner.ledger.shares import end_shares, shares_held
from composespawner.ledger.statements import (
    DEVICES,
    DEVICES_HELD_BY,
    FREE_DEVICES_OF,
    GPU_PERIODS,
    GPU_USE,
    HELD_BY_MACHINE,
    INSERT_EVENT,
    INSERT_USAGE,
    MACHINE_BY_ID,
    MACHINES,
    MOVE_MACHINE,
)
from composespawner.ledger.usage_sums import add_day_use, add_given_back

WEEK = timedelta(days=7)  # the window of the GPU-hours limit


def find_machine(connection: Connection, machine_id: str) -> Row[Any] | None:
    return connection.execute(MACHINE_BY_ID, {"b_machine_id": machine_id}).first()


def machine_row(connection: Connection, machine_id: str) -> Row[Any]:
    row = find_machine(connection, machine_id)
    if row is None:
        raise UnknownMachine(machine_id)
    return row


def live_row(connection: Connection, user: str, server: str) -> Row[Any] | None:
    query = select(MACHINES).where(
        MACHINES.c.user_name == user,
        MACHINES.c.server_name == server,
        MACHINES.c.state.not_in(TERMINAL),
    )
    return connection.execute(query).first()


def read_machine(connection: Connection, machine_id: str) -> Machine | None:
    row = find_machine(connection, machine_id)
    if row is None:
        return None
    return machine_holding(connection, row)


def read_live_machine(connection: Connection, user: str, server: str) -> Machine | None:
    row = live_row(connection, user, server)
    if row is None:
        return None
    return machine_holding(connection, row)


def machine_holding(connection: Connection, row: Row[Any]) -> Machine:
    """The machine's record with what it holds now: its blocks and its shares of GPUs."""
    return machine_records(connection, [row])[0]


def machine_records(connection: Connection, rows: Sequence[Row[Any]]) -> list[Machine]:
    """Records of machines with what each holds now, in two reads however many."""
    ids = [row.id for row in rows]
    held = held_blocks(connection, ids)
    shares = shares_held(connection, [row.id for row in rows if row.gpu_share])
    return [
        with_shares(machine_record(row, held.get(row.id, ())), shares.get(row.id, ()))
        for row in rows
    ]


def with_shares(machine: Machine, shares: Sequence[tuple[str, int]]) -> Machine:
    """``machine`` holding ``shares`` (GPU block, share size) besides its whole blocks."""
    if not shares:
        return machine
    shared = tuple(block for block, _ in shares)
    return dataclasses.replace(
        machine,
        block_ids=tuple(sorted((*machine.block_ids, *shared))),
        shared=shared,
        gpu_share=max(size for _, size in shares),  # one GPU, one size: it is its only share
    )


def move(
    connection: Connection, machine: Row[Any], to: str, now: datetime, message: str, **values: Any
) -> None:
    """Compare-and-set the machine's state and append the event for it."""
    move_through(connection, machine, [(to, message)], now, **values)


def move_through(
    connection: Connection,
    machine: Row[Any],
    steps: Sequence[tuple[str, str]],
    now: datetime,
    **values: Any,
) -> str:
    """Compare-and-set the machine through ``steps`` (state, message), each checked and
    given its event; one UPDATE however many steps. Returns the state it ends in."""
    at = machine.state
    events = []
    for to, message in steps:
        check_transition(at, to)
        events.append(event(machine.id, now, at, to, message))
        at = to
    result = connection.execute(
        MOVE_MACHINE,
        {
            "b_machine_id": machine.id,
            "b_from_state": machine.state,
            "state": at,
            "updated_at": now,
            **values,
        },
    )
    if rowcount(result) != 1:
        raise IllegalTransition(machine.state, at, "the machine changed state meanwhile")
    connection.execute(INSERT_EVENT, events)
    return at


def end_machine(
    connection: Connection,
    machine: Row[Any],
    to: str,
    now: datetime,
    message: str,
    failure: str | None,
    zone: tzinfo,
) -> Machine:
    """Enter a terminal state: free every device held and record who used it."""
    ended: dict[str, Any] = {"ended_at": now, **failure_values(failure)}
    move(connection, machine, to, now, message, **ended)
    if machine.gpu_share:
        end_shares(connection, machine, now, zone)
    held = connection.execute(DEVICES_HELD_BY, {"b_machine_id": machine.id}).all()
    if held:
        connection.execute(INSERT_USAGE, [usage_values(machine, d, now) for d in held])
        add_day_use(connection, machine.user_name, held, now, zone)
        connection.execute(FREE_DEVICES_OF, {"b_machine_id": machine.id})
    # What it gave back counts until now, whether or not it holds anything still.
    add_given_back(connection, machine, now, zone)
    # Its share of the host and the devices' slots go with the devices (invariant 10).
    give_room(connection, machine, device_slots(d.kind for d in held), now, ending=True)
    return moved(machine, to, now, (), **ended)


def gpu_hours_since(connection: Connection, user: str, since: datetime, now: datetime) -> float:
    """GPU-hours used by ``user`` from ``since`` to ``now``: ended machines and live ones."""
    seconds = 0.0
    periods = connection.execute(GPU_PERIODS, {"b_user": user, "b_since": since})
    for started, ended, fraction in periods:
        span = (min(ended or now, now) - max(started, since)).total_seconds()
        seconds += max(span, 0.0) * fraction
    return seconds / 3600


def gpu_use(connection: Connection, user: str) -> list[ServerUse]:
    """What each of ``user``'s live servers holds: GPUs, cores and memory."""
    servers: dict[str, ServerUse] = {}
    for server, gpus, cores, memory, share in connection.execute(GPU_USE, {"b_user": user}):
        # A server's machine that is ending and its next one both hold until the first ends.
        was = servers.get(server, ServerUse(server, 0))
        held = gpus + (1 / share if share else 0)  # a share of 1/n counts 1/n
        servers[server] = ServerUse(
            server, was.gpus + held, was.cores + cores, was.memory_gib + memory
        )
    return list(servers.values())


def held_by(connection: Connection, machine_id: str) -> list[str]:
    """The blocks the machine holds whole (its shares of GPUs: :func:`shares_held`)."""
    return list(connection.scalars(HELD_BY_MACHINE, {"b_machine_id": machine_id}))


def held_blocks(connection: Connection, machine_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    if not machine_ids:
        return {}
    query = (
        select(DEVICES.c.machine_id, DEVICES.c.block_id)
        .where(DEVICES.c.machine_id.in_(machine_ids))
        .order_by(DEVICES.c.block_id)
    )
    held: dict[str, list[str]] = {}
    for machine_id, block_id in connection.execute(query):
        held.setdefault(cast(str, machine_id), []).append(block_id)
    return {machine_id: tuple(blocks) for machine_id, blocks in held.items()}


def moved(machine: Row[Any], to: str, now: datetime, held: Sequence[str], **values: Any) -> Machine:
    """The record of ``machine`` after a move this transaction made: no need to read it back."""
    record = machine_record(machine, tuple(sorted(held)))
    return dataclasses.replace(record, state=to, updated_at=now, **values)


def upsert_devices(dialect: str) -> Any:
    insert_devices = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert_devices(DEVICES)
    inventory = ("kind", "model", "zone_ids", "chassis", "owner_group", "last_seen")
    return statement.on_conflict_do_update(
        index_elements=["block_id"], set_={name: statement.excluded[name] for name in inventory}
    )


def rowcount(result: Any) -> int:
    return cast(CursorResult[Any], result).rowcount


# ---------------------------------------------------------------------------
# Pure conversions
# ---------------------------------------------------------------------------


def failure_values(failure: str | None) -> dict[str, str]:
    return {} if failure is None else {"failure": failure}


def device_values(device: DeviceRecord, now: datetime) -> dict[str, Any]:
    if any("," in zone for zone in device.zones):
        raise ValueError(f"zone ids may not contain commas: {sorted(device.zones)}")
    return {
        "block_id": device.block_id,
        "kind": device.kind,
        "model": device.model,
        "zone_ids": ",".join(sorted(device.zones)),
        "chassis": device.chassis,
        "owner_group": device.owner_group,
        "first_seen": now,
        "last_seen": now,
    }


def device_record(row: Row[Any]) -> DeviceRecord:
    zones = frozenset(row.zone_ids.split(",")) if row.zone_ids else frozenset()
    kind = cast(HoldableKind, row.kind)
    return DeviceRecord(row.block_id, kind, row.model, zones, row.chassis, row.owner_group)


def new_machine(
    machine_id: str, user: str, server: str, request: dict[str, Any], now: datetime
) -> dict[str, Any]:
    return {
        "id": machine_id,
        "user_name": user,
        "server_name": server,
        "state": REQUESTED,
        "host_id": None,
        "zone": None,
        "request": copy.deepcopy(request),
        "failure": None,
        "created_at": now,
        "updated_at": now,
        "ended_at": None,
    }


def event(
    machine_id: str, at: datetime, from_state: str | None, to_state: str, message: str
) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "at": at,
        "from_state": from_state,
        "to_state": to_state,
        "message": message,
    }


def usage_values(machine: Row[Any], device: Row[Any], now: datetime) -> dict[str, Any]:
    return {
        "machine_id": machine.id,
        "user_name": machine.user_name,
        "server_name": machine.server_name,
        "block_id": device.block_id,
        "kind": device.kind,
        "model": device.model,
        "started_at": device.held_since or now,
        "ended_at": now,
    }


def machine_record(row: Row[Any], block_ids: tuple[str, ...]) -> Machine:
    # The tables' column names are the records' field names.
    columns = row._mapping
    return Machine(
        **{
            **columns,
            "request": copy.deepcopy(columns["request"]),
            "gpu_share": row.gpu_share or 1,
        },
        block_ids=block_ids,
    )
