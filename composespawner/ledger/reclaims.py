"""The ledger's memory of idle GPUs given back (``Ledger.reclaims``).

The reclaimer (composespawner.services.reclaimer) folds readings into one
:class:`~composespawner.domain.reclaim.GpuWatch` per GPU a machine holds and stores them
here each pass; the portal's *Keep* press changes the same rows. Each method is one
transaction, on SQLite and PostgreSQL.

Two writers share a watch row: the reclaimer (every pass, from what it read a moment
before) and a user's *Keep*. So neither overwrites the other's part:

* :meth:`Reclaims.keep` changes only the keep fields (``kept_until``, ``keeps_used``,
  ``warned_at``), under a lock on the machine's row;
* :meth:`Reclaims.save_watches` upserts the whole watch, except that where the stored
  ``keeps_used`` is higher than the one sent, a *Keep* came in since the reclaimer read the
  row: the stored keep fields win, the warning it withdrew stays withdrawn.

Machines are never deleted, so the rows of GPUs no longer held stay behind; every read
joins on what is held now (whole or as a share) and ignores them, and nothing is written
for a GPU its machine no longer holds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, tzinfo
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    case,
    delete,
    exists,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from composespawner.domain.reclaim import Decision, GpuWatch, ReclaimPolicy
from composespawner.domain.reclaim import keep as keep_watch
from composespawner.domain.usage import DayUse, Period
from composespawner.ledger.database import LedgerPart
from composespawner.ledger.errors import UnknownDevices, UnknownMachine
from composespawner.ledger.lifecycle import TERMINAL
from composespawner.ledger.models import GpuGiveBackRow, GpuWatchRow
from composespawner.ledger.policy import Actor, _audit
from composespawner.ledger.statements import COHORTS, DEVICES, MACHINES, SHARES
from composespawner.ledger.usage_sums import add_used, given_back_uses, used_uses

WATCHES = cast(Table, GpuWatchRow.__table__)
GIVEBACKS = cast(Table, GpuGiveBackRow.__table__)
WATCH_FIELDS = tuple(f.name for f in fields(GpuWatch))
KEEP_FIELDS = ("kept_until", "keeps_used", "warned_at")
GIVEN_BACK = ("detach", "reclaim")

Key = tuple[str, str]  # (machine id, block id)


@dataclass(frozen=True, slots=True)
class GiveBack:
    """A GPU the reclaimer took from a running server: when, whose, why (the figures)."""

    id: int
    at: datetime
    machine_id: str
    user_name: str
    server_name: str
    cohort: str | None
    block_id: str
    model: str
    action: str  # 'detach' (nothing held it) or 'reclaim' (idle after a warning)
    figures: dict[str, float] = field(hash=False)  # the Decision's, and active_s
    actor: str  # who gave it back: 'reclaimer'


_W = WATCHES.c
# The machine holds the GPU now: whole, or a share of it.
_HELD = or_(
    exists().where(DEVICES.c.block_id == _W.block_id, DEVICES.c.machine_id == _W.machine_id),
    exists().where(SHARES.c.block_id == _W.block_id, SHARES.c.machine_id == _W.machine_id),
)
_WATCHES = (
    select(WATCHES)
    .join(MACHINES, MACHINES.c.id == _W.machine_id)
    .where(MACHINES.c.state.not_in(sorted(TERMINAL)), _HELD)
)


class Reclaims(LedgerPart):
    """Watches of held GPUs, *Keep* presses, GPUs given back, and cohorts' reclaim policies.

    ``usage_zone`` is where the usage page's days begin (the ledger's): the seconds of work
    each pass saw are added to its day there.
    """

    def __init__(
        self,
        engine: Engine,
        write: Callable[[], AbstractContextManager[Connection]],
        now: Callable[[], datetime],
        usage_zone: tzinfo = UTC,
    ) -> None:
        super().__init__(engine, write, now)
        self._usage_zone = usage_zone

    # -- the reclaimer's watches ------------------------------------------------------

    def watches(self, machines: Collection[str] | None = None) -> dict[Key, GpuWatch]:
        """(machine id, block id) → the watch of every GPU a live machine holds now; only
        those of ``machines`` when given (the portal's one user)."""
        query = _WATCHES if machines is None else _WATCHES.where(_W.machine_id.in_(machines))
        with self._engine.begin() as connection:
            return {
                (r.machine_id, r.block_id): _watch(r._mapping) for r in connection.execute(query)
            }

    def save_watches(
        self, changes: Mapping[Key, GpuWatch], active: Mapping[Key, float] | None = None
    ) -> None:
        """Store each watch of ``changes``, and add ``active[key]`` seconds of work to its
        ``active_s`` and, in the same transaction, to the usage page's *used* seconds of
        the ledger's day now. A GPU its machine no longer holds (it ended, or gave it back)
        is skipped; a *Keep* pressed since the watch was read wins (see the module's
        docstring)."""
        active = active or {}
        unknown = set(active) - set(changes)
        if unknown:
            raise ValueError(f"active seconds for GPUs without a watch: {sorted(unknown)}")
        if not changes:
            return
        now = self._now()
        with self._write() as connection:
            held = _held(connection, changes)
            rows = [
                {
                    "machine_id": machine_id,
                    "block_id": block_id,
                    **_values(watch),
                    "active_s": float(active.get((machine_id, block_id), 0.0)),
                    "updated_at": now,
                }
                for (machine_id, block_id), watch in sorted(changes.items())
                if (machine_id, block_id) in held
            ]
            if rows:
                connection.execute(_upsert_watches(self._engine.dialect.name), rows)
            # The same seconds, by day: the usage page's *used* GPU-hours.
            seen = {key: seconds for key, seconds in active.items() if key in held}
            add_used(connection, seen, now, self._usage_zone)

    def keep(
        self, user: str, server: str, block_id: str, policy: ReclaimPolicy, now: float
    ) -> GpuWatch:
        """``user`` pressed *Keep* at ``now`` on GPU ``block_id`` of their live server
        ``server``: the watch after it (a GPU never watched yet gets one from ``now``).

        :class:`UnknownDevices` when that server is not live or does not hold that GPU (a GPU
        of someone else's server is answered the same as one that does not exist);
        :class:`~composespawner.domain.reclaim.KeepRefused` when the policy allows no more.
        """
        with self._write() as connection:
            machine_id = _holder(connection, user, server, block_id)
            key = (_W.machine_id == machine_id, _W.block_id == block_id)
            # A GPU not watched yet gets a watch from now; a reclaimer pass inserting the
            # same row meanwhile wins, and this press then changes that row.
            fresh = _values(GpuWatch(since=None, last_at=now))
            connection.execute(
                _insert_missing(self._engine.dialect.name).values(
                    machine_id=machine_id, block_id=block_id, **fresh, updated_at=self._now()
                )
            )
            row = connection.execute(select(WATCHES).where(*key).with_for_update()).one()
            kept = keep_watch(_watch(row._mapping), policy, now)
            # Only the keep fields: the reclaimer may have stored a newer reading since.
            keep_values = {name: getattr(kept, name) for name in KEEP_FIELDS}
            connection.execute(
                update(WATCHES).where(*key).values(**keep_values, updated_at=self._now())
            )
        return kept

    # -- GPUs given back ----------------------------------------------------------------

    def gave_back(self, machine_id: str, block_id: str, decision: Decision, by: str) -> None:
        """Record that ``by`` detached GPU ``block_id`` from machine ``machine_id`` as
        ``decision`` said (call it once the fabric confirmed): a give-back row, an audit entry
        the user is shown, and the GPU's watch forgotten."""
        if decision.action not in GIVEN_BACK:
            raise ValueError(
                f"a GPU is given back by 'detach' or 'reclaim', not {decision.action!r}"
            )
        key = (_W.machine_id == machine_id, _W.block_id == block_id)
        with self._write() as connection:
            # Locked, and the time read under the lock: a machine's end writes the hours
            # its GPUs were given back for (steps.end_machine), so a give-back recorded
            # after that end counts from the end, for nothing, not for hours no day has.
            machine = connection.execute(
                select(MACHINES).where(MACHINES.c.id == machine_id).with_for_update()
            ).first()
            if machine is None:
                raise UnknownMachine(machine_id)
            now = self._now()
            if machine.ended_at is not None:
                now = max(now, machine.ended_at)
            model = connection.scalar(select(DEVICES.c.model).where(DEVICES.c.block_id == block_id))
            active_s = connection.scalar(select(_W.active_s).where(*key))
            figures = {**decision.figures, "active_s": float(active_s or 0.0)}
            connection.execute(
                insert(GIVEBACKS).values(
                    machine_id=machine_id,
                    user_name=machine.user_name,
                    server_name=machine.server_name,
                    cohort=machine.cohort,
                    block_id=block_id,
                    model=model or "",
                    action=decision.action,
                    at=now,
                    figures=figures,
                    actor=by,
                )
            )
            detail = {
                "machine": machine_id,
                "server": machine.server_name,
                "block": block_id,
                "why": decision.why,
                "figures": figures,
            }
            target = f"machine {machine_id} ({machine.user_name}/{machine.server_name})"
            _audit(
                connection,
                now,
                Actor(by),
                f"gpu.{decision.action}",
                target,
                detail,
                about=machine.user_name,
            )
            connection.execute(delete(WATCHES).where(*key))

    def givebacks(self, since: datetime, until: datetime) -> list[GiveBack]:
        """GPUs given back from ``since`` (included) to ``until`` (excluded), oldest first."""
        query = (
            select(GIVEBACKS)
            .where(GIVEBACKS.c.at >= since, GIVEBACKS.c.at < until)
            .order_by(GIVEBACKS.c.at, GIVEBACKS.c.id)
        )
        with self._engine.begin() as connection:
            return [GiveBack(**row._mapping) for row in connection.execute(query)]

    def usage_figures(self, period: Period) -> list[DayUse]:
        """The *used* and *given back* seconds of ``period`` per day, user and model (see
        :mod:`composespawner.domain.usage`), used first: the usage CSV's added columns."""
        with self._snapshot() as connection:
            return used_uses(connection, period) + given_back_uses(
                connection, period, self._now(), self._usage_zone
            )

    # -- cohorts' policies --------------------------------------------------------------

    def cohort_policy(self, cohort: str) -> dict[str, object] | None:
        """The overrides of the site's policy ``cohort`` stored; None: none (or no cohort)."""
        query = select(COHORTS.c.reclaim_policy).where(COHORTS.c.name == cohort)
        with self._engine.begin() as connection:
            found = connection.scalar(query)
        return None if found is None else dict(found)

    def cohort_policies(self) -> dict[str, dict[str, object]]:
        """cohort → its overrides, for every cohort that stored some: the reclaimer's one read."""
        query = select(COHORTS.c.name, COHORTS.c.reclaim_policy).where(
            COHORTS.c.reclaim_policy.is_not(None)
        )
        with self._engine.begin() as connection:
            return {name: dict(policy) for name, policy in connection.execute(query)}

    def set_cohort_policy(
        self, cohort: str, overrides: Mapping[str, object] | None, by: str
    ) -> bool:
        """Store ``cohort``'s overrides of the site's policy (None: it follows the site's),
        checked by the caller (``policy_problems``). False if there is no such cohort."""
        stored = None if overrides is None else dict(overrides)
        now = self._now()
        with self._write() as connection:
            changed = connection.execute(
                update(COHORTS)
                .where(COHORTS.c.name == cohort)
                # SQL NULL, not JSON's null: "no overrides" is what the reads look for.
                .values(reclaim_policy=null() if stored is None else stored)
                .values(updated_at=now, updated_by=by)
            ).rowcount
            if changed:
                detail = {"reclaim_policy": stored}
                _audit(
                    connection, now, Actor(by), "cohort.reclaim_policy", f"cohort {cohort}", detail
                )
        return bool(changed)


def _holder(connection: Connection, user: str, server: str, block_id: str) -> str:
    """The id of ``user``'s live machine ``server`` if it holds ``block_id``, its row locked
    (PostgreSQL) so that presses on one machine take turns; UnknownDevices if not."""
    machine_id = connection.scalar(
        select(MACHINES.c.id)
        .where(
            MACHINES.c.user_name == user,
            MACHINES.c.server_name == server,
            MACHINES.c.state.not_in(sorted(TERMINAL)),
        )
        .with_for_update()
    )
    if machine_id is None or not _holds(connection, machine_id, block_id):
        raise UnknownDevices([block_id])
    return cast(str, machine_id)


def _holds(connection: Connection, machine_id: str, block_id: str) -> bool:
    whole = select(DEVICES.c.block_id).where(
        DEVICES.c.block_id == block_id, DEVICES.c.machine_id == machine_id
    )
    share = select(SHARES.c.block_id).where(
        SHARES.c.block_id == block_id, SHARES.c.machine_id == machine_id
    )
    return connection.execute(whole.union_all(share)).first() is not None


def _held(connection: Connection, keys: Mapping[Key, object]) -> set[Key]:
    """Which of ``keys`` are held now: the machine holds the GPU whole or a share of it."""
    machines = sorted({machine_id for machine_id, _ in keys})
    whole = select(DEVICES.c.machine_id, DEVICES.c.block_id).where(
        DEVICES.c.machine_id.in_(machines)
    )
    share = select(SHARES.c.machine_id, SHARES.c.block_id).where(SHARES.c.machine_id.in_(machines))
    held = {(m, b) for m, b in connection.execute(whole.union_all(share))}
    return held & set(keys)


def _insert_missing(dialect: str) -> Any:
    """Insert a watch row unless one is there already (on SQLite and PostgreSQL)."""
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(WATCHES)
    return statement.on_conflict_do_nothing(index_elements=["machine_id", "block_id"])


def _upsert_watches(dialect: str) -> Any:
    """Insert, or update all but the keep fields a later *Keep* set; add the active seconds."""
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(WATCHES)
    sent, stored = statement.excluded, WATCHES.c
    kept_since = stored.keeps_used > sent.keeps_used
    set_: dict[str, Any] = {name: sent[name] for name in WATCH_FIELDS if name not in KEEP_FIELDS}
    set_.update({name: case((kept_since, stored[name]), else_=sent[name]) for name in KEEP_FIELDS})
    set_["active_s"] = stored.active_s + sent.active_s
    set_["updated_at"] = sent.updated_at
    return statement.on_conflict_do_update(index_elements=["machine_id", "block_id"], set_=set_)


def _values(watch: GpuWatch) -> dict[str, Any]:
    return asdict(watch)


def _watch(row: Any) -> GpuWatch:
    found = {name: row[name] for name in WATCH_FIELDS}
    if found["holders"] is not None:  # a JSON list
        found["holders"] = tuple(found["holders"])
    return GpuWatch(**found)
