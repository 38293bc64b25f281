"""What the portal tells a user of their idle GPUs (issue 32). Pure: watches in, JSON out.

The reclaimer stores one :class:`~composespawner.domain.reclaim.GpuWatch` per GPU a
running machine holds. Each GPU of *my machine*, of ``GET {gpus}`` and so of
``client.machine()`` and the JupyterLab extension carries what it says:

- ``idle_s``: seconds without work, over readings the reclaimer actually saw (None
  while it has no fresh reading: unknown is not idle, and a stale figure would mislead);
- ``warning``: set once the reclaimer warned about the GPU, ``reclaim_at`` (when it
  goes, and the kernels holding it with it, if it stays idle; None while one of them
  may be using another GPU of the server), a ``message`` for a person, ``keep_allowed``
  and ``keeps_left``;
- ``kept_until``: while a *Keep* press holds every step off.

The same :func:`~composespawner.domain.reclaim.decide` the reclaimer acts on computes
the figures, so what a user is told is what will happen.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from composespawner.domain.reclaim import (
    GpuWatch,
    ReclaimPolicy,
    decide,
    kernels_holding,
    reclaim_times,
)
from composespawner.ledger import AuditEntry
from composespawner.portal.views import notice_text

GIVEN_BACK = {"gpu.detach", "gpu.reclaim"}


def server_states(
    watches: Mapping[str, GpuWatch | None],
    models: Mapping[str, str],
    policy: ReclaimPolicy,
    now: float,
    zone: tzinfo,
) -> dict[str, dict[str, Any]]:
    """The reclaim fields of each GPU of one server (``watches`` by GPU id).

    A reclaim ends the kernels holding its GPU (every kernel of the server where they
    are unknown), so the reclaimer holds it back while one of them may be using a GPU
    that stays: a warned GPU goes with the warned GPUs it is entangled with, once the
    last is due, and is told it waits, with no time, while it is entangled with one not
    warned about (:func:`reclaim_times`, from the rule the reclaimer acts on).
    """
    figures = {gpu: _fresh_figures(watch, policy, now) for gpu, watch in watches.items()}
    warned: dict[str, tuple[tuple[str, ...] | None, float]] = {}
    for gpu, watch in watches.items():
        found = figures[gpu]
        if watch is not None and found is not None and _warned(watch, found, now):
            warned[gpu] = (watch.holders, found["reclaim_at"])
    others = {gpu: w.holders if w else None for gpu, w in watches.items() if gpu not in warned}
    goes_at = reclaim_times(warned, others)
    return {
        gpu: gpu_state(
            watch, policy, models[gpu], now, zone, goes_at=goes_at.get(gpu), figures=figures[gpu]
        )
        for gpu, watch in watches.items()
    }


def gpu_state(
    watch: GpuWatch | None,
    policy: ReclaimPolicy,
    model: str,
    now: float,
    zone: tzinfo,
    *,
    goes_at: float | None = None,
    figures: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The reclaim fields of one GPU (see the module's docstring); ``goes_at``: when a
    warned one goes (None: it waits for another GPU of the server); ``figures``: the
    policy's, when the caller has them already (:func:`_fresh_figures`)."""
    kept_until = _kept_until(watch, now)
    state: dict[str, Any] = {
        "idle_s": None,
        "utilization": None,
        "memory_used_mib": None,
        "warning": None,
        "kept_until": None if kept_until is None else _at(kept_until, zone),
        "keeps_left": keeps_left(watch, policy),
    }
    if figures is None:
        figures = _fresh_figures(watch, policy, now)
    if watch is None or figures is None:
        return state  # no fresh reading: the reclaimer is not acting on this GPU either
    state.update(
        idle_s=round(figures["idle_s"]),
        utilization=watch.utilization,
        memory_used_mib=watch.memory_used_mib,
    )
    if _warned(watch, figures, now):
        keeps = state["keeps_left"]
        state["warning"] = warning(
            figures, policy, model, keeps, now, zone, holders=watch.holders, goes_at=goes_at
        )
    return state


