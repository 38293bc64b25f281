"""What the portal shows and accepts, as plain data: pure functions, no I/O.

The portal's service and handlers read the ledger and the hub, then call these
to build their JSON (and the pages' context), and to turn request bodies into
quota rules or refuse them with a message a person can act on. The starter
kits' are in ``kit_views``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import date, datetime, timedelta
from typing import Any, TypeVar

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import Cohort, InvalidCohort, Session
from composespawner.domain.colocation import InvalidRegistration, Registration
from composespawner.domain.quotas import InvalidQuota, Level, Quota, QuotaRule
from composespawner.domain.request import share_label, share_word
from composespawner.ledger import (
    AuditEntry,
    Holding,
)
from composespawner.services.resize import MOST_AT_ONCE

T = TypeVar("T")
LIMITS = tuple(f.name for f in fields(QuotaRule) if f.name not in ("level", "subject"))
MOST_MODELS = 100
MOST_SUBJECT = 255
MOST_LOAN = timedelta(days=366)
# What a kernel must take from a resized machine: the rest of its environment stays.
KERNEL_ENVIRONMENT = (
    "CUDA_VISIBLE_DEVICES",
    "COMPOSE_GPUS",
    "COMPOSE_GPU_MODELS",
    "COMPOSE_DEVICE_IDS",
)


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


COHORT_FIELDS = (
    "title",
    "starts_on",
    "ends_on",
    "sessions",
    "stacks",
    "sizes",
    "starter_kit",
    "reserved_model",
    "reserved_gpus",
    "reserved_share",
)


def cohort_json(
    cohort: Cohort, catalog: Catalog, next_session: datetime | None = None
) -> dict[str, Any]:
    return {
        "name": cohort.name,
        "title": cohort.title,
        "starts_on": _day(cohort.starts_on),
        "ends_on": _day(cohort.ends_on),
        "sessions": [str(s) for s in sorted(cohort.sessions)],
        "stacks": None if cohort.stacks is None else sorted(cohort.stacks),
        "sizes": None if cohort.sizes is None else sorted(cohort.sizes),
        "starter_kit": cohort.starter_kit,
        "reserved_model": cohort.reserved_model,
        "reserved_gpus": cohort.reserved_gpus,
        "reserved_share": cohort.reserved_share,
        "reservation": reservation_text(cohort, catalog),
        "next_session": None if next_session is None else iso(next_session),
    }


def cohort_from_json(name: str, body: object, catalog: Catalog) -> Cohort:
    """The cohort a PUT asks to store; InvalidCohort says what is wrong with it."""
    catalog_models = [m.id for m in catalog.gpu_models]
    if not isinstance(body, dict):
        raise InvalidCohort('send a JSON object, e.g. {"sessions": ["Mon 09:00-11:00"]}')
    unknown = sorted(set(body) - set(COHORT_FIELDS))
    if unknown:
        raise InvalidCohort(
            f"unknown field {unknown[0]!r}; the fields are {', '.join(COHORT_FIELDS)}"
        )
    sessions = _strings(body.get("sessions", []), "sessions")
    stacks = body.get("stacks")
    model = body.get("reserved_model")
    if model is not None and model not in catalog_models:
        known = ", ".join(sorted(catalog_models))
        raise InvalidCohort(f"unknown GPU model {model!r}; the catalog has: {known}")
    if stacks is not None:
        _known("stack", _strings(stacks, "stacks"), [s.id for s in catalog.stacks])
    sizes = body.get("sizes")
    if sizes is not None:
        _known("size", _strings(sizes, "sizes"), [s.id for s in catalog.sizes])
        if not sizes:
            raise InvalidCohort("sizes: name at least one size, or null for any size")
    kit = optional_text(body.get("starter_kit"), "starter_kit")
    if kit is not None:
        _known("starter kit", [kit], [k.id for k in catalog.kits])
        on = catalog.kit(kit)
        if on is not None and stacks is not None and on.stack not in stacks:
            raise InvalidCohort(
                f"the starter kit {kit!r} runs on the {on.stack!r} stack, which the cohort's"
                " stacks leave out: add it, or choose another kit"
            )
    return Cohort(
        name=name,
        title=_text(body.get("title", ""), "title"),
        starts_on=_date(body.get("starts_on"), "starts_on"),
        ends_on=_date(body.get("ends_on"), "ends_on"),
        sessions=tuple(Session.parse(text) for text in sessions),
        stacks=None if stacks is None else frozenset(_strings(stacks, "stacks")),
        sizes=None if sizes is None else frozenset(sizes),
        starter_kit=kit,
        reserved_model=model,
        reserved_gpus=body.get("reserved_gpus", 0),
        reserved_share=_reserved_share(body.get("reserved_share", 1), model, catalog),
    )


def _reserved_share(share: object, model: object, catalog: Catalog) -> int:
    """The share size a reservation is in: 1 (whole GPUs) or one its model is offered in."""
    if type(share) is not int:
        raise InvalidCohort(
            f"reserved_share must be a whole number, not {repr(share)[:40]}:"
            " send 1 for whole GPUs, or a share size such as 4 for quarters"
        )
    if share == 1:
        return share
    offered = catalog.gpu_model(model) if isinstance(model, str) else None
    if offered is None:
        raise InvalidCohort("reserved_share is for a reservation: name its reserved_model too")
    if share not in offered.shares:
        raise InvalidCohort(f"reserved_share: {shares_offered(offered.label, offered.shares)}")
    return share


def shares_offered(label: str, shares: Sequence[int]) -> str:
    """What to send for a model's shares: "NVIDIA T4 is offered in halves and quarters
    (reserved_share 2 or 4, or 1 for whole GPUs)"."""
    if not shares:
        return f"{label} is offered only whole: send reserved_share 1, or reserve a model in shares"
    words = " and ".join(share_word(n, plural=True) for n in shares)
    sizes = " or ".join(str(n) for n in shares)
    return f"{label} is offered in {words} (reserved_share {sizes}, or 1 for whole GPUs)"


