"""Claims: taking devices for a machine, growing a running one, giving some back.

How the invariants hold here:

* one holder per device (1): ``devices.machine_id`` is the only holder column,
  and a claim sets it with ``UPDATE ... WHERE machine_id IS NULL``, checking
  the rowcount;
* co-located devices only for their owners and borrowers (2): :func:`_check_owned`;
* quota (3): a claim locks the user's ``quota_accounts`` row first, so two
  claims of one user cannot both count the GPUs (and cores and memory) in use
  before either takes its own (SQLite needs no row: ``BEGIN IMMEDIATE`` already
  holds the whole database's write lock for the transaction);
* no deadlock between claims of different users on PostgreSQL: device rows are
  locked in ``block_id`` order, and a claim's one host row after them;
* a host never over capacity (10): :mod:`composespawner.ledger.rooms`, in the
  claim's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.domain.quotas import NO_QUOTA, Quota
from composespawner.ledger.database import ZonedLedgerPart
from composespawner.ledger.errors import (
    DevicesTaken,
    NotOwner,
    NotRunning,
    ReservedForCohort,
    SharesDoNotGrow,
    UnknownDevices,
    UnknownMachine,
)
from composespawner.ledger.lifecycle import CLAIMED, RUNNING, check_transition
from composespawner.ledger.limits import Use, check_use
from composespawner.ledger.policy import registration_of
from composespawner.ledger.records import KeepFree, Machine, RoomClaim
from composespawner.ledger.rooms import device_slots, give_room, take_room, take_slots
from composespawner.ledger.shares import ShareClaim, leave_shares, shares_held, take_share
from composespawner.ledger.statements import (
    COHORTS,
    COLOCATED,
    DEVICES,
    DEVICES_HELD_BY,
    INSERT_EVENT,
    INSERT_USAGE,
    MACHINE_BY_ID,
    MACHINES,
    QUOTA_ACCOUNTS,
    SHARES,
)
from composespawner.ledger.steps import (
    WEEK,
    event,
    gpu_hours_since,
    gpu_use,
    held_by,
    machine_record,
    machine_row,
    move,
    moved,
    rowcount,
    usage_values,
    with_shares,
)
from composespawner.ledger.usage_sums import add_day_use

_FREE_THESE_OF = (
    update(DEVICES)
    .where(
        DEVICES.c.machine_id == bindparam("b_machine_id"),
        DEVICES.c.block_id.in_(bindparam("b_blocks", expanding=True)),
    )
    .values(machine_id=None, held_since=None)
)
# Sorted: two claims wanting overlapping blocks lock them in the same order.
_LOCK_DEVICES = (
    select(DEVICES)
    .where(DEVICES.c.block_id.in_(bindparam("b_blocks", expanding=True)))
    .order_by(DEVICES.c.block_id)
    .with_for_update()
)
_TAKE_FREE_DEVICES = (
    update(DEVICES)
    .where(
        DEVICES.c.block_id.in_(bindparam("b_blocks", expanding=True)),
        DEVICES.c.machine_id.is_(None),
        DEVICES.c.share_size.is_(None),  # a GPU held in shares is not free whole
    )
    .values(machine_id=bindparam("b_machine_id"), held_since=bindparam("b_now"))
)
_REGISTERED = select(COLOCATED).where(
    COLOCATED.c.block_id.in_(bindparam("b_blocks", expanding=True))
)
_FREE_OF_MODELS = select(func.count()).where(
    DEVICES.c.kind == "gpu",
    DEVICES.c.model.in_(bindparam("b_models", expanding=True)),
    DEVICES.c.machine_id.is_(None),
    DEVICES.c.share_size.is_(None),
    DEVICES.c.owner_group.is_(None),  # co-located GPUs are never the pool's
)
_HELD_UNDER_COHORT = (
    select(func.count())
    .select_from(DEVICES.join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id))
    .where(
        MACHINES.c.cohort == bindparam("b_cohort"),
        DEVICES.c.kind == "gpu",
        DEVICES.c.model.in_(bindparam("b_models", expanding=True)),
    )
)
# Shares members hold count 1/size each: by size, so the sum is exact on both databases.
_SHARES_HELD_UNDER_COHORT = (
    select(DEVICES.c.share_size, func.count())
    .select_from(SHARES)
    .join(MACHINES, SHARES.c.machine_id == MACHINES.c.id)
    .join(DEVICES, SHARES.c.block_id == DEVICES.c.block_id)
    .where(
        MACHINES.c.cohort == bindparam("b_cohort"),
        DEVICES.c.share_size.is_not(None),
        DEVICES.c.model.in_(bindparam("b_models", expanding=True)),
    )
    .group_by(DEVICES.c.share_size)
)
_LOCK_COHORT = select(COHORTS.c.name).where(COHORTS.c.name == bindparam("b_name")).with_for_update()


class Claims(ZonedLedgerPart):
    """Who takes which device: claims, growth and giving back (``Ledger.claim`` and the rest)."""

    def claim(
        self,
        machine_id: str,
        *,
        host_id: str | None,
        zone: str,
        block_ids: Sequence[str],
        quota: Quota = NO_QUOTA,
        groups: frozenset[str] = frozenset(),
        host_block: str | None = None,
        keep_free: Sequence[KeepFree] = (),
        cohort: str | None = None,
        room: RoomClaim | None = None,
        share: ShareClaim | None = None,
    ) -> Machine:
        """Take ``block_ids`` (and ``host_block``) for a requested machine: all or nothing.

        In one transaction: the user's quota row is locked, the blocks are
        checked (known, allowed to ``groups``, free, and within ``quota``
        counting the user's other live machines and GPU-hours) and taken, and
        the machine moves to ``claimed``. ``keep_free``: cohort reservations the
        user is outside of, checked here so that racing claims cannot jointly
        take reserved GPUs; ``cohort``: the reservation a member claims under.
        ``room``: the machine's share of a shared host (cores, memory, and a
        slot per device), taken compare-and-set with the devices (invariant 10).
        ``share``: a slot of one GPU held in shares, joined or split (ledger/shares.py);
        it counts 1/size GPU against the quota, and the GPU takes a device slot on the
        host only when this claim splits it.
        Raises :class:`UnknownDevices`, :class:`NotOwner`, :class:`QuotaExceeded`,
        :class:`ReservedForCohort`, :class:`DevicesTaken`, :class:`HostFull` or
        :class:`IllegalTransition`, having changed nothing.
        """
        wanted = _claim_set(block_ids, host_block)
        shared = (share.block_id,) if share else ()
        now = self._now()
        with self._write() as connection:
            machine = machine_row(connection, machine_id)
            check_transition(machine.state, CLAIMED)
            _lock_quota_account(connection, machine.user_name, now)
            devices = _lock_devices(connection, (*wanted, *shared))
            _check_known((*wanted, *shared), devices)
            _check_owned(connection, machine.user_name, devices, groups, now)
            whole = [device for device in devices if device.block_id not in shared]
            asked = sum(1 for device in whole if device.kind == "gpu") + (
                1 / share.size if share else 0
            )
            use = _use(connection, machine, quota, now)
            # A machine without room holds its host's block (an unshared host): no share.
            cores, memory = (room.cores, room.memory_gib) if room else (0, 0)
            check_use(machine.user_name, quota, asked, use, cores=cores, memory_gib=memory)
            splits = share is not None and _splits(devices, share)
            for keep in keep_free:
                taking = whole if not splits else devices
                _check_keep_free(connection, machine.user_name, keep, taking)
            _take_devices(connection, machine_id, wanted, whole, now)
            opened = share is not None and take_share(connection, machine_id, share, now)
            changes: dict[str, Any] = {"host_id": host_id, "zone": zone, "cohort": cohort}
            if share is not None:
                changes["gpu_share"] = share.size
            if room is not None:
                slots = device_slots(d.kind for d in whole) + opened
                take_room(connection, room, slots, now)
                changes |= {"cores": room.cores, "memory_gib": room.memory_gib}
            message = f"claimed {', '.join(wanted) or 'nothing'} on {host_id} in {zone}"
            if share is not None:
                message += f" and 1/{share.size} of {share.block_id}"
            if room is not None:
                message += f" with {room.cores} cores and {room.memory_gib} GiB"
            move(connection, machine, CLAIMED, now, message, **changes)
            claimed = moved(machine, CLAIMED, now, wanted, **changes)
            return with_shares(claimed, [(share.block_id, share.size)] if share else ())

    def leave_shares(self, machine_id: str) -> tuple[str, ...]:
        """See ``Ledger.leave_shares``."""
        with self._write() as connection:
            return leave_shares(connection, machine_id)

    def grow(
        self,
        machine_id: str,
        *,
        block_ids: Sequence[str],
        quota: Quota = NO_QUOTA,
        groups: frozenset[str] = frozenset(),
        keep_free: Sequence[KeepFree] = (),
    ) -> Machine:
        """Add ``block_ids`` to a running machine: all or nothing, checked as a claim is.

        The machine's row is locked, so a stop that starts meanwhile waits for
        this transaction (and then gives the new devices back with the rest),
        or this one sees the machine stopping and refuses. Quota counts the
        machine's GPUs with the new ones as one server's. Raises
        :class:`NotRunning` besides what :meth:`claim` raises, having changed nothing.
        """
        wanted = tuple(sorted(set(block_ids)))
        now = self._now()
        with self._write() as connection:
            machine = _lock_running(connection, machine_id)
            if shares_held(connection, [machine_id]):
                raise SharesDoNotGrow(machine_id)
            _lock_quota_account(connection, machine.user_name, now)
            devices = _lock_devices(connection, wanted)
            _check_known(wanted, devices)
            _check_owned(connection, machine.user_name, devices, groups, now)
            held = connection.execute(DEVICES_HELD_BY, {"b_machine_id": machine_id}).all()
            gpus = sum(1 for device in (*held, *devices) if device.kind == "gpu")
            check_use(machine.user_name, quota, gpus, _use(connection, machine, quota, now))
            for keep in keep_free:
                _check_keep_free(connection, machine.user_name, keep, devices)
            _take_devices(connection, machine_id, wanted, devices, now)
            if machine.cores is not None and machine.host_id is not None:
                take_slots(connection, machine.host_id, device_slots(d.kind for d in devices), now)
            message = f"grew by {', '.join(wanted)}"
            connection.execute(INSERT_EVENT, event(machine_id, now, RUNNING, RUNNING, message))
            return machine_record(machine, tuple(held_by(connection, machine_id)))

    def give_back(
        self, machine_id: str, block_ids: Sequence[str], message: str, *, used: bool = True
    ) -> Machine:
        """Free some of a live machine's devices (the fabric detached them, or never
        attached them: ``used`` False records no use of them). Blocks the machine does
        not hold are left alone."""
        now = self._now()
        with self._write() as connection:
            machine = machine_row(connection, machine_id)
            mine = [
                device
                for device in connection.execute(DEVICES_HELD_BY, {"b_machine_id": machine_id})
                if device.block_id in set(block_ids)
            ]
            if mine:
                if used:
                    connection.execute(INSERT_USAGE, [usage_values(machine, d, now) for d in mine])
                    add_day_use(connection, machine.user_name, mine, now, self._usage_zone)
                connection.execute(
                    _FREE_THESE_OF,
                    {"b_machine_id": machine_id, "b_blocks": [d.block_id for d in mine]},
                )
                give_room(
                    connection, machine, device_slots(d.kind for d in mine), now, ending=False
                )
                given = ", ".join(d.block_id for d in mine)
                connection.execute(
                    INSERT_EVENT,
                    event(machine_id, now, machine.state, machine.state, f"{message}: {given}"),
                )
            return machine_record(machine, tuple(held_by(connection, machine_id)))


def _lock_running(connection: Connection, machine_id: str) -> Row[Any]:
    """The machine's row, locked until the transaction ends; NotRunning unless it runs."""
    row = connection.execute(MACHINE_BY_ID.with_for_update(), {"b_machine_id": machine_id}).first()
    if row is None:
        raise UnknownMachine(machine_id)
    if row.state != RUNNING:
        raise NotRunning(machine_id, row.server_name, row.state)
    return row