def _fresh_figures(
    watch: GpuWatch | None, policy: ReclaimPolicy, now: float
) -> Mapping[str, float] | None:
    """The policy's figures of a GPU with a fresh reading; None without one."""
    if watch is None or watch.since is None or not 0 <= now - watch.last_at <= policy.max_gap:
        return None
    return decide(watch, policy, now).figures


def _kept_until(watch: GpuWatch | None, now: float) -> float | None:
    kept_until = watch.kept_until if watch is not None else None
    return kept_until if kept_until is not None and kept_until > now else None  # ran out


def _warned(watch: GpuWatch, figures: Mapping[str, float], now: float) -> bool:
    return "warned_at" in figures and _kept_until(watch, now) is None


def with_states(
    server: dict[str, Any], states: Mapping[str, dict[str, Any]], policy: ReclaimPolicy
) -> dict[str, Any]:
    """A server's JSON (``machine_views``) with each GPU's reclaim fields and its policy."""
    gpus = [{**gpu, **states.get(gpu["id"], {})} for gpu in server["gpus"]]
    return {**server, "gpus": gpus, "reclaim_policy": policy.as_dict()}


def keeps_left(watch: GpuWatch | None, policy: ReclaimPolicy) -> int | None:
    """*Keep* presses left on this GPU until its server starts again (None: no limit)."""
    if policy.keeps_allowed is None:
        return None
    return max(policy.keeps_allowed - (watch.keeps_used if watch else 0), 0)


def warning(
    figures: Mapping[str, float],
    policy: ReclaimPolicy,
    model: str,
    keeps: int | None,
    now: float,
    zone: tzinfo,
    *,
    holders: tuple[str, ...] | None = None,
    goes_at: float | None = None,
) -> dict[str, Any]:
    """The warning of a GPU the reclaimer warned about: when it goes (``goes_at``; None:
    it waits for another GPU of the server), what goes with it (:func:`ending`), and how
    to keep it."""
    if goes_at is None:
        when = (
            "once your server's other GPUs have been idle as long"
            if holders is None
            else "once the other GPUs its kernels may be using have been idle as long"
        )
    else:
        when = "any moment now" if goes_at <= now else f"at {_clock(goes_at, zone)}"
    idle = round(figures["idle_s"] / 60)
    allowed = keeps is None or keeps > 0
    how = "use it"
    if allowed:
        left = "" if keeps is None else f", {keeps} press{'es' if keeps != 1 else ''} left"
        how += f" or press Keep (holds it {_minutes(policy.keep_for)}{left})"
    said = " ".join(
        part
        for part in (
            f"Your {model} has done no work for {idle} min. It goes back to the pool {when},"
            f" unless you {how}.",
            ending(holders),
            "Your server and files stay; add a GPU again whenever you need one.",
        )
        if part
    )
    return {
        "reclaim_at": None if goes_at is None else _at(goes_at, zone),
        "message": said,
        "keep_allowed": allowed,
        "keeps_left": keeps,
    }


def ending(holders: tuple[str, ...] | None) -> str:
    """What a reclaim ends besides the GPU, as the reclaimer does it
    (``Reclaimer._shut_down_kernels``): the kernels holding it where the activity source
    names them, every kernel of the server where it cannot; "" when nothing holds it."""
    kernels = kernels_holding(holders)
    if kernels is None:
        return "Your server's kernels are shut down then."
    programs = len(holders or ()) - len(kernels)  # holders that are no kernel's
    if not kernels:
        return "The program holding it (no notebook kernel) loses it then." if programs else ""
    which = "The kernel holding it is" if len(kernels) == 1 else "The kernels holding it are"
    also = " The programs outside your kernels holding it lose it." if programs else ""
    return f"{which} shut down then; your other kernels stay.{also}"


