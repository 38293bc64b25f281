"""What admins decide, in the ledger's database: quota rules, and the audit log of every change.

Reached as ``ledger.policy``. Every change writes its audit entry in the same
transaction, so no change is stored without who made it, and from where.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, insert, or_, select, update

from composespawner.ledger.models import AuditEntryRow, QuotaRuleRow
from composespawner.quota import Level, Quota, QuotaRule, effective_quota, under_site_default

QUOTA_RULES = cast(Table, QuotaRuleRow.__table__)
AUDIT = cast(Table, AuditEntryRow.__table__)
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


class Policy:
    def __init__(
        self,
        engine: Engine,
        write: Callable[[], AbstractContextManager[Connection]],
        now: Callable[[], datetime],
    ) -> None:
        self._engine = engine
        self._write = write
        self._now = now

    # -- quota rules --------------------------------------------------------------

    def quota_rules(self, user: str | None = None, groups: Collection[str] = ()) -> list[QuotaRule]:
        """Every rule; with ``user``, those that apply to them: site, their cohorts, theirs."""
        query = select(QUOTA_RULES).order_by(QUOTA_RULES.c.level, QUOTA_RULES.c.subject)
        if user is not None:
            query = query.where(
                or_(
                    QUOTA_RULES.c.level == "site",
                    (QUOTA_RULES.c.level == "cohort") & QUOTA_RULES.c.subject.in_(list(groups)),
                    (QUOTA_RULES.c.level == "user") & (QUOTA_RULES.c.subject == user),
                )
            )
        with self._engine.begin() as connection:
            return [_rule(row._mapping) for row in connection.execute(query)]

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

    # -- the audit log ------------------------------------------------------------

    def audit_log(self, limit: int | None = 1000, oldest_first: bool = False) -> list[AuditEntry]:
        """The latest ``limit`` entries (None: all), newest first unless ``oldest_first``."""
        order = AUDIT.c.id if oldest_first else AUDIT.c.id.desc()
        query = select(AUDIT).order_by(order).limit(limit)
        with self._engine.begin() as connection:
            return [AuditEntry(**row._mapping) for row in connection.execute(query)]


def _audit(
    connection: Connection,
    at: datetime,
    actor: Actor,
    action: str,
    target: str,
    detail: dict[str, Any],
) -> None:
    connection.execute(
        insert(AUDIT).values(
            at=at,
            actor=actor.name,
            origin=actor.origin,
            action=action,
            target=target,
            detail=detail,
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
