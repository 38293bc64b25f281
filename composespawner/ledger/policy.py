"""What admins decide, in the ledger's database: quota rules, and the audit log of every change.

Reached as ``ledger.policy``. Every change writes its audit entry in the same
transaction, so no change is stored without who made it, and from where.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields
from datetime import date, datetime
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from composespawner.domain.cohorts import Cohort, Session
from composespawner.domain.colocation import Registration
from composespawner.domain.quotas import (
    Level,
    Quota,
    QuotaRule,
    effective_quota,
    under_site_default,
)
from composespawner.ledger.database import LedgerPart
from composespawner.ledger.errors import UnknownDevices
from composespawner.ledger.models import (
    AuditEntryRow,
    CohortRow,
    ColocatedRow,
    DeviceRow,
    DeviceShareRow,
    MachineRow,
    QuotaRuleRow,
)

QUOTA_RULES = cast(Table, QuotaRuleRow.__table__)
AUDIT = cast(Table, AuditEntryRow.__table__)
COHORTS = cast(Table, CohortRow.__table__)
COLOCATED = cast(Table, ColocatedRow.__table__)
MACHINES = cast(Table, MachineRow.__table__)
SHARES = cast(Table, DeviceShareRow.__table__)
DEVICES = cast(Table, DeviceRow.__table__)
LIMIT_COLUMNS = tuple(f.name for f in fields(QuotaRule) if f.name not in ("level", "subject"))


@dataclass(frozen=True)
class Actor:
    """Who does something, and from where (the client's address as the hub saw it)."""

    name: str
    origin: str = ""


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    origin: str
    action: str
    target: str
    detail: dict[str, Any]
    about_user: str | None = None


class Policy(LedgerPart):
    """Quota rules, cohorts, co-located devices and the audit log."""

    # -- quota rules --------------------------------------------------------------

    def quota_rules(self, user: str | None = None, groups: Collection[str] = ()) -> list[QuotaRule]:
        """Every rule; with ``user``, those that apply to them: site, their cohorts, theirs."""
        with self._engine.begin() as connection:
            return _quota_rules(connection, user, groups)

    def quota_of(self, user: str, groups: Collection[str], site_default: QuotaRule) -> Quota:
        """The effective quota of ``user`` in ``groups``: ``site_default`` (the config's)
        under the stored site rule, then their cohorts' rules and their own."""
        rules = under_site_default(self.quota_rules(user, groups), site_default)
        return effective_quota(rules, user, groups)

    def set_quota_rule(self, rule: QuotaRule, actor: Actor) -> None:
        """Store ``rule`` in place of what its level and subject said before."""
        values = _limit_values(rule)
        now = self._now()
        key = {"level": rule.level, "subject": rule.subject}
        stamp = {"updated_at": now, "updated_by": actor.name}
        with self._write() as connection:
            changed = connection.execute(
                update(QUOTA_RULES).where(*_is(key)).values(**values, **stamp)
            ).rowcount
            if not changed:
                connection.execute(insert(QUOTA_RULES).values(**key, **values, **stamp))
            _audit(connection, now, actor, "quota.set", _target(rule.level, rule.subject), values)

    def delete_quota_rule(self, level: Level, subject: str, actor: Actor) -> bool:
        """Remove what a level says about ``subject``; False if it said nothing."""
        now = self._now()
        key = {"level": level, "subject": subject}
        with self._write() as connection:
            removed = connection.execute(delete(QUOTA_RULES).where(*_is(key))).rowcount
            if removed:
                _audit(connection, now, actor, "quota.delete", _target(level, subject), {})
        return bool(removed)

    # -- cohorts ----------------------------------------------------------------------

    def cohorts(self, names: Collection[str] | None = None) -> list[Cohort]:
        """Every cohort, or those of ``names`` (a user's groups)."""
        query = _COHORTS if names is None else _COHORTS.where(COHORTS.c.name.in_(list(names)))
        with self._engine.begin() as connection:
            return [_cohort(row._mapping) for row in connection.execute(query)]

    def cohort_names(self) -> list[str]:
        with self._engine.begin() as connection:
            return list(connection.scalars(select(COHORTS.c.name).order_by(COHORTS.c.name)))

    def set_cohort(self, cohort: Cohort, actor: Actor) -> None:
        """Store ``cohort`` in place of what was stored under its name."""
        values = _cohort_values(cohort)
        now = self._now()
        stamp = {"updated_at": now, "updated_by": actor.name}
        with self._write() as connection:
            where = COHORTS.c.name == cohort.name
            if not connection.execute(
                update(COHORTS).where(where).values(**values, **stamp)
            ).rowcount:
                connection.execute(insert(COHORTS).values(name=cohort.name, **values, **stamp))
            detail = {
                **values,
                "starts_on": _day(cohort.starts_on),
                "ends_on": _day(cohort.ends_on),
            }
            _audit(connection, now, actor, "cohort.set", f"cohort {cohort.name}", detail)

    def delete_cohort(self, name: str, actor: Actor) -> bool:
        """Remove a cohort (its group and quota rule stay); False if there was none."""
        now = self._now()
        with self._write() as connection:
            removed = connection.execute(delete(COHORTS).where(COHORTS.c.name == name)).rowcount
            if removed:
                _audit(connection, now, actor, "cohort.delete", f"cohort {name}", {})
        return bool(removed)

    def spawn_policy(
        self, user: str, groups: Collection[str], site_default: QuotaRule
    ) -> SpawnPolicy:
        """What a spawn needs of the policy, in one read: the user's quota, the cohorts
        with a reservation and, when there are any, what their members hold under them,
        and the co-located devices registered in the portal."""
        with self._engine.begin() as connection:
            rules = under_site_default(_quota_rules(connection, user, groups), site_default)
            reserving = [_cohort(r._mapping) for r in connection.execute(_RESERVING_COHORTS)]
            held = _held_under_cohorts(connection) if reserving else {}
            registered = _registrations(connection)
            own = _cohorts_named(connection, groups) if groups else []
        return SpawnPolicy(effective_quota(rules, user, groups), reserving, held, registered, own)

    # -- co-located devices --------------------------------------------------------

    def registrations(self) -> dict[str, Registration]:
        """block → its registration, for every co-located device registered in the portal."""
        with self._engine.begin() as connection:
            return _registrations(connection)

    def register_device(self, block_id: str, owner_group: str, actor: Actor) -> Registration:
        """Make a device the owner group's (ending any loan). UnknownDevices if never seen."""
        now = self._now()
        with self._write() as connection:
            if connection.execute(_DEVICE_KIND, {"b_block": block_id}).first() is None:
                raise UnknownDevices([block_id])
            values = {
                "owner_group": owner_group,
                "lent_to_user": None,
                "lent_to_group": None,
                "lent_until": None,
            }
            _upsert_registration(connection, block_id, values, now, actor)
            # The ledger's own column too, so claims see the owner before hubs sync again.
            connection.execute(
                update(DEVICES)
                .where(DEVICES.c.block_id == block_id)
                .values(owner_group=owner_group)
            )
            _audit(connection, now, actor, "device.register", f"device {block_id}", values)
        return Registration(block_id, owner_group)

    def unregister_device(
        self, block_id: str, actor: Actor, catalog_owner: str | None = None
    ) -> bool:
        """Give a registered device back: to ``catalog_owner`` (its chassis owner in the
        catalog), or to the pool. False if it was not registered."""
        now = self._now()
        with self._write() as connection:
            removed = connection.execute(
                delete(COLOCATED).where(COLOCATED.c.block_id == block_id)
            ).rowcount
            if removed:
                connection.execute(
                    update(DEVICES)
                    .where(DEVICES.c.block_id == block_id)
                    .values(owner_group=catalog_owner)
                )
                detail = {"owner_group": catalog_owner}
                _audit(connection, now, actor, "device.unregister", f"device {block_id}", detail)
        return bool(removed)

    def lend(self, registration: Registration, actor: Actor) -> None:
        """Store a loan (or its end: a registration lent to nobody) of a registered device."""
        now = self._now()
        values = {
            "lent_to_user": registration.lent_to_user,
            "lent_to_group": registration.lent_to_group,
            "lent_until": registration.lent_until,
        }
        with self._write() as connection:
            changed = connection.execute(
                update(COLOCATED)
                .where(
                    COLOCATED.c.block_id == registration.block_id,
                    COLOCATED.c.owner_group == registration.owner_group,
                )
                .values(**values, updated_at=now, updated_by=actor.name)
            ).rowcount
            if not changed:
                raise UnknownDevices([registration.block_id])
            action = "device.lend" if registration.lent_until else "device.take_back"
            detail = {**values, "lent_until": _iso(registration.lent_until)}
            _audit(connection, now, actor, action, f"device {registration.block_id}", detail)

    # -- telling users ------------------------------------------------------------

    def note_force_release(
        self, machine_id: str, user: str, server: str, reason: str, actor: Actor
    ) -> None:
        """Record that an admin is stopping a user's server, and why: the user is shown it."""
        with self._write() as connection:
            _audit(
                connection,
                self._now(),
                actor,
                "machine.release",
                f"machine {machine_id} ({user}/{server})",
                {"machine": machine_id, "server": server, "reason": reason},
                about=user,
            )

    def notices(self, user: str, since: datetime) -> list[AuditEntry]:
        """What admins did to ``user``'s servers since ``since``, newest first."""
        query = (
            select(AUDIT)
            .where(AUDIT.c.about_user == user, AUDIT.c.at >= since)
            .order_by(AUDIT.c.id.desc())
        )
        with self._engine.begin() as connection:
            return [AuditEntry(**row._mapping) for row in connection.execute(query)]

    # -- the audit log ------------------------------------------------------------

    def audit_log(self, limit: int | None = 1000, oldest_first: bool = False) -> list[AuditEntry]:
        """The latest ``limit`` entries (None: all), newest first unless ``oldest_first``."""
        order = AUDIT.c.id if oldest_first else AUDIT.c.id.desc()
        query = select(AUDIT).order_by(order).limit(limit)
        with self._engine.begin() as connection:
            return [AuditEntry(**row._mapping) for row in connection.execute(query)]


@dataclass(frozen=True)
class SpawnPolicy:
    quota: Quota
    reserving: list[Cohort]  # cohorts with a reservation, in session or not
    # (cohort, fabric GPU model) → GPUs held under it, a share of 1/n counting 1/n
    held: dict[tuple[str, str], float]
    registrations: dict[str, Registration] = field(default_factory=dict)  # co-located, by block
    cohorts: list[Cohort] = field(default_factory=list)  # the user's own, running or not


_COHORTS = select(COHORTS).order_by(COHORTS.c.name)
_RESERVING_COHORTS = select(COHORTS).where(COHORTS.c.reserved_gpus > 0)
_HELD_UNDER_COHORTS = (
    select(MACHINES.c.cohort, DEVICES.c.model, func.count())
    .join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
    .where(MACHINES.c.cohort.is_not(None), DEVICES.c.kind == "gpu")
    .group_by(MACHINES.c.cohort, DEVICES.c.model)
)
_SHARES_HELD_UNDER_COHORTS = (
    select(MACHINES.c.cohort, DEVICES.c.model, DEVICES.c.share_size, func.count())
    .select_from(SHARES)
    .join(MACHINES, SHARES.c.machine_id == MACHINES.c.id)
    .join(DEVICES, SHARES.c.block_id == DEVICES.c.block_id)
    .where(MACHINES.c.cohort.is_not(None), DEVICES.c.share_size.is_not(None))
    .group_by(MACHINES.c.cohort, DEVICES.c.model, DEVICES.c.share_size)
)


def _cohorts_named(connection: Connection, names: Collection[str]) -> list[Cohort]:
    query = select(COHORTS).where(COHORTS.c.name.in_(sorted(names)))
    return [_cohort(r._mapping) for r in connection.execute(query)]


def _held_under_cohorts(connection: Connection) -> dict[tuple[str, str], float]:
    held: dict[tuple[str, str], float] = {
        (c, m): n for c, m, n in connection.execute(_HELD_UNDER_COHORTS)
    }
    for c, m, size, n in connection.execute(_SHARES_HELD_UNDER_COHORTS):
        held[(c, m)] = held.get((c, m), 0) + n / size
    return held


def _quota_rules(
    connection: Connection, user: str | None, groups: Collection[str]
) -> list[QuotaRule]:
    query = select(QUOTA_RULES).order_by(QUOTA_RULES.c.level, QUOTA_RULES.c.subject)
    if user is not None:
        query = query.where(
            or_(
                QUOTA_RULES.c.level == "site",
                (QUOTA_RULES.c.level == "cohort") & QUOTA_RULES.c.subject.in_(list(groups)),
                (QUOTA_RULES.c.level == "user") & (QUOTA_RULES.c.subject == user),
            )
        )
    return [_rule(row._mapping) for row in connection.execute(query)]


def _cohort_values(cohort: Cohort) -> dict[str, Any]:
    return {
        "title": cohort.title,
        "starts_on": cohort.starts_on,
        "ends_on": cohort.ends_on,
        "sessions": [str(s) for s in sorted(cohort.sessions)],
        "stacks": None if cohort.stacks is None else sorted(cohort.stacks),
        "sizes": None if cohort.sizes is None else sorted(cohort.sizes),
        "starter_kit": cohort.starter_kit,
        "reserved_model": cohort.reserved_model,
        "reserved_gpus": cohort.reserved_gpus,
        "reserved_share": cohort.reserved_share,
    }


def _day(day: date | None) -> str | None:
    return None if day is None else day.isoformat()


def _cohort(row: Any) -> Cohort:
    stacks, sizes = row["stacks"], row["sizes"]
    return Cohort(
        name=row["name"],
        title=row["title"],
        starts_on=row["starts_on"],
        ends_on=row["ends_on"],
        sessions=tuple(Session.parse(text) for text in row["sessions"]),
        stacks=None if stacks is None else frozenset(stacks),
        sizes=None if sizes is None else frozenset(sizes),
        starter_kit=row["starter_kit"],
        reserved_model=row["reserved_model"],
        reserved_gpus=row["reserved_gpus"],
        reserved_share=row["reserved_share"],
    )


_REGISTRATIONS = select(COLOCATED).order_by(COLOCATED.c.block_id)
_DEVICE_KIND = select(DEVICES.c.kind).where(DEVICES.c.block_id == bindparam("b_block"))


def _registrations(connection: Connection) -> dict[str, Registration]:
    return {r.block_id: r for r in map(registration_of, connection.execute(_REGISTRATIONS))}


def registration_of(row: Any) -> Registration:
    """A ``colocated`` row as the domain's Registration."""
    m = row._mapping
    return Registration(
        m["block_id"], m["owner_group"], m["lent_to_user"], m["lent_to_group"], m["lent_until"]
    )


def _upsert_registration(
    connection: Connection, block_id: str, values: dict[str, Any], now: datetime, actor: Actor
) -> None:
    stamp = {"updated_at": now, "updated_by": actor.name}
    where = COLOCATED.c.block_id == block_id
    if not connection.execute(update(COLOCATED).where(where).values(**values, **stamp)).rowcount:
        connection.execute(insert(COLOCATED).values(block_id=block_id, **values, **stamp))


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _audit(
    connection: Connection,
    at: datetime,
    actor: Actor,
    action: str,
    target: str,
    detail: dict[str, Any],
    about: str | None = None,
) -> None:
    connection.execute(
        insert(AUDIT).values(
            at=at,
            actor=actor.name,
            origin=actor.origin,
            action=action,
            target=target,
            detail=detail,
            about_user=about,
        )
    )


def _is(key: dict[str, str]) -> list[Any]:
    return [QUOTA_RULES.c[name] == value for name, value in key.items()]


def _target(level: str, subject: str) -> str:
    return f"quota {level}" + (f" {subject}" if subject else "")


def _limit_values(rule: QuotaRule) -> dict[str, Any]:
    values = {name: value for name, value in asdict(rule).items() if name in LIMIT_COLUMNS}
    if rule.models is not None:
        values["models"] = sorted(rule.models)
    return values


def _rule(row: Any) -> QuotaRule:
    models = row["models"]
    limits = {name: row[name] for name in LIMIT_COLUMNS}
    limits["models"] = None if models is None else frozenset(models)
    return QuotaRule(level=row["level"], subject=row["subject"], **limits)
