"""What the ledger knows, read: machines, devices and their holders, events, runs, usage.

Each read is one short transaction that changes nothing and returns frozen records.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, tzinfo
from typing import Any, cast

from sqlalchemy import Connection, Engine, Row, func, select, text

from composespawner.domain.rooms import HostUse
from composespawner.domain.usage import DayUse, Period
from composespawner.ledger.database import ZonedLedgerPart
from composespawner.ledger.models import LIVE_MACHINE_WHERE
from composespawner.ledger.records import (
    DeviceRecord,
    Holding,
    Holds,
    HostRecord,
    Machine,
    MachineEvent,
    RunManifest,
    ServerUse,
    ShareHolding,
    UsageRecord,
)
from composespawner.ledger.rooms import all_rooms, host_use
from composespawner.ledger.shares import split_gpus
from composespawner.ledger.statements import (
    DEVICES,
    EVENTS,
    MACHINES,
    RECONCILE_ACTIONS,
    RUN_MANIFESTS,
    SHARES,
    USAGE,
)
from composespawner.ledger.steps import (
    WEEK,
    device_record,
    find_machine,
    gpu_hours_since,
    gpu_use,
    machine_holding,
    machine_records,
    read_live_machine,
    read_machine,
)
from composespawner.ledger.usage_sums import UsageSums, UserSums, day_uses, live_uses, usage_sums

# What makes a DeviceRecord: the first columns of the devices table.
_DEVICE_FIELDS = 6
_HOLDINGS = (
    select(
        DEVICES,
        MACHINES.c.user_name,
        MACHINES.c.server_name,
        MACHINES.c.state,
        MACHINES.c.host_id,
        MACHINES.c.cohort,
    )
    .outerjoin(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
    .order_by(DEVICES.c.chassis, DEVICES.c.kind, DEVICES.c.block_id)
)
_SHARE_SIZE = list(DEVICES.c.keys()).index("share_size")
_SHARE_HOLDERS = (
    select(
        SHARES.c.block_id,
        SHARES.c.machine_id,
        MACHINES.c.user_name,
        MACHINES.c.server_name,
        MACHINES.c.state,
        MACHINES.c.host_id,
        MACHINES.c.cohort,
        SHARES.c.held_since,
        SHARES.c.leaving,
    )
    .join(MACHINES, SHARES.c.machine_id == MACHINES.c.id)
    .order_by(SHARES.c.block_id, SHARES.c.held_since, SHARES.c.machine_id)
)


class Queries(ZonedLedgerPart):
    """The ledger's reads (``Ledger.machine``, ``Ledger.holdings`` and the rest)."""

    def __init__(
        self,
        engine: Engine,
        write: Callable[[], AbstractContextManager[Connection]],
        now: Callable[[], datetime],
        usage_zone: tzinfo,
    ) -> None:
        super().__init__(engine, write, now, usage_zone)
        self._device_records: dict[tuple[Any, ...], DeviceRecord] = {}
        self._user_sums = UserSums()

    def devices(self, block_ids: Collection[str] | None = None) -> list[DeviceRecord]:
        """Every device the ledger knows, or those of ``block_ids``."""
        query = select(DEVICES).order_by(DEVICES.c.block_id)
        if block_ids is not None:
            query = query.where(DEVICES.c.block_id.in_(list(block_ids)))
        with self._engine.begin() as connection:
            return [self._device_record(row) for row in connection.execute(query)]

    def machine(self, machine_id: str) -> Machine | None:
        with self._engine.begin() as connection:
            return read_machine(connection, machine_id)

    def live_machine(self, user: str, server: str) -> Machine | None:
        with self._engine.begin() as connection:
            return read_live_machine(connection, user, server)

    def live_machines(self, user: str | None = None) -> list[Machine]:
        # The partial index's own condition, as literals: SQLite then reads the live
        # machines from that index instead of every machine there ever was.
        query = select(MACHINES).where(text(LIVE_MACHINE_WHERE))
        if user is not None:
            query = query.where(MACHINES.c.user_name == user)
        query = query.order_by(MACHINES.c.user_name, MACHINES.c.server_name)
        with self._engine.begin() as connection:
            rows = connection.execute(query).all()
            return machine_records(connection, rows)

    def holdings(self, *, held_only: bool = False) -> list[Holding]:
        """Every device the ledger knows (or only those held) and, where one holds it,
        the machine: one read."""
        held = DEVICES.c.machine_id.is_not(None) | DEVICES.c.share_size.is_not(None)
        query = _HOLDINGS.where(held) if held_only else _HOLDINGS
        with self._engine.begin() as connection:
            shares: dict[str, list[ShareHolding]] = {}
            for block, *holder in connection.execute(_SHARE_HOLDERS):
                shares.setdefault(block, []).append(ShareHolding(*holder))
            return [
                _holding(row, self._device_record(row), shares) for row in connection.execute(query)
            ]

    def _device_record(self, row: Row[Any]) -> DeviceRecord:
        """The record of a devices row (its columns first), made once per distinct row:
        an inventory read is thousands of rows that rarely change."""
        key = tuple(row[:_DEVICE_FIELDS])
        record = self._device_records.get(key)
        if record is None:
            record = self._device_records[key] = device_record(row)
        return record

    def gpu_use(self, user: str) -> list[ServerUse]:
        """GPUs held by each of ``user``'s live servers (0 for a server holding none)."""
        with self._engine.begin() as connection:
            return gpu_use(connection, user)

    def gpu_hours(self, user: str, within: timedelta = WEEK) -> float:
        """GPU-hours ``user`` used in the last ``within``, running machines' so far included."""
        now = self._now()
        with self._engine.begin() as connection:
            return gpu_hours_since(connection, user, now - within, now)

    def holders(self) -> dict[str, str]:
        """block_id → machine_id for every held block."""
        return self._blocks_with("machine_id")

    def held_by(self, machine_id: str) -> list[str]:
        with self._engine.begin() as connection:
            row = find_machine(connection, machine_id)
            return [] if row is None else list(machine_holding(connection, row).block_ids)

    def free_blocks(self) -> set[str]:
        query = select(DEVICES.c.block_id).where(
            DEVICES.c.machine_id.is_(None), DEVICES.c.share_size.is_(None)
        )
        with self._engine.begin() as connection:
            return set(connection.scalars(query))

    def device_owners(self) -> dict[str, str]:
        """block_id → owner group, for co-located devices."""
        return self._blocks_with("owner_group")

    def holds(self) -> Holds:
        """What placement reads of the ledger, read together: block_id → machine_id for
        every held block (a split GPU's: its first holder's, or its closer's), what live
        machines hold on each host they are on, and the GPUs held in shares (the claims'
        compare-and-set keeps them right; these only guide placement)."""
        query = select(DEVICES.c.block_id, DEVICES.c.machine_id).where(
            DEVICES.c.machine_id.is_not(None)
        )
        with self._engine.begin() as connection:
            held = {block: cast(str, found) for block, found in connection.execute(query)}
            split = split_gpus(connection)
            held |= {block: f"shared on {gpu.host_id}" for block, gpu in split.items()}
            return Holds(held, host_use(connection), split)

    def host_rooms(self) -> list[tuple[HostRecord, HostUse]]:
        """Every host the ledger knows, and what live machines hold of it."""
        with self._engine.begin() as connection:
            return all_rooms(connection)

    def _blocks_with(self, column: str) -> dict[str, str]:
        """block_id → ``column`` for every device where it is set."""
        value = DEVICES.c[column]
        query = select(DEVICES.c.block_id, value).where(value.is_not(None))
        with self._engine.begin() as connection:
            return {block: cast(str, found) for block, found in connection.execute(query)}

    def run_manifest(self, machine_id: str) -> RunManifest | None:
        query = select(RUN_MANIFESTS).where(RUN_MANIFESTS.c.machine_id == machine_id)
        with self._engine.begin() as connection:
            row = connection.execute(query).first()
        return None if row is None else _run_manifest(row)

    def run_manifests(self, user: str, limit: int = 20) -> list[RunManifest]:
        """``user``'s latest runs, newest first."""
        query = (
            select(RUN_MANIFESTS)
            .where(RUN_MANIFESTS.c.user_name == user)
            .order_by(RUN_MANIFESTS.c.started_at.desc())
            .limit(limit)
        )
        with self._engine.begin() as connection:
            return [_run_manifest(row) for row in connection.execute(query)]

    def events(self, machine_id: str) -> list[MachineEvent]:
        query = select(EVENTS).where(EVENTS.c.machine_id == machine_id).order_by(EVENTS.c.id)
        with self._engine.begin() as connection:
            return [MachineEvent(**row._mapping) for row in connection.execute(query)]

    def usage_sums(self, period: Period) -> UsageSums:
        """GPU-seconds in ``period``: ended use per day and model and per user, and
        running machines' use so far (see :func:`composespawner.domain.usage.usage_report`)."""
        with self._snapshot() as connection:
            return usage_sums(connection, period, self._now(), self._usage_zone, self._user_sums)

    def day_uses(self, period: Period) -> list[DayUse]:
        """Every day, user and model in ``period`` with its use: ended, then running so far."""
        with self._snapshot() as connection:
            return day_uses(connection, period) + live_uses(
                connection, period, self._now(), self._usage_zone
            )

    def usage(self, user: str | None = None) -> list[UsageRecord]:
        query = select(USAGE).order_by(USAGE.c.id)
        if user is not None:
            query = query.where(USAGE.c.user_name == user)
        with self._engine.begin() as connection:
            return [UsageRecord(**row._mapping) for row in connection.execute(query)]

    def reconcile_action_counts(self) -> dict[tuple[str, str], int]:
        """(kind, outcome) → how many the reconciler has recorded, ever."""
        columns = (RECONCILE_ACTIONS.c.kind, RECONCILE_ACTIONS.c.outcome)
        query = select(*columns, func.count()).group_by(*columns)
        with self._engine.begin() as connection:
            return {(kind, outcome): n for kind, outcome, n in connection.execute(query)}


def _holding(row: Row[Any], device: DeviceRecord, shares: dict[str, list[ShareHolding]]) -> Holding:
    # By position (the columns of _HOLDINGS): thousands of rows a read, and a Row's
    # attributes cost as much as building the record.
    values = tuple(row)
    machine_id, held_since, _, last_seen = values[6:10]
    user, server, state, host, cohort = values[-5:]
    size = values[_SHARE_SIZE]
    if size is not None:
        holders = tuple(shares.get(device.block_id, ()))
        return Holding(device, last_seen, share_size=size, shares=holders)
    return Holding(device, last_seen, machine_id, held_since, user, server, state, host, cohort)


def _run_manifest(row: Row[Any]) -> RunManifest:
    columns = row._mapping
    return RunManifest(**{**columns, "manifest": copy.deepcopy(columns["manifest"])})