def keep_answer(
    gpu: str, model: str, kept: GpuWatch, policy: ReclaimPolicy, zone: tzinfo
) -> dict[str, Any]:
    """The answer to a *Keep* press that was taken."""
    assert kept.kept_until is not None
    left = keeps_left(kept, policy)
    more = "" if left is None else f" Keep presses left on this GPU: {left}."
    return {
        "gpu": gpu,
        "kept_until": _at(kept.kept_until, zone),
        "keeps_left": left,
        "message": (
            f"Kept your {model} until {_clock(kept.kept_until, zone)}: it is not taken"
            f" before then, used or not.{more}"
        ),
    }


def notice(entry: AuditEntry) -> str:
    """What a user reads on *my machine* of something done to their server."""
    if entry.action not in GIVEN_BACK:
        return notice_text(entry)
    server = entry.detail.get("server") or ""
    which = f"server '{server}'" if server else "default server"
    why = entry.detail.get("why") or ""
    return (
        f"GPU {entry.detail.get('block')} of your {which} went back to the pool at"
        f" {entry.at.isoformat(timespec='seconds')} ({why}). Your server ran on; add a GPU"
        " again here or with client.grow()."
    )


POLICY_FORM = ("detach_after", "warn_after", "reclaim_after", "keep_for")
FORM_FIELDS = (*POLICY_FORM, "keeps_allowed")  # what the form sets; the API sets the rest


def policy_from_form(form: Mapping[str, str], stored: Mapping[str, object]) -> dict[str, object]:
    """A cohort's overrides from the cohorts page's form, over those ``stored``: each window
    in minutes, or seconds with an ``s`` (blank: the site's; ``off``: the step off),
    ``keeps_allowed`` a count (``any``: no limit); fields the form does not carry (set
    through the API) are kept. Raises ValueError saying which field to fix; the values
    themselves are checked by ``policy_problems``, as the API's are."""
    overrides = {k: v for k, v in stored.items() if k not in FORM_FIELDS}
    for name in POLICY_FORM:
        text = form.get(f"{name}_min", "").strip().lower()
        if text == "off":
            overrides[name] = None
        elif text:
            seconds = text.endswith("s")
            try:
                overrides[name] = float(text.removesuffix("s")) * (1 if seconds else 60)
            except ValueError:
                raise ValueError(
                    f"{name}: minutes as a number (or seconds, as 90s), 'off', or blank for"
                    f" the site's; not {text!r}"
                ) from None
    keeps = form.get("keeps_allowed", "").strip().lower()
    if keeps == "any":
        overrides["keeps_allowed"] = None
    elif keeps:
        if not keeps.isdigit():
            raise ValueError(f"keeps_allowed: a whole number, 'any', or blank; not {keeps!r}")
        overrides["keeps_allowed"] = int(keeps)
    return overrides


def form_value(value: object) -> str:
    """A stored window as the form shows it, so that sending it back changes nothing:
    whole minutes as minutes, anything else as seconds ("90s"), ``off`` for None."""
    if value is None:
        return "off"
    if not isinstance(value, int | float):
        return ""
    return f"{value / 60:g}" if value % 60 == 0 else f"{value:g}s"


def policy_text(policy: Mapping[str, object]) -> str:
    """A policy as admins read it: "detach 10 min unheld · warn 30 min idle · take 60 min"."""

    def window(name: str) -> str:
        value = policy.get(name)
        return "off" if not isinstance(value, int | float) else _minutes(value)

    keeps = policy.get("keeps_allowed")
    return (
        f"detach after {window('detach_after')} unheld · warn after {window('warn_after')}"
        f" idle · take after {window('reclaim_after')} · Keep {window('keep_for')},"
        f" {'any number of' if keeps is None else keeps} times"
    )


def _at(seconds: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(seconds, UTC).astimezone(zone).isoformat(timespec="seconds")


def _clock(seconds: float, zone: tzinfo) -> str:
    return datetime.fromtimestamp(seconds, UTC).astimezone(zone).strftime("%H:%M")


def _minutes(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{seconds / 3600:g} h"