def _lock_quota_account(connection: Connection, user: str, now: datetime) -> None:
    """Create-if-absent, then lock, the user's account row: their claims queue up here."""
    dialect = connection.dialect.name
    if dialect == "sqlite":
        return  # BEGIN IMMEDIATE took the database's write lock: every claim queues already
    insert_account = postgresql.insert if dialect == "postgresql" else sqlite.insert
    connection.execute(
        insert_account(QUOTA_ACCOUNTS)
        .values(user_name=user, created_at=now)
        .on_conflict_do_nothing(index_elements=["user_name"])
    )
    connection.execute(
        select(QUOTA_ACCOUNTS.c.user_name)
        .where(QUOTA_ACCOUNTS.c.user_name == user)
        .with_for_update()
    )


def _lock_devices(connection: Connection, wanted: Sequence[str]) -> list[Row[Any]]:
    return list(connection.execute(_LOCK_DEVICES, {"b_blocks": list(wanted)}))


def _check_known(wanted: Sequence[str], devices: Sequence[Row[Any]]) -> None:
    unknown = set(wanted) - {device.block_id for device in devices}
    if unknown:
        raise UnknownDevices(unknown)


def _check_owned(
    connection: Connection,
    user: str,
    devices: Sequence[Row[Any]],
    groups: frozenset[str],
    now: datetime,
) -> None:
    """Co-located devices only for their owners and borrowers (invariant 2).

    A portal registration (and its loan) decides; otherwise the device's owner
    group as the hubs synced it from the catalog.
    """
    owned = [d for d in devices if d.owner_group]
    if not owned:
        return
    registered = {
        row.block_id: row
        for row in connection.execute(_REGISTERED, {"b_blocks": [d.block_id for d in owned]})
    }
    refused = []
    for device in owned:
        row = registered.get(device.block_id)
        if row is None:
            allowed = device.owner_group in groups
        else:
            allowed = registration_of(row).usable_by(user, groups, now)
        if not allowed:
            refused.append(device.block_id)
    if refused:
        raise NotOwner(user, refused)


