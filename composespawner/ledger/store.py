"""The Ledger: who holds which device, and every machine's lifecycle.

Each public method is one short transaction and returns frozen records, never
ORM objects, so the spawner can call it from worker threads
(``asyncio.to_thread``) and keep the results. A ``Ledger`` may be shared by
threads; several ``Ledger`` objects (hub processes) may share one database.

How the invariants hold:

* one holder per device (1): ``devices.machine_id`` is the only holder column,
  and a claim sets it with ``UPDATE ... WHERE machine_id IS NULL``, checking
  the rowcount;
* quota (3): a claim locks the user's ``quota_accounts`` row first, so two
  claims of one user cannot both count the GPUs in use before either takes
  its own (SQLite needs no row: ``BEGIN IMMEDIATE`` already holds the whole
  database's write lock for the transaction);
* no deadlock between claims of different users on PostgreSQL: device rows are
  locked in ``block_id`` order;
* one-way lifecycle (7): every state change is a compare-and-set on the state
  plus an event appended in the same transaction; entering a terminal state
  frees the machine's devices and writes their usage records in the same
  transaction too, so terminal always means holds nothing.

Transactions are SQLAlchemy Core statements on a connection, not ORM
sessions: the ledger sits on the hub's spawn path, and the unit of work and
identity map cost several times more CPU than the statements themselves. The
statements every spawn runs are built once, with bind parameters, so each
execution skips building and hashing them again. The ORM models in
``models.py`` still define the tables and their types.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Engine,
    Row,
    Table,
    and_,
    bindparam,
    event,
    func,
    insert,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from composespawner.domain.quotas import NO_QUOTA, Quota
from composespawner.domain.usage import DayUse, Period
from composespawner.ledger import migrate
from composespawner.ledger.database import create_ledger_engine, writing
from composespawner.ledger.errors import (
    DevicesTaken,
    IllegalTransition,
    NotOwner,
    NotRunning,
    ReservedForCohort,
    SchemaNotCurrent,
    ServerBusy,
    UnknownDevices,
    UnknownMachine,
)
from composespawner.ledger.lifecycle import (
    CLAIMED,
    REQUESTED,
    RUNNING,
    TERMINAL,
    check_transition,
)
from composespawner.ledger.limits import Use, check_use
from composespawner.ledger.models import (
    CohortRow,
    ColocatedRow,
    DeviceRow,
    MachineEventRow,
    MachineRow,
    QuotaAccountRow,
    ReconcileActionRow,
    RunManifestRow,
    UsageRecordRow,
    refuse_event_rewrites,
)
from composespawner.ledger.policy import Policy, registration_of
from composespawner.ledger.records import (
    DeviceRecord,
    HoldableKind,
    Holding,
    KeepFree,
    Machine,
    MachineEvent,
    RunManifest,
    ServerUse,
    UsageRecord,
    utcnow,
)
from composespawner.ledger.submissions import Submissions
from composespawner.ledger.usage_sums import (
    UsageSums,
    UserSums,
    add_day_use,
    day_uses,
    live_uses,
    usage_sums,
)

WEEK = timedelta(days=7)  # the window of the GPU-hours limit


class Ledger:
    """The allocation ledger on one database URL (``sqlite:///...`` or ``postgresql+psycopg://``).

    ``clock`` must return aware datetimes; ``timeout`` (seconds) bounds
    connecting and every wait for a lock held by another transaction;
    ``usage_zone`` is where usage reports' days begin (the site's time zone).
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], datetime] = utcnow,
        echo: bool = False,
        timeout: float = 10.0,
        usage_zone: tzinfo = UTC,
    ) -> None:
        self._clock = clock
        self._usage_zone = usage_zone
        self._engine = create_ledger_engine(url, timeout=timeout, echo=echo)
        self._writing = writing(self._engine)
        # SQLite has one write lock per file, and a writer that finds it taken
        # polls for it with sleeps of up to 100 ms. Our own threads take turns
        # on a lock of ours instead, which hands over at once; the busy timeout
        # still covers other processes (the reconciler, another hub).
        self._write_turn: AbstractContextManager[Any] = (
            threading.Lock() if self.is_local_file else nullcontext()
        )
        event.listen(self._engine, "before_execute", refuse_event_rewrites)
        self.policy = Policy(self._engine, self._write, self._now)
        self.submissions = Submissions(self._engine, self._write, self._now)
        self._device_records: dict[tuple[Any, ...], DeviceRecord] = {}
        self._user_sums = UserSums()

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def is_local_file(self) -> bool:
        """SQLite: calls are local transactions, with no network round trip."""
        return self._engine.dialect.name == "sqlite"

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A writing transaction, committed on leaving (rolled back on an exception)."""
        with self._write_turn, self._writing.begin() as connection:
            yield connection

    # -- schema ---------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with the packaged Alembic migrations."""
        with self._write() as connection:
            migrate.upgrade(connection, revision)

    def schema_revision(self) -> str | None:
        with self._engine.connect() as connection:
            return migrate.current_revision(connection)

    def check_schema(self) -> None:
        """Raise :class:`SchemaNotCurrent` unless the schema is the one this code expects."""
        found, wanted = self.schema_revision(), migrate.head_revision()
        if found != wanted:
            raise SchemaNotCurrent(found, wanted)

    def close(self) -> None:
        self._engine.dispose()

    # -- inventory ------------------------------------------------------------

    def sync_devices(self, devices: Iterable[DeviceRecord]) -> None:
        """Record the devices the fabric reports; never changes who holds them.

        Devices missing from ``devices`` keep their rows (and holders): a device
        that vanished from one inventory is not known to be gone.
        """
        now = self._now()
        rows = {device.block_id: _device_values(device, now) for device in devices}
        if not rows:
            return
        with self._write() as connection:
            connection.execute(_upsert_devices(self._engine.dialect.name), list(rows.values()))

    def devices(self, block_ids: Collection[str] | None = None) -> list[DeviceRecord]:
        """Every device the ledger knows, or those of ``block_ids``."""
        query = select(DEVICES).order_by(DEVICES.c.block_id)
        if block_ids is not None:
            query = query.where(DEVICES.c.block_id.in_(list(block_ids)))
        with self._engine.begin() as connection:
            return [self._device_record(row) for row in connection.execute(query)]

    # -- lifecycle --------------------------------------------------------------

    def request_machine(self, user: str, server: str, request: dict[str, Any]) -> str:
        """Record a new machine for ``user``'s ``server`` in state ``requested``; its id.

        Raises :class:`ServerBusy` if that server already has a live machine.
        """
        json.dumps(request)  # refuse what cannot be stored before touching the database
        now = self._now()
        machine_id = uuid.uuid4().hex
        try:
            with self._write() as connection:
                connection.execute(
                    _INSERT_MACHINE, _new_machine(machine_id, user, server, request, now)
                )
                connection.execute(
                    _INSERT_EVENT, _event(machine_id, now, None, REQUESTED, "requested")
                )
        except IntegrityError as err:
            # The unique index on live (user, server): that server has a live machine
            # (ours from an earlier start, or a concurrent request's).
            live_machine = self.live_machine(user, server)
            if live_machine is None:
                raise
            raise ServerBusy(user, server, live_machine.id, live_machine.state) from err
        return machine_id

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
    ) -> Machine:
        """Take ``block_ids`` (and ``host_block``) for a requested machine: all or nothing.

        In one transaction: the user's quota row is locked, the blocks are
        checked (known, allowed to ``groups``, free, and within ``quota``
        counting the user's other live machines and GPU-hours) and taken, and
        the machine moves to ``claimed``. ``keep_free``: cohort reservations the
        user is outside of, checked here so that racing claims cannot jointly
        take reserved GPUs; ``cohort``: the reservation a member claims under.
        Raises :class:`UnknownDevices`, :class:`NotOwner`, :class:`QuotaExceeded`,
        :class:`ReservedForCohort`, :class:`DevicesTaken` or
        :class:`IllegalTransition`, having changed nothing.
        """
        wanted = _claim_set(block_ids, host_block)
        now = self._now()
        with self._write() as connection:
            machine = _machine_row(connection, machine_id)
            check_transition(machine.state, CLAIMED)
            _lock_quota_account(connection, machine.user_name, now)
            devices = _lock_devices(connection, wanted)
            _check_known(wanted, devices)
            _check_owned(connection, machine.user_name, devices, groups, now)
            asked = sum(1 for device in devices if device.kind == "gpu")
            use = _use(connection, machine, quota, now)
            check_use(machine.user_name, quota, asked, use)
            for keep in keep_free:
                _check_keep_free(connection, machine.user_name, keep, devices)
            _take_devices(connection, machine_id, wanted, devices, now)
            message = f"claimed {', '.join(wanted) or 'nothing'} on {host_id} in {zone}"
            changes = {"host_id": host_id, "zone": zone, "cohort": cohort}
            _move(connection, machine, CLAIMED, now, message, **changes)
            return _moved(machine, CLAIMED, now, wanted, **changes)

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
            _lock_quota_account(connection, machine.user_name, now)
            devices = _lock_devices(connection, wanted)
            _check_known(wanted, devices)
            _check_owned(connection, machine.user_name, devices, groups, now)
            held = connection.execute(_DEVICES_HELD_BY, {"b_machine_id": machine_id}).all()
            gpus = sum(1 for device in (*held, *devices) if device.kind == "gpu")
            check_use(machine.user_name, quota, gpus, _use(connection, machine, quota, now))
            for keep in keep_free:
                _check_keep_free(connection, machine.user_name, keep, devices)
            _take_devices(connection, machine_id, wanted, devices, now)
            message = f"grew by {', '.join(wanted)}"
            connection.execute(_INSERT_EVENT, _event(machine_id, now, RUNNING, RUNNING, message))
            return _machine_record(machine, tuple(_held_by(connection, machine_id)))

    def give_back(
        self, machine_id: str, block_ids: Sequence[str], message: str, *, used: bool = True
    ) -> Machine:
        """Free some of a live machine's devices (the fabric detached them, or never
        attached them: ``used`` False records no use of them). Blocks the machine does
        not hold are left alone."""
        now = self._now()
        with self._write() as connection:
            machine = _machine_row(connection, machine_id)
            mine = [
                device
                for device in connection.execute(_DEVICES_HELD_BY, {"b_machine_id": machine_id})
                if device.block_id in set(block_ids)
            ]
            if mine:
                if used:
                    connection.execute(
                        _INSERT_USAGE, [_usage_values(machine, d, now) for d in mine]
                    )
                    add_day_use(connection, machine.user_name, mine, now, self._usage_zone)
                connection.execute(
                    _FREE_THESE_OF,
                    {"b_machine_id": machine_id, "b_blocks": [d.block_id for d in mine]},
                )
                given = ", ".join(d.block_id for d in mine)
                connection.execute(
                    _INSERT_EVENT,
                    _event(machine_id, now, machine.state, machine.state, f"{message}: {given}"),
                )
            return _machine_record(machine, tuple(_held_by(connection, machine_id)))

    def transition(
        self,
        machine_id: str,
        to: str,
        message: str = "",
        *,
        failure: str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Machine:
        """Move a machine one step along the lifecycle; ``failure`` records a user-facing reason.

        Entering ``released`` or ``failed`` frees the machine's devices exactly as
        :meth:`release` does. Only :meth:`claim` enters ``claimed``. ``manifest``:
        what the machine's server runs on (composespawner.domain.manifest), kept with the
        step into ``running``, in its transaction.
        """
        if to == CLAIMED:
            raise ValueError("a machine enters 'claimed' only through claim(), which takes devices")
        if to not in TERMINAL:
            return self.advance(machine_id, (to, message), failure=failure, manifest=manifest)
        if manifest is not None:
            raise ValueError("a run manifest goes with a step into a live state")
        now = self._now()
        with self._write() as connection:
            machine = _machine_row(connection, machine_id)
            return _end(connection, machine, to, now, message, failure, self._usage_zone)

    def advance(
        self,
        machine_id: str,
        *steps: tuple[str, str],
        failure: str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Machine:
        """Take several non-terminal steps (state, message) in one transaction.

        Each step is checked as :meth:`transition` checks it and gets its own
        event; either all are taken or none. For steps that follow each other
        with nothing in between (``composed``, then ``launching``), this is one
        commit (and one update of the machine's row) instead of one per step.
        """
        if not steps:
            raise ValueError("advance needs at least one step")
        bad = [to for to, _ in steps if to == CLAIMED or to in TERMINAL]
        if bad:
            raise ValueError(f"advance takes non-terminal steps other than 'claimed', not {bad}")
        now = self._now()
        with self._write() as connection:
            machine = _machine_row(connection, machine_id)
            at = _move_through(connection, machine, steps, now, **_failure(failure))
            if manifest is not None:
                connection.execute(
                    _INSERT_RUN_MANIFEST,
                    {
                        "machine_id": machine_id,
                        "user_name": machine.user_name,
                        "server_name": machine.server_name,
                        "started_at": now,
                        "manifest": manifest,
                    },
                )
            return _moved(machine, at, now, _held_by(connection, machine_id), **_failure(failure))

    def release(
        self,
        machine_id: str,
        *,
        to: str = "released",
        message: str = "",
        failure: str | None = None,
    ) -> Machine:
        """End a ``stopping`` machine (or fail a ``requested`` one): free its devices.

        Writes one usage record per device held. Idempotent: a machine already
        released or failed is returned unchanged, whatever ``to`` says.
        """
        if to not in TERMINAL:
            raise ValueError(f"release ends a machine: to must be one of {sorted(TERMINAL)}")
        try:
            return self._release(machine_id, to, message, failure)
        except IllegalTransition:
            current = self.machine(machine_id)
            if current is not None and current.state in TERMINAL:
                return current  # a concurrent release got there first
            raise

    def _release(self, machine_id: str, to: str, message: str, failure: str | None) -> Machine:
        now = self._now()
        with self._write() as connection:
            machine = _machine_row(connection, machine_id)
            if machine.state in TERMINAL:
                return _machine_record(machine, ())
            return _end(connection, machine, to, now, message, failure, self._usage_zone)

    # -- queries ----------------------------------------------------------------

    def machine(self, machine_id: str) -> Machine | None:
        with self._engine.begin() as connection:
            row = _find_machine(connection, machine_id)
            if row is None:
                return None
            return _machine_record(row, tuple(_held_by(connection, machine_id)))

    def live_machine(self, user: str, server: str) -> Machine | None:
        with self._engine.begin() as connection:
            row = _live_row(connection, user, server)
            if row is None:
                return None
            return _machine_record(row, _held_blocks(connection, [row.id]).get(row.id, ()))

    def live_machines(self, user: str | None = None) -> list[Machine]:
        query = select(MACHINES).where(MACHINES.c.state.not_in(TERMINAL))
        if user is not None:
            query = query.where(MACHINES.c.user_name == user)
        query = query.order_by(MACHINES.c.user_name, MACHINES.c.server_name)
        with self._engine.begin() as connection:
            rows = connection.execute(query).all()
            held = _held_blocks(connection, [row.id for row in rows])
            return [_machine_record(row, held.get(row.id, ())) for row in rows]

    def holdings(self, *, held_only: bool = False) -> list[Holding]:
        """Every device the ledger knows (or only those held) and, where one holds it,
        the machine: one read."""
        query = _HOLDINGS.where(DEVICES.c.machine_id.is_not(None)) if held_only else _HOLDINGS
        with self._engine.begin() as connection:
            return [_holding(row, self._device_record(row)) for row in connection.execute(query)]

    def _device_record(self, row: Row[Any]) -> DeviceRecord:
        """The record of a devices row (its columns first), made once per distinct row:
        an inventory read is thousands of rows that rarely change."""
        key = tuple(row[:_DEVICE_FIELDS])
        record = self._device_records.get(key)
        if record is None:
            record = self._device_records[key] = _device_record(row)
        return record

    def gpu_use(self, user: str) -> list[ServerUse]:
        """GPUs held by each of ``user``'s live servers (0 for a server holding none)."""
        with self._engine.begin() as connection:
            return _gpu_use(connection, user)

    def gpu_hours(self, user: str, within: timedelta = WEEK) -> float:
        """GPU-hours ``user`` used in the last ``within``, running machines' so far included."""
        now = self._now()
        with self._engine.begin() as connection:
            return _gpu_hours_since(connection, user, now - within, now)

    def holders(self) -> dict[str, str]:
        """block_id → machine_id for every held block."""
        return self._blocks_with("machine_id")

    def held_by(self, machine_id: str) -> list[str]:
        with self._engine.begin() as connection:
            return list(_held_blocks(connection, [machine_id]).get(machine_id, ()))

    def free_blocks(self) -> set[str]:
        query = select(DEVICES.c.block_id).where(DEVICES.c.machine_id.is_(None))
        with self._engine.begin() as connection:
            return set(connection.scalars(query))

    def device_owners(self) -> dict[str, str]:
        """block_id → owner group, for co-located devices."""
        return self._blocks_with("owner_group")

    def _blocks_with(self, column: str) -> dict[str, str]:
        """block_id → ``column`` for every device where it is set."""
        value = DEVICES.c[column]
        query = select(DEVICES.c.block_id, value).where(value.is_not(None))
        with self._engine.begin() as connection:
            return {block: cast(str, found) for block, found in connection.execute(query)}

    # -- run manifests --------------------------------------------------------

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
            return [_event_record(row) for row in connection.execute(query)]

    def usage_sums(self, period: Period) -> UsageSums:
        """GPU-seconds in ``period``: ended use per day and model and per user, and
        running machines' use so far (see :func:`composespawner.domain.usage.usage_report`)."""
        with self._engine.begin() as connection:
            return usage_sums(connection, period, self._now(), self._usage_zone, self._user_sums)

    def day_uses(self, period: Period) -> list[DayUse]:
        """Every day, user and model in ``period`` with its use: ended, then running so far."""
        with self._engine.begin() as connection:
            return day_uses(connection, period) + live_uses(
                connection, period, self._now(), self._usage_zone
            )

    def usage(self, user: str | None = None) -> list[UsageRecord]:
        query = select(USAGE).order_by(USAGE.c.id)
        if user is not None:
            query = query.where(USAGE.c.user_name == user)
        with self._engine.begin() as connection:
            return [_usage_record(row) for row in connection.execute(query)]

    def record_reconcile_action(
        self,
        kind: str,
        outcome: Literal["done", "error"],
        reason: str,
        *,
        machine_id: str | None = None,
        host_id: str | None = None,
    ) -> None:
        """Note what the reconciler did (or failed to do): its history, and its metrics."""
        values = {"at": self._now(), "kind": kind, "outcome": outcome, "reason": reason}
        with self._write() as connection:
            connection.execute(
                insert(RECONCILE_ACTIONS).values(**values, machine_id=machine_id, host_id=host_id)
            )

    def reconcile_action_counts(self) -> dict[tuple[str, str], int]:
        """(kind, outcome) → how many the reconciler has recorded, ever."""
        columns = (RECONCILE_ACTIONS.c.kind, RECONCILE_ACTIONS.c.outcome)
        query = select(*columns, func.count()).group_by(*columns)
        with self._engine.begin() as connection:
            return {(kind, outcome): n for kind, outcome, n in connection.execute(query)}

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the ledger's clock must return timezone-aware datetimes")
        return now.astimezone(UTC)


# ---------------------------------------------------------------------------
# Steps inside one transaction
# ---------------------------------------------------------------------------

MACHINES = cast(Table, MachineRow.__table__)
COHORTS = cast(Table, CohortRow.__table__)
COLOCATED = cast(Table, ColocatedRow.__table__)
DEVICES = cast(Table, DeviceRow.__table__)
EVENTS = cast(Table, MachineEventRow.__table__)
USAGE = cast(Table, UsageRecordRow.__table__)
QUOTA_ACCOUNTS = cast(Table, QuotaAccountRow.__table__)
RECONCILE_ACTIONS = cast(Table, ReconcileActionRow.__table__)
RUN_MANIFESTS = cast(Table, RunManifestRow.__table__)


# Statements every spawn runs, built once. Bind parameters named after a column
# would clash with UPDATE's SET parameters, hence the b_ prefix.
_MACHINE_BY_ID = select(MACHINES).where(MACHINES.c.id == bindparam("b_machine_id"))
_HELD_BY_MACHINE = (
    select(DEVICES.c.block_id)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .order_by(DEVICES.c.block_id)
)
# SET comes from the execution's other parameters: state, updated_at and the rest.
_MOVE_MACHINE = update(MACHINES).where(
    MACHINES.c.id == bindparam("b_machine_id"), MACHINES.c.state == bindparam("b_from_state")
)
_INSERT_MACHINE = insert(MACHINES)
_INSERT_EVENT = insert(EVENTS)
_INSERT_USAGE = insert(USAGE)
_INSERT_RUN_MANIFEST = insert(RUN_MANIFESTS)
_DEVICES_HELD_BY = (
    select(DEVICES)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .order_by(DEVICES.c.block_id)
)
_FREE_DEVICES_OF = (
    update(DEVICES)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .values(machine_id=None, held_since=None)
)
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
    )
    .values(machine_id=bindparam("b_machine_id"), held_since=bindparam("b_now"))
)
_GPU_USE = (
    select(MACHINES.c.server_name, func.count(DEVICES.c.block_id))
    .outerjoin(DEVICES, and_(DEVICES.c.machine_id == MACHINES.c.id, DEVICES.c.kind == "gpu"))
    .where(MACHINES.c.user_name == bindparam("b_user"), MACHINES.c.state.not_in(TERMINAL))
    .group_by(MACHINES.c.server_name)
    .order_by(MACHINES.c.server_name)
)