def reservation_text(cohort: Cohort, catalog: Catalog) -> str:
    """A cohort's reservation as a person reads it: "48 × ¼ NVIDIA T4 (12 GPUs)", or ""."""
    if cohort.reserved_model is None:
        return ""
    model = catalog.gpu_model(cohort.reserved_model)
    label = model.label if model is not None else cohort.reserved_model
    if cohort.reserved_share == 1:
        return f"{cohort.reserved_gpus} × {label}"
    whole = cohort.reserved_whole
    gpus = f"{whole} GPU{'s' if whole != 1 else ''}"
    return f"{cohort.reserved_gpus} × {share_label(cohort.reserved_share)} {label} ({gpus})"


def _known(kind: str, asked: Collection[str], known: Collection[str]) -> None:
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise InvalidCohort(
            f"unknown {kind} {unknown[0]!r}; the catalog has: {', '.join(known) or 'none'}"
        )


def cohort_body_from_form(form: Mapping[str, str]) -> dict[str, Any]:
    """A page's cohort form as the API's body: sessions one per line, lists comma-separated,
    empty fields left out."""
    body: dict[str, Any] = {
        "title": form.get("title", "").strip(),
        "sessions": [
            line.strip() for line in form.get("sessions", "").splitlines() if line.strip()
        ],
    }
    for key in ("starts_on", "ends_on", "starter_kit", "reserved_model"):
        if form.get(key, "").strip():
            body[key] = form[key].strip()
    for key in ("stacks", "sizes"):
        if form.get(key, "").strip():
            body[key] = [s.strip() for s in form[key].split(",") if s.strip()]
    for key in ("reserved_gpus", "reserved_share"):
        if form.get(key, "").strip():
            body[key] = _number(key, form[key].strip())
    return body


RESERVATION_FIELDS = ("reserved_model", "reserved_gpus", "reserved_share")


class NotStaffsToChange(Exception):
    """Course staff asked to change what only admins may; the message says what."""


def staff_change(body: object, stored: Cohort | None) -> object:
    """The cohort body course staff may store: anything but the reservation.

    A reservation keeps GPUs from everyone outside the cohort, so its model and
    size stay the admins'. Staff who leave its fields out keep the stored
    reservation; sending a different one is refused.
    """
    if not isinstance(body, dict):
        return body  # cohort_from_json says what to send
    unreserved = {"reserved_model": None, "reserved_gpus": 0, "reserved_share": 1}
    kept = {name: getattr(stored, name) for name in RESERVATION_FIELDS} if stored else unreserved
    changed = [name for name in RESERVATION_FIELDS if body.get(name, kept[name]) != kept[name]]
    if changed:
        raise NotStaffsToChange(
            f"only the GPU pool's admins change a cohort's reservation ({changed[0]}); "
            "ask them, or leave the reservation's fields out"
        )
    return {**body, **kept}


