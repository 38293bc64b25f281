"""The ledger's tables, as a typed SQLAlchemy 2 ORM.

The schema is created only by the Alembic migrations in ``migrations/``; a
test checks these models and the migrated schema agree. Holding is one
column: ``devices.machine_id`` is THE holder, so a device has at most one
holder by construction (invariant 1); claims set it only where it is NULL.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Delete,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    Update,
    event,
    false,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, mapped_column

from composespawner.domain.quotas import LEVELS
from composespawner.ledger.errors import LedgerError
from composespawner.ledger.lifecycle import STATES, TERMINAL
from composespawner.ledger.records import HOLDABLE_KINDS

# Deterministic constraint names, so migrations can refer to them on every back-end.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _sql_list(values: Any) -> str:
    return ", ".join(f"'{value}'" for value in sorted(values))


EVENTS_TABLE = "machine_events"

# The partial unique index's condition, shared with the migration.
LIVE_MACHINE_WHERE = f"state NOT IN ({_sql_list(TERMINAL)})"


class AppendOnlyViolation(LedgerError):
    """Something tried to change or remove a machine event."""


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on every back-end.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so it stores
    naive UTC and we put the zone back when reading.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class MachineRow(Base):
    __tablename__ = "machines"
    __table_args__ = (
        CheckConstraint(f"state IN ({_sql_list(STATES)})", name="state"),
        # At most one live machine per (user, server): a second spawn of the same
        # server is refused by the database, not by a read-then-write.
        Index(
            "uq_machines_live_server",
            "user_name",
            "server_name",
            unique=True,
            sqlite_where=text(LIVE_MACHINE_WHERE),
            postgresql_where=text(LIVE_MACHINE_WHERE),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    host_id: Mapped[str | None] = mapped_column(String(128))
    zone: Mapped[str | None] = mapped_column(String(128))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    failure: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The cohort whose session reservation its GPUs were claimed under, if any.
    cohort: Mapped[str | None] = mapped_column(String(255))
    # Its share of its host, held in host_rooms while it lives (None: a machine from
    # before hosts were shared, which held its host's own block instead).
    cores: Mapped[int | None] = mapped_column(Integer)
    memory_gib: Mapped[int | None] = mapped_column(Integer)
    # n: it holds a 1/n share of one GPU (device_shares); None: no share. On the row, so
    # the steps every machine takes read shares only for machines that have one.
    gpu_share: Mapped[int | None] = mapped_column(Integer)


class HostRoomRow(Base):
    """A compute host's room and what live machines hold of it (invariant 10).

    Claims take cores, memory and device slots here with a compare-and-set
    (``UPDATE ... WHERE held + asked <= capacity``, checking the row count), in
    the transaction that takes the devices; the CHECK constraints make
    overcommitting a host impossible even for a statement that forgets to ask.
    """

    __tablename__ = "host_rooms"
    __table_args__ = (
        CheckConstraint("cores_held >= 0 AND cores_held <= cores", name="cores_held"),
        CheckConstraint(
            "memory_gib_held >= 0 AND memory_gib_held <= memory_gib", name="memory_gib_held"
        ),
        CheckConstraint("slots_held >= 0 AND slots_held <= slots", name="slots_held"),
        CheckConstraint("machines >= 0", name="machines"),
    )

    host_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # ComputerSystem Id
    block_id: Mapped[str] = mapped_column(String(128))  # its own ResourceBlock
    cores: Mapped[int] = mapped_column(Integer)
    memory_gib: Mapped[int] = mapped_column(Integer)
    slots: Mapped[int] = mapped_column(Integer)
    cores_held: Mapped[int] = mapped_column(Integer)
    memory_gib_held: Mapped[int] = mapped_column(Integer)
    slots_held: Mapped[int] = mapped_column(Integer)
    machines: Mapped[int] = mapped_column(Integer)  # live machines on it
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DeviceRow(Base):
    __tablename__ = "devices"
    __table_args__ = (
        CheckConstraint(f"kind IN ({_sql_list(HOLDABLE_KINDS)})", name="kind"),
        CheckConstraint(
            "(machine_id IS NULL) = (held_since IS NULL)", name="held_since_with_holder"
        ),
        # A GPU is held whole or in shares, never both; never by more holders than slots.
        CheckConstraint("machine_id IS NULL OR share_size IS NULL", name="whole_or_split"),
        CheckConstraint("(share_size IS NULL) = (share_host IS NULL)", name="split_where"),
        CheckConstraint(
            "share_holders >= 0 AND share_holders <= COALESCE(share_size, 0)",
            name="share_holders",
        ),
    )

    block_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(255))
    zone_ids: Mapped[str] = mapped_column(String(1024))  # sorted, comma-joined
    chassis: Mapped[str] = mapped_column(String(128))
    owner_group: Mapped[str | None] = mapped_column(String(255))
    machine_id: Mapped[str | None] = mapped_column(ForeignKey("machines.id"), index=True)
    held_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    # Split into share_size holder slots, attached to share_host for its holders
    # (device_shares); share_holders counts those that have not begun to leave. The
    # holder that left last is its share_closer: it detaches it, then it is free.
    share_size: Mapped[int | None] = mapped_column(Integer)
    share_host: Mapped[str | None] = mapped_column(String(128))
    share_holders: Mapped[int] = mapped_column(Integer, server_default="0")
    share_closer: Mapped[str | None] = mapped_column(String(32))


class DeviceShareRow(Base):
    """One holder of a share of a split GPU (devices.share_size slots in all)."""

    __tablename__ = "device_shares"

    block_id: Mapped[str] = mapped_column(ForeignKey("devices.block_id"), primary_key=True)
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), primary_key=True, index=True)
    held_since: Mapped[datetime] = mapped_column(UTCDateTime)
    # Its machine is being released: its slot no longer counts in share_holders.
    leaving: Mapped[bool] = mapped_column(Boolean, server_default=false())


class MachineEventRow(Base):
    """Append-only: the ORM hooks below and a database trigger refuse changes."""

    __tablename__ = EVENTS_TABLE

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)


class RunManifestRow(Base):
    """What each server ran on (composespawner.domain.manifest), written as its notebook starts.

    Apart from machines so that listing machines never reads it.
    """

    __tablename__ = "run_manifests"

    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255))
    server_name: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (Index("ix_run_manifests_user", "user_name", "started_at"),)


class KitSubmissionRow(Base):
    """A starter-kit model the portal scored on blind data (composespawner.portal.scoring)."""

    __tablename__ = "kit_submissions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kit: Mapped[str] = mapped_column(String(64))
    cohort: Mapped[str | None] = mapped_column(String(255))  # its leaderboard; None: the open one
    user_name: Mapped[str] = mapped_column(String(255))
    team: Mapped[str | None] = mapped_column(String(64))
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    score: Mapped[float] = mapped_column(Float)
    model_sha256: Mapped[str] = mapped_column(String(64))
    model: Mapped[bytes] = mapped_column(LargeBinary)  # kept: any score can be checked again
    record: Mapped[dict[str, Any]] = mapped_column(JSON)  # the run's repro record
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the server's run manifest

    __table_args__ = (Index("ix_kit_submissions_board", "kit", "cohort", "score"),)


class UsageRecordRow(Base):
    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), index=True)
    user_name: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255))
    block_id: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime)
    fraction: Mapped[float] = mapped_column(Float, server_default="1")  # 1/n for a share


class UsageDayRow(Base):
    """GPU-seconds per day (in the site's time zone), user and model: what usage charts read.

    Written with the usage records as a machine ends, so a report over months
    sums days, not every device's period of use.
    """

    __tablename__ = "usage_days"
    # The usage page sums a period's days per user from the index alone.
    __table_args__ = (Index("ix_usage_days_covering", "day", "user_name", "model", "gpu_seconds"),)

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float)


class UsageModelDayRow(Base):
    """GPU-seconds per day and model, all users together: the usage chart's stacks, kept
    with usage_days so that a period's chart reads days times models rows."""

    __tablename__ = "usage_model_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float)


class UsageActiveDayRow(Base):
    """GPU-seconds of work the reclaimer saw per day (in the site's time zone), user and
    model: the usage page's *used* figure.

    Added in the transaction that adds the same seconds to the watches' ``active_s``, on
    the day of the reclaimer's pass that saw them.
    """

    __tablename__ = "usage_active_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float)


class UsageGivenBackDayRow(Base):
    """GPU-seconds given back per day (in the site's time zone), user and model, of machines
    that ended: the usage page's *given back* (running machines' are counted when read).

    Added in the transaction that ends the machine and adds its held seconds to usage_days.
    """

    __tablename__ = "usage_given_back_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float)


class QuotaAccountRow(Base):
    """One row per user, locked by every claim of that user so they serialize (invariant 3)."""

    __tablename__ = "quota_accounts"

    user_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ReconcileActionRow(Base):
    """What the reconciler did (or tried), one row per action: its history and its counts."""

    __tablename__ = "reconcile_actions"
    __table_args__ = (
        CheckConstraint("outcome IN ('done', 'error')", name="outcome"),
        Index("ix_reconcile_actions_kind_outcome", "kind", "outcome"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(32))
    outcome: Mapped[str] = mapped_column(String(8))
    machine_id: Mapped[str | None] = mapped_column(String(32))  # not a key: it may be unknown
    host_id: Mapped[str | None] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)


class QuotaRuleRow(Base):
    """What one level of the quota hierarchy says (see :mod:`composespawner.domain.quotas`)."""

    __tablename__ = "quota_rules"
    __table_args__ = (CheckConstraint(f"level IN ({_sql_list(LEVELS)})", name="level"),)

    level: Mapped[str] = mapped_column(String(8), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)  # '' for the site
    gpus_held: Mapped[int | None] = mapped_column(Integer)
    gpus_per_server: Mapped[int | None] = mapped_column(Integer)
    models: Mapped[list[str] | None] = mapped_column(JSON)
    gpu_hours_week: Mapped[float | None] = mapped_column(Float)
    servers: Mapped[int | None] = mapped_column(Integer)
    cores_held: Mapped[int | None] = mapped_column(Integer)
    memory_gib_held: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_by: Mapped[str] = mapped_column(String(255))


class CohortRow(Base):
    """A cohort (see :mod:`composespawner.domain.cohorts`): its hub group's name is the key."""

    __tablename__ = "cohorts"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    title: Mapped[str] = mapped_column(String(255))
    starts_on: Mapped[date | None] = mapped_column(Date)
    ends_on: Mapped[date | None] = mapped_column(Date)
    sessions: Mapped[list[str]] = mapped_column(JSON)  # "Mon 09:00-11:00", site-local
    stacks: Mapped[list[str] | None] = mapped_column(JSON)
    sizes: Mapped[list[str] | None] = mapped_column(JSON)  # catalog size ids (None: any)
    starter_kit: Mapped[str | None] = mapped_column(String(255))
    reserved_model: Mapped[str | None] = mapped_column(String(255))
    reserved_gpus: Mapped[int] = mapped_column(Integer)  # in shares of reserved_share
    reserved_share: Mapped[int] = mapped_column(Integer, server_default="1")  # 1: whole GPUs
    # Its overrides of the site's reclaim policy (composespawner.domain.reclaim); None: none.
    reclaim_policy: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_by: Mapped[str] = mapped_column(String(255))


class GpuWatchRow(Base):
    """What the reclaimer remembers of one GPU on one machine (domain.reclaim.GpuWatch).

    Times are epoch seconds, as the reclaimer's readings are. Machines are never deleted,
    so rows of ended machines stay; the ledger reads only those of GPUs still held.
    """

    __tablename__ = "gpu_watches"

    machine_id: Mapped[str] = mapped_column(
        ForeignKey("machines.id", ondelete="CASCADE"), primary_key=True
    )
    block_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    since: Mapped[float | None] = mapped_column(Float)
    last_at: Mapped[float] = mapped_column(Float)
    last_work_at: Mapped[float | None] = mapped_column(Float)
    last_held_at: Mapped[float | None] = mapped_column(Float)
    # The first reading of the stretch without work (nothing holding it) under way.
    idle_from: Mapped[float | None] = mapped_column(Float)
    unheld_from: Mapped[float | None] = mapped_column(Float)
    utilization: Mapped[float] = mapped_column(Float, server_default="0")
    memory_used_mib: Mapped[float] = mapped_column(Float, server_default="0")
    warned_at: Mapped[float | None] = mapped_column(Float)
    kept_until: Mapped[float | None] = mapped_column(Float)
    keeps_used: Mapped[int] = mapped_column(Integer, server_default="0")
    # Who held it at the latest reading (GpuWatch.holders); NULL: unknown.
    holders: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    # Seconds this GPU did work while this machine held it, summed by the reclaimer.
    active_s: Mapped[float] = mapped_column(Float, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class GpuGiveBackRow(Base):
    """An idle GPU the reclaimer detached (or reclaimed) from a running server. Append-only."""

    __tablename__ = "gpu_givebacks"
    __table_args__ = (CheckConstraint("action IN ('detach', 'reclaim')", name="action"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"), index=True)
    user_name: Mapped[str] = mapped_column(String(255))
    server_name: Mapped[str] = mapped_column(String(255))
    cohort: Mapped[str | None] = mapped_column(String(255))
    block_id: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    figures: Mapped[dict[str, Any]] = mapped_column(JSON)  # the Decision's, and active_s
    actor: Mapped[str] = mapped_column(String(255))  # who gave it back: 'reclaimer'


class ColocatedRow(Base):
    """A device registered to an owner group in the portal (composespawner.domain.colocation)."""

    __tablename__ = "colocated"

    block_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner_group: Mapped[str] = mapped_column(String(255))
    lent_to_user: Mapped[str | None] = mapped_column(String(255))
    lent_to_group: Mapped[str | None] = mapped_column(String(255))
    lent_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_by: Mapped[str] = mapped_column(String(255))


class AuditEntryRow(Base):
    """One admin or staff action: who, from where, what, to what, when."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    actor: Mapped[str] = mapped_column(String(255))
    origin: Mapped[str] = mapped_column(String(255))  # the client's address, as the proxy saw it
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(512))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)
    about_user: Mapped[str | None] = mapped_column(String(255), index=True)


@event.listens_for(MachineEventRow, "before_update")
@event.listens_for(MachineEventRow, "before_delete")
def _refuse_event_change(mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    raise AppendOnlyViolation(f"machine event {target.id} is append-only")


def refuse_event_rewrites(
    connection: Connection, statement: Any, multiparams: Any, params: Any, options: Any
) -> None:
    """An engine ``before_execute`` hook: UPDATE/DELETE statements bypass the mapper hooks.

    Raw SQL bypasses this too; the database trigger from the migration stops that.
    """
    target = getattr(statement, "table", None) if isinstance(statement, Update | Delete) else None
    if getattr(target, "name", None) == EVENTS_TABLE:
        raise AppendOnlyViolation("machine events are append-only")