# Each GPU's period of use that reaches past b_since: usage records of ended
# machines, then GPUs held now (still running, so no end yet).
_GPU_PERIODS = union_all(
    select(USAGE.c.started_at, USAGE.c.ended_at).where(
        USAGE.c.user_name == bindparam("b_user"),
        USAGE.c.kind == "gpu",
        USAGE.c.ended_at > bindparam("b_since"),
    ),
    select(DEVICES.c.held_since, null())
    .join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
    .where(MACHINES.c.user_name == bindparam("b_user"), DEVICES.c.kind == "gpu"),
)


_REGISTERED = select(COLOCATED).where(
    COLOCATED.c.block_id.in_(bindparam("b_blocks", expanding=True))
)
_FREE_OF_MODELS = select(func.count()).where(
    DEVICES.c.kind == "gpu",
    DEVICES.c.model.in_(bindparam("b_models", expanding=True)),
    DEVICES.c.machine_id.is_(None),
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
_LOCK_COHORT = select(COHORTS.c.name).where(COHORTS.c.name == bindparam("b_name")).with_for_update()


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


def _holding(row: Row[Any], device: DeviceRecord) -> Holding:
    # By position (the columns of _HOLDINGS): thousands of rows a read, and a Row's
    # attributes cost as much as building the record.
    machine_id, held_since, _, last_seen, user, server, state, host, cohort = tuple(row)[6:]
    return Holding(device, last_seen, machine_id, held_since, user, server, state, host, cohort)


def _find_machine(connection: Connection, machine_id: str) -> Row[Any] | None:
    return connection.execute(_MACHINE_BY_ID, {"b_machine_id": machine_id}).first()


def _machine_row(connection: Connection, machine_id: str) -> Row[Any]:
    row = _find_machine(connection, machine_id)
    if row is None:
        raise UnknownMachine(machine_id)
    return row


def _lock_running(connection: Connection, machine_id: str) -> Row[Any]:
    """The machine's row, locked until the transaction ends; NotRunning unless it runs."""
    row = connection.execute(_MACHINE_BY_ID.with_for_update(), {"b_machine_id": machine_id}).first()
    if row is None:
        raise UnknownMachine(machine_id)
    if row.state != RUNNING:
        raise NotRunning(machine_id, row.server_name, row.state)
    return row


def _live_row(connection: Connection, user: str, server: str) -> Row[Any] | None:
    query = select(MACHINES).where(
        MACHINES.c.user_name == user,
        MACHINES.c.server_name == server,
        MACHINES.c.state.not_in(TERMINAL),
    )
    return connection.execute(query).first()


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
    if _rowcount(result) != len(wanted):
        # The compare-and-set is the guarantee; the check above only names the culprits.
        raise DevicesTaken(wanted, reason="not all free")


def _move(
    connection: Connection, machine: Row[Any], to: str, now: datetime, message: str, **values: Any
) -> None:
    """Compare-and-set the machine's state and append the event for it."""
    _move_through(connection, machine, [(to, message)], now, **values)


def _move_through(
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
        events.append(_event(machine.id, now, at, to, message))
        at = to
    result = connection.execute(
        _MOVE_MACHINE,
        {
            "b_machine_id": machine.id,
            "b_from_state": machine.state,
            "state": at,
            "updated_at": now,
            **values,
        },
    )
    if _rowcount(result) != 1:
        raise IllegalTransition(machine.state, at, "the machine changed state meanwhile")
    connection.execute(_INSERT_EVENT, events)
    return at


def _end(
    connection: Connection,
    machine: Row[Any],
    to: str,
    now: datetime,
    message: str,
    failure: str | None,
    zone: tzinfo,
) -> Machine:
    """Enter a terminal state: free every device held and record who used it."""
    ended: dict[str, Any] = {"ended_at": now, **_failure(failure)}
    _move(connection, machine, to, now, message, **ended)
    held = connection.execute(_DEVICES_HELD_BY, {"b_machine_id": machine.id}).all()
    if held:
        connection.execute(_INSERT_USAGE, [_usage_values(machine, d, now) for d in held])
        add_day_use(connection, machine.user_name, held, now, zone)
        connection.execute(_FREE_DEVICES_OF, {"b_machine_id": machine.id})
    return _moved(machine, to, now, (), **ended)


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
    members = connection.execute(_HELD_UNDER_COHORT, models).scalar_one()
    if free - taking < keep.gpus - members:
        raise ReservedForCohort(user, keep, free)


def _use(connection: Connection, machine: Row[Any], quota: Quota, now: datetime) -> Use:
    """What the machine's user holds besides it; GPU-hours read only where a limit needs them."""
    user, server = machine.user_name, machine.server_name
    servers = [use for use in _gpu_use(connection, user) if use.server != server]
    if quota.gpu_hours_week.value is None:
        return Use(servers)
    return Use(servers, _gpu_hours_since(connection, user, now - WEEK, now))


def _gpu_hours_since(connection: Connection, user: str, since: datetime, now: datetime) -> float:
    """GPU-hours used by ``user`` from ``since`` to ``now``: ended machines and live ones."""
    seconds = 0.0
    for started, ended in connection.execute(_GPU_PERIODS, {"b_user": user, "b_since": since}):
        seconds += max((min(ended or now, now) - max(started, since)).total_seconds(), 0.0)
    return seconds / 3600


def _gpu_use(connection: Connection, user: str) -> list[ServerUse]:
    return [
        ServerUse(server, gpus) for server, gpus in connection.execute(_GPU_USE, {"b_user": user})
    ]


def _held_by(connection: Connection, machine_id: str) -> list[str]:
    return list(connection.scalars(_HELD_BY_MACHINE, {"b_machine_id": machine_id}))


def _held_blocks(connection: Connection, machine_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
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


def _moved(
    machine: Row[Any], to: str, now: datetime, held: Sequence[str], **values: Any
) -> Machine:
    """The record of ``machine`` after a move this transaction made: no need to read it back."""
    record = _machine_record(machine, tuple(sorted(held)))
    return dataclasses.replace(record, state=to, updated_at=now, **values)


def _upsert_devices(dialect: str) -> Any:
    insert_devices = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert_devices(DEVICES)
    inventory = ("kind", "model", "zone_ids", "chassis", "owner_group", "last_seen")
    return statement.on_conflict_do_update(
        index_elements=["block_id"], set_={name: statement.excluded[name] for name in inventory}
    )


def _rowcount(result: Any) -> int:
    return cast(CursorResult[Any], result).rowcount


# ---------------------------------------------------------------------------
# Pure conversions
# ---------------------------------------------------------------------------


def _claim_set(block_ids: Sequence[str], host_block: str | None) -> tuple[str, ...]:
    wanted = [*block_ids, *([host_block] if host_block is not None else [])]
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"a claim names a block twice: {sorted(wanted)}")
    return tuple(sorted(wanted))


def _failure(failure: str | None) -> dict[str, str]:
    return {} if failure is None else {"failure": failure}


def _device_values(device: DeviceRecord, now: datetime) -> dict[str, Any]:
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


def _device_record(row: Row[Any]) -> DeviceRecord:
    zones = frozenset(row.zone_ids.split(",")) if row.zone_ids else frozenset()
    kind = cast(HoldableKind, row.kind)
    return DeviceRecord(row.block_id, kind, row.model, zones, row.chassis, row.owner_group)


def _new_machine(
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


def _event(
    machine_id: str, at: datetime, from_state: str | None, to_state: str, message: str
) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "at": at,
        "from_state": from_state,
        "to_state": to_state,
        "message": message,
    }


def _usage_values(machine: Row[Any], device: Row[Any], now: datetime) -> dict[str, Any]:
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


def _machine_record(row: Row[Any], block_ids: tuple[str, ...]) -> Machine:
    # The tables' column names are the records' field names.
    columns = row._mapping
    return Machine(**{**columns, "request": copy.deepcopy(columns["request"])}, block_ids=block_ids)


def _run_manifest(row: Row[Any]) -> RunManifest:
    columns = row._mapping
    return RunManifest(**{**columns, "manifest": copy.deepcopy(columns["manifest"])})


def _event_record(row: Row[Any]) -> MachineEvent:
    return MachineEvent(**row._mapping)


def _usage_record(row: Row[Any]) -> UsageRecord:
    return UsageRecord(**row._mapping)