def quota_json(quota: Quota) -> dict[str, Any]:
    return quota.as_dict()


def running(holdings: Iterable[Holding]) -> list[dict[str, Any]]:
    """Live machines holding GPUs: whose, where, how many (a share of 1/n counting 1/n, and
    named: "¼ of NVIDIA T4"), since when."""
    machines: dict[str, dict[str, Any]] = {}
    for h in holdings:
        if h.device.kind != "gpu":
            continue
        if h.machine_id is not None:
            _running_entry(machines, h.machine_id, h, 1, h.device.model)
        size = h.share_size or 1
        for s in h.shares:
            entry = _running_entry(machines, s.machine_id, s, 1 / size, h.device.model)
            entry["shares"].append(f"{share_label(size)} of {h.device.model}")
    for machine in machines.values():
        machine["gpus"] = _hours(machine["gpus"])
    return sorted(machines.values(), key=lambda m: (m["since"] or "", m["machine"]))


def _running_entry(
    machines: dict[str, dict[str, Any]], machine_id: str, h: Any, gpus: float, model: str
) -> dict[str, Any]:
    """Count ``gpus`` of ``model`` to the machine's entry in :func:`running`; ``h``: the
    Holding or ShareHolding that names its holder."""
    entry = machines.setdefault(
        machine_id,
        {
            "machine": machine_id,
            "user": h.user,
            "server": h.server,
            "host": h.host,
            "cohort": h.cohort,
            "gpus": 0,
            "shares": [],
            "models": [],
            "since": iso(h.held_since) if h.held_since else None,
        },
    )
    entry["gpus"] += gpus
    if model not in entry["models"]:
        entry["models"].append(model)
    return entry


def _hours(value: float) -> float:
    return round(value, 4)  # about a second: a short test run still shows


def notice_text(entry: AuditEntry) -> str:
    """What a user reads of an admin's action on their server."""
    server = entry.detail.get("server") or ""
    which = f"server '{server}'" if server else "default server"
    reason = entry.detail.get("reason") or "no reason given"
    return f"An admin ({entry.actor}) stopped your {which} at {iso(entry.at)}: {reason}"


def holding_json(h: Holding) -> dict[str, Any]:
    d = h.device
    holder = None
    if h.machine_id is not None:
        holder = {
            "user": h.user,
            "server": h.server,
            "machine": h.machine_id,
            "state": h.state,
            "host": h.host,
            "since": iso(h.held_since) if h.held_since else None,
            "cohort": h.cohort,
        }
    return {
        "id": d.block_id,
        "kind": d.kind,
        "model": d.model,
        "zones": sorted(d.zones),
        "chassis": d.chassis,
        "owner_group": d.owner_group,
        "last_seen": iso(h.last_seen),
        "holder": holder,
        "share": share_json(h),
    }


def share_json(h: Holding) -> dict[str, Any] | None:
    """A split GPU's slots and holders ("in quarters: 3 of 4 held by ada, bob, cy"), or None."""
    if h.share_size is None:
        return None
    held = [s for s in h.shares if not s.leaving]
    names = ", ".join(dict.fromkeys(s.user for s in held)) or "nobody (being detached)"
    return {
        "size": h.share_size,
        "held": len(held),
        "holders": [
            {
                "user": s.user,
                "server": s.server,
                "machine": s.machine_id,
                "state": s.state,
                "host": s.host,
                "since": iso(s.held_since),
                "cohort": s.cohort,
                "leaving": s.leaving,
            }
            for s in h.shares
        ],
        "text": (
            f"in {share_word(h.share_size, plural=True)}: {len(held)} of {h.share_size}"
            f" held by {names}"
        ),
    }


def colocated(
    holdings: Iterable[Holding],
    registrations: Mapping[str, Registration],
    groups: Collection[str] | None,
) -> list[dict[str, Any]]:
    """The GPUs an admin may register (``groups`` None: every GPU) or a member may lend
    (only their groups' registered ones), each with its owner, loan and holder."""
    rows = []
    for h in holdings:
        registration = registrations.get(h.device.block_id)
        if h.device.kind != "gpu":
            continue
        if groups is not None and (registration is None or registration.owner_group not in groups):
            continue
        row = holding_json(h)
        row["registered"] = registration is not None
        row["loan"] = loan_json(registration)
        rows.append(row)
    return rows


