"""What the portal shows and accepts, as plain data: pure functions, no I/O.

Handlers read the ledger and the hub, then call these to build their JSON (and
the pages' context), and to turn request bodies into quota rules or refuse them
with a message a person can act on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import fields
from datetime import datetime
from typing import Any

from ..ledger import AuditEntry, DeviceRecord, Machine
from ..quota import InvalidQuota, Level, Quota, QuotaRule

LIMITS = tuple(f.name for f in fields(QuotaRule) if f.name not in ("level", "subject"))
MOST_MODELS = 100
MOST_SUBJECT = 255


def rule_json(rule: QuotaRule) -> dict[str, Any]:
    """A rule as the API shows it: every limit, unset ones as null."""
    limits = {name: getattr(rule, name) for name in LIMITS}
    if rule.models is not None:
        limits["models"] = sorted(rule.models)
    return {"level": rule.level, "subject": rule.subject, **limits}


def rule_from_json(
    level: Level, subject: str, body: object, catalog_models: Collection[str]
) -> QuotaRule:
    """The rule a PUT asks to store; InvalidQuota says what is wrong with it.

    The body is a JSON object of limits; a missing or null limit is not set at
    this level. Models are the catalog's ids.
    """
    if not isinstance(body, dict):
        raise InvalidQuota('send a JSON object of limits, e.g. {"gpus_held": 2}')
    unknown = sorted(set(body) - set(LIMITS))
    if unknown:
        raise InvalidQuota(f"unknown limit {unknown[0]!r}; the limits are {', '.join(LIMITS)}")
    check_subject(level, subject)
    limits = {name: body.get(name) for name in LIMITS}
    limits["models"] = _models(limits["models"], catalog_models)
    return QuotaRule(level, subject, **limits)


def rule_from_form(
    level: str, subject: str, form: Mapping[str, str], catalog_models: Collection[str]
) -> QuotaRule:
    """The rule a page's form asks to store: empty fields are not set at this level."""
    if level not in ("site", "cohort", "user"):
        raise InvalidQuota("choose the site default, a cohort or a user")
    body: dict[str, Any] = {}
    for name in LIMITS:
        text = form.get(name, "").strip()
        if not text:
            continue
        if name == "models":
            body[name] = [m.strip() for m in text.split(",") if m.strip()]
        else:
            body[name] = _number(name, text)
    return rule_from_json(level, subject.strip(), body, catalog_models)  # type: ignore[arg-type]


def check_subject(level: str, subject: str) -> None:
    if level == "site":
        if subject:
            raise InvalidQuota("the site default names no subject")
        return
    if not subject or len(subject) > MOST_SUBJECT:
        raise InvalidQuota(f"name the {level}: 1 to {MOST_SUBJECT} characters")
    if not subject.isprintable():
        raise InvalidQuota(f"the {level}'s name has a control character; no hub name does")


def quota_json(quota: Quota) -> dict[str, Any]:
    return quota.as_dict()


def my_machine(
    user: str,
    groups: Iterable[str],
    quota: Quota,
    machines: Iterable[Machine],
    devices: Mapping[str, DeviceRecord],
    gpu_hours_week: float,
) -> dict[str, Any]:
    """One user's servers and machines, their effective quota and their use of it."""
    servers = [_server(machine, devices) for machine in machines]
    gpus = sum(len(s["gpus"]) for s in servers)
    return {
        "name": user,
        "groups": sorted(groups),
        "quota": quota_json(quota),
        "use": {
            "gpus_held": gpus,
            "servers": len(servers),
            "gpu_hours_week": round(gpu_hours_week, 3),
        },
        "servers": servers,
    }


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": _iso(entry.at),
        "actor": entry.actor,
        "origin": entry.origin,
        "action": entry.action,
        "target": entry.target,
        "detail": entry.detail,
    }


AUDIT_COLUMNS = ("id", "at", "actor", "origin", "action", "target", "detail")


def _server(machine: Machine, devices: Mapping[str, DeviceRecord]) -> dict[str, Any]:
    held = [devices[b] for b in machine.block_ids if b in devices]
    return {
        "server": machine.server_name,
        "machine": machine.id,
        "state": machine.state,
        "host": machine.host_id,
        "zone": machine.zone,
        "since": _iso(machine.created_at),
        "gpus": [{"id": d.block_id, "model": d.model} for d in held if d.kind == "gpu"],
        "devices": [{"id": d.block_id, "kind": d.kind, "model": d.model} for d in held],
    }


def _models(value: object, catalog_models: Collection[str]) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise InvalidQuota('models must be a list of GPU model ids, e.g. ["t4"]')
    if len(value) > MOST_MODELS:
        raise InvalidQuota(f"models: at most {MOST_MODELS}")
    unknown = sorted(set(value) - set(catalog_models))
    if unknown:
        known = ", ".join(sorted(catalog_models))
        raise InvalidQuota(f"unknown GPU model {unknown[0]!r}; the catalog has: {known}")
    return frozenset(value)


def _number(name: str, text: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise InvalidQuota(f"{name} must be a number, not {text!r}") from None


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")
