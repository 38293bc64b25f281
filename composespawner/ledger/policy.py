"""What admins decide, in the ledger's database: quota rules, and the audit log of every change.

Reached as ``ledger.policy``. Every change writes its audit entry in the same
transaction, so no change is stored without who made it, and from where.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, delete, insert, or_, select, update

from composespawner.ledger.models import AuditEntryRow, QuotaRuleRow
from composespawner.quota import Level, QuotaRule

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

    def audit_log(self, *, limit: int = 1000) -> list[AuditEntry]:
        """The latest ``limit`` entries, newest first."""
        query = select(AUDIT).order_by(AUDIT.c.id.desc()).limit(limit)
        with self._engine.begin() as connection:
            return [AuditEntry(**row._mapping) for row in connection.execute(query)]

    def iter_audit_log(self) -> Iterator[AuditEntry]:
        """Every entry, oldest first (for exports)."""
        with self._engine.connect() as connection:
            for row in connection.execute(select(AUDIT).order_by(AUDIT.c.id)):
                yield AuditEntry(**row._mapping)


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