def loan_from_json(registration: Registration, body: object, now: datetime) -> Registration:
    """The registration lent as a PUT asks: ``{"user": ...}`` or ``{"group": ...}``, ``until``."""
    if not isinstance(body, dict) or set(body) - {"user", "group", "until"}:
        raise InvalidRegistration(
            'send {"user": NAME} or {"group": NAME}, and "until": "2026-12-01"'
        )
    user, group = body.get("user"), body.get("group")
    if (user is None) == (group is None):
        raise InvalidRegistration("lend to a user or to a group: name one of them")
    who = _text(user if user is not None else group, "user" if user is not None else "group")
    check_subject("user" if user is not None else "cohort", who)
    until_day = _date(body.get("until"), "until")
    if until_day is None:
        raise InvalidRegistration("say until when: until must be a date written 2026-12-01")
    until = datetime.combine(until_day, datetime.min.time(), now.tzinfo)
    if until <= now or until - now > MOST_LOAN:
        raise InvalidRegistration(f"a loan ends after today and within {MOST_LOAN.days} days")
    return replace(
        registration,
        lent_to_user=who if user is not None else None,
        lent_to_group=who if group is not None else None,
        lent_until=until,
    )


def loan_json(registration: Registration | None) -> dict[str, Any] | None:
    if registration is None or registration.lent_until is None:
        return None
    return {
        "user": registration.lent_to_user,
        "group": registration.lent_to_group,
        "until": iso(registration.lent_until),
    }


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": iso(entry.at),
        "actor": entry.actor,
        "origin": entry.origin,
        "action": entry.action,
        "target": entry.target,
        "detail": entry.detail,
    }


AUDIT_COLUMNS = ("id", "at", "actor", "origin", "action", "target", "detail")


def _strings(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidCohort(f"{name} must be a list of strings")
    if len(value) > MOST_MODELS:
        raise InvalidCohort(f"{name}: at most {MOST_MODELS}")
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or len(value) > MOST_SUBJECT:
        raise InvalidCohort(f"{name} must be text of at most {MOST_SUBJECT} characters")
    return value


def optional_text(value: object, name: str) -> str | None:
    """Text of at most MOST_SUBJECT characters, or None; InvalidCohort otherwise."""
    return None if value is None else _text(value, name)


def _date(value: object, name: str) -> date | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise InvalidCohort(f"{name} must be a date written 2026-09-01")


def _day(day: date | None) -> str | None:
    return None if day is None else day.isoformat()


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


def iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


class InvalidGrow(ValueError):
    """A grow's body that asks for nothing sensible; the message says what to send."""


def grow_count(body: object) -> int:
    """How many GPUs a grow asks for: ``{"count": N}``, N from 1 to MOST_AT_ONCE (1 if left out)."""
    if not isinstance(body, dict) or set(body) - {"count"}:
        raise InvalidGrow('Send {"count": N}: how many GPUs to add to your server.')
    count = body.get("count", 1)
    if type(count) is not int or not 1 <= count <= MOST_AT_ONCE:
        shown = repr(count)[:40]
        raise InvalidGrow(f"count must be a whole number from 1 to {MOST_AT_ONCE}, not {shown}.")
    return count


PAGE_ROWS = 200  # rows of a long table per page (JupyterHub's admin page shows 50 users)


@dataclass(frozen=True)
class Paging:
    """Which page of a long table is shown: ``number`` of ``pages``, from 1."""

    number: int
    pages: int
    total: int


def page_of(
    rows: Sequence[T], asked: str | None, per_page: int = PAGE_ROWS
) -> tuple[Sequence[T], Paging]:
    """The rows of page ``asked`` (the query's text; the first page for anything unusable,
    the last for a number past it), and where it is."""
    pages = max(1, -(-len(rows) // per_page))
    number = int(asked) if asked and asked.isascii() and asked.isdigit() else 1
    number = min(max(number, 1), pages)
    start = (number - 1) * per_page
    return rows[start : start + per_page], Paging(number, pages, len(rows))
