"""The Ledger: who holds which device, and every machine's lifecycle.

Each public method is one short transaction and returns frozen records, never
ORM objects, so the spawner can call it from worker threads
(``asyncio.to_thread``) and keep the results. A ``Ledger`` may be shared by
threads; several ``Ledger`` objects (hub processes) may share one database.

``Ledger`` is the one door callers use. Its work is done by parts sharing its
engine, write turn and clock, each with the invariants its code enforces:

* :mod:`~composespawner.ledger.claims`: taking devices, growing, giving back;
  one holder per device (1), co-located devices for their owners (2), quota (3),
  and no deadlock between claims of different users on PostgreSQL;
* :mod:`~composespawner.ledger.machines` and :mod:`~composespawner.ledger.steps`:
  the one-way lifecycle (7): every state change is a compare-and-set on the state
  plus an event appended in the same transaction; entering a terminal state frees
  the machine's devices and writes their usage records in the same transaction
  too, so terminal always means holds nothing;
* :mod:`~composespawner.ledger.queries`: the reads;
* ``policy`` and ``submissions``: the portal's rules and starter-kit submissions.

Transactions are SQLAlchemy Core statements on a connection, not ORM
sessions: the ledger sits on the hub's spawn path, and the unit of work and
identity map cost several times more CPU than the statements themselves. The
statements every spawn runs are built once, with bind parameters
(:mod:`~composespawner.ledger.statements`), so each execution skips building
and hashing them again. The ORM models in ``models.py`` still define the
tables and their types.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from sqlalchemy import Connection, Engine, event, insert

from composespawner.domain.quotas import NO_QUOTA, Quota
from composespawner.domain.rooms import HostUse
from composespawner.domain.usage import DayUse, Period
from composespawner.ledger import migrate
from composespawner.ledger.claims import Claims
from composespawner.ledger.database import create_ledger_engine, writing
from composespawner.ledger.errors import SchemaNotCurrent
from composespawner.ledger.lifecycle import CLAIMED, TERMINAL
from composespawner.ledger.machines import Machines
from composespawner.ledger.models import refuse_event_rewrites
from composespawner.ledger.policy import Policy
from composespawner.ledger.queries import Queries
from composespawner.ledger.reclaims import Reclaims
from composespawner.ledger.records import (
    DeviceRecord,
    Holding,
    Holds,
    HostRecord,
    KeepFree,
    Machine,
    MachineEvent,
    RoomClaim,
    RunManifest,
    ServerUse,
    UsageRecord,
    utcnow,
)
from composespawner.ledger.rooms import know_hosts
from composespawner.ledger.shares import ShareClaim
from composespawner.ledger.statements import RECONCILE_ACTIONS
from composespawner.ledger.steps import WEEK, device_values, upsert_devices
from composespawner.ledger.submissions import Submissions
from composespawner.ledger.usage_sums import UsageSums


class Ledger:
    """The allocation ledger on one database URL (``sqlite:///...`` or ``postgresql+psycopg://``).

    ``clock`` must return aware datetimes; ``timeout`` (seconds) bounds connecting and every
    wait for a lock held by another transaction; ``usage_zone`` is where usage reports' days
    begin (the site's time zone)."""

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
        self._usage_zone = usage_zone
        self.reclaims = Reclaims(self._engine, self._write, self._now, usage_zone)
        self._claims = Claims(self._engine, self._write, self._now, usage_zone)
        self._machines = Machines(self._engine, self._write, self._now, usage_zone)
        self._queries = Queries(self._engine, self._write, self._now, usage_zone)

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

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the ledger's clock must return timezone-aware datetimes")
        return now.astimezone(UTC)

    # -- schema ---------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` with the packaged Alembic migrations."""
        with self._write() as connection:
            migrate.upgrade(connection, revision, self._usage_zone)

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
        """Record the devices the fabric reports; never changes who holds them. Devices
        missing keep their rows (and holders): one missing once is not known to be gone."""
        now = self._now()
        rows = {device.block_id: device_values(device, now) for device in devices}
        if not rows:
            return
        with self._write() as connection:
            connection.execute(upsert_devices(self._engine.dialect.name), list(rows.values()))

    def devices(self, block_ids: Collection[str] | None = None) -> list[DeviceRecord]:
        """Every device the ledger knows, or those of ``block_ids``."""
        return self._queries.devices(block_ids)

    # -- claims: Claims ---------------------------------------------------------

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
        """Take ``block_ids`` (``host_block``, or ``room`` of a shared host; a ``share`` of a
        GPU) for a requested machine: all or nothing (see :meth:`Claims.claim`)."""
        return self._claims.claim(
            machine_id,
            host_id=host_id,
            zone=zone,
            block_ids=block_ids,
            quota=quota,
            groups=groups,
            host_block=host_block,
            keep_free=keep_free,
            cohort=cohort,
            room=room,
            share=share,
        )

    def leave_shares(self, machine_id: str) -> tuple[str, ...]:
        """A stopping machine leaves its GPUs' shares; those it detaches (ledger/shares.py)."""
        return self._claims.leave_shares(machine_id)

    def grow(
        self,
        machine_id: str,
        *,
        block_ids: Sequence[str],
        quota: Quota = NO_QUOTA,
        groups: frozenset[str] = frozenset(),
        keep_free: Sequence[KeepFree] = (),
    ) -> Machine:
        """Add ``block_ids`` to a running machine: all or nothing, checked as a claim
        is (see :meth:`Claims.grow`)."""
        return self._claims.grow(
            machine_id, block_ids=block_ids, quota=quota, groups=groups, keep_free=keep_free
        )

    def give_back(
        self, machine_id: str, block_ids: Sequence[str], message: str, *, used: bool = True
    ) -> Machine:
        """Free some of a live machine's devices (see :meth:`Claims.give_back`)."""
        return self._claims.give_back(machine_id, block_ids, message, used=used)

    # -- lifecycle: Machines ----------------------------------------------------

    def request_machine(self, user: str, server: str, request: dict[str, Any]) -> str:
        """Record a new machine for ``user``'s ``server`` in state ``requested``; its id.
        Raises :class:`ServerBusy` if that server already has a live machine."""
        return self._machines.request_machine(user, server, request)

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
        return self._machines.end(machine_id, to, message, failure)

    def advance(
        self,
        machine_id: str,
        *steps: tuple[str, str],
        failure: str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Machine:
        """Take several non-terminal steps (state, message) in one transaction: all
        or none (see :meth:`Machines.advance`)."""
        return self._machines.advance(machine_id, *steps, failure=failure, manifest=manifest)

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
        return self._machines.release(machine_id, to=to, message=message, failure=failure)

    # -- queries: Queries -------------------------------------------------------

    def machine(self, machine_id: str) -> Machine | None:
        return self._queries.machine(machine_id)

    def live_machine(self, user: str, server: str) -> Machine | None:
        return self._queries.live_machine(user, server)

    def live_machines(self, user: str | None = None) -> list[Machine]:
        return self._queries.live_machines(user)

    def holdings(self, *, held_only: bool = False) -> list[Holding]:
        """Every device the ledger knows (or only those held), with its holder: one read."""
        return self._queries.holdings(held_only=held_only)

    def gpu_use(self, user: str) -> list[ServerUse]:
        """GPUs held by each of ``user``'s live servers (0 for a server holding none)."""
        return self._queries.gpu_use(user)

    def gpu_hours(self, user: str, within: timedelta = WEEK) -> float:
        """GPU-hours ``user`` used in the last ``within``, running machines' so far included."""
        return self._queries.gpu_hours(user, within)

    def holders(self) -> dict[str, str]:
        """block_id → machine_id for every held block."""
        return self._queries.holders()

    def holds(self) -> Holds:
        """Held blocks' holders, hosts' room in use, GPUs held in shares: at one moment."""
        return self._queries.holds()

    def host_rooms(self) -> list[tuple[HostRecord, HostUse]]:
        """Every host the ledger knows, and what live machines hold of it."""
        return self._queries.host_rooms()

    def sync_hosts(self, hosts: Iterable[HostRecord]) -> None:
        """Know every host the fabric has, and its capacity (changed only while it is empty)."""
        with self._write() as connection:
            know_hosts(connection, hosts, self._now())

    def held_by(self, machine_id: str) -> list[str]:
        return self._queries.held_by(machine_id)

    def free_blocks(self) -> set[str]:
        return self._queries.free_blocks()

    def device_owners(self) -> dict[str, str]:
        """block_id → owner group, for co-located devices."""
        return self._queries.device_owners()

    def run_manifest(self, machine_id: str) -> RunManifest | None:
        return self._queries.run_manifest(machine_id)

    def run_manifests(self, user: str, limit: int = 20) -> list[RunManifest]:
        """``user``'s latest runs, newest first."""
        return self._queries.run_manifests(user, limit)

    def events(self, machine_id: str) -> list[MachineEvent]:
        return self._queries.events(machine_id)

    def usage_sums(self, period: Period) -> UsageSums:
        """GPU-seconds in ``period``: ended use per day and model and per user, and
        running machines' use so far (see :func:`composespawner.domain.usage.usage_report`)."""
        return self._queries.usage_sums(period)

    def day_uses(self, period: Period) -> list[DayUse]:
        """Every day, user and model in ``period`` with its use: ended, then running so far."""
        return self._queries.day_uses(period)

    def usage(self, user: str | None = None) -> list[UsageRecord]:
        return self._queries.usage(user)

    # -- the reconciler's history ----------------------------------------------

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
        return self._queries.reconcile_action_counts()