def _take_devices(
    connection: Connection,
    machine_id: str,
    wanted: Sequence[str],
    devices: Sequence[Row[Any]],
    now: datetime,
) -> None:
    taken = [device.block_id for device in devices if device.machine_id is not None]
    if taken:
        raise DevicesTaken(taken)
    result = connection.execute(
        _TAKE_FREE_DEVICES, {"b_blocks": list(wanted), "b_machine_id": machine_id, "b_now": now}
    )
    if rowcount(result) != len(wanted):
        # The compare-and-set is the guarantee; the check above only names the culprits.
        raise DevicesTaken(wanted, reason="not all free")


def _check_keep_free(
    connection: Connection, user: str, keep: KeepFree, devices: Sequence[Row[Any]]
) -> None:
    """Refuse a claim that would leave a reservation's members short (see KeepFree)."""
    taking = sum(1 for d in devices if d.kind == "gpu" and d.model in keep.models)
    if not taking:
        return
    # Outsiders' claims of a reserved model take turns on the cohort's row, so two of
    # them cannot each see the same free GPUs (SQLite's write lock does this already).
    if connection.dialect.name == "postgresql":
        connection.execute(_LOCK_COHORT, {"b_name": keep.cohort})
    models = {"b_models": list(keep.models), "b_cohort": keep.cohort}
    free = connection.execute(_FREE_OF_MODELS, models).scalar_one()
    members = connection.execute(_HELD_UNDER_COHORT, models).scalar_one() + sum(
        n / size for size, n in connection.execute(_SHARES_HELD_UNDER_COHORT, models)
    )
    if free - taking < keep.gpus - members:
        raise ReservedForCohort(user, keep, free)


def _use(connection: Connection, machine: Row[Any], quota: Quota, now: datetime) -> Use:
    """What the machine's user holds besides it; GPU-hours read only where a limit needs them."""
    user, server = machine.user_name, machine.server_name
    servers = [use for use in gpu_use(connection, user) if use.server != server]
    if quota.gpu_hours_week.value is None:
        return Use(servers)
    return Use(servers, gpu_hours_since(connection, user, now - WEEK, now))


def _splits(devices: Sequence[Row[Any]], share: ShareClaim) -> bool:
    """Whether a claim of ``share`` would split its GPU (rather than join its shares)."""
    gpu = next(d for d in devices if d.block_id == share.block_id)
    return gpu.share_size is None


def _claim_set(block_ids: Sequence[str], host_block: str | None) -> tuple[str, ...]:
    wanted = [*block_ids, *([host_block] if host_block is not None else [])]
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"a claim names a block twice: {sorted(wanted)}")
    return tuple(sorted(wanted))
