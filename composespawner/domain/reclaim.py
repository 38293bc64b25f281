"""Idle GPUs given back while the server runs on: the policy and its decisions. Pure.

The reclaimer reads every attached GPU's activity now and then, folds each reading into
that GPU's :class:`GpuWatch` with :func:`observe`, and asks :func:`decide` what to do:

1. nothing has held the GPU (no process, no context's memory) for ``detach_after``:
   detach it, quietly;
2. it has done no work for ``warn_after``: warn its user, once;
3. it has done no work for ``reclaim_after``, and the warning went out at least
   ``reclaim_after - warn_after`` ago: shut down the kernels holding it, then detach it.

A GPU that did work inside a window is never touched, and a *Keep* press holds off every
step for ``keep_for``. Unknown is not idle: time is only counted over an unbroken run of
readings we actually saw. A reading that failed, a GPU the source did not list, a reading
that makes no sense or a gap longer than ``max_gap`` starts the run again, so no window
ever spans a moment nobody saw. Times are seconds like ``time.time()``'s, passed in:
nothing here reads a clock.

A policy is set for the site and per cohort (courses shorter than research): a cohort's
values win where it sets them, the site's fill in the rest (:func:`merged`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal

from composespawner.domain.activity import GpuActivity, did_work, holds_context, kernel_in
from composespawner.domain.quotas import InvalidQuota

MOST_SECONDS = 7 * 24 * 3600.0  # longer than a week is a typing slip, not a policy
MOST_KEEPS = 1000
# A CUDA context alone takes a few hundred MiB: a higher floor would call held GPUs free.
MOST_MEMORY_FLOOR_MIB = 1024.0
WINDOWS = ("detach_after", "warn_after", "reclaim_after")

Action = Literal["none", "detach", "warn", "reclaim"]


class InvalidPolicy(InvalidQuota):
    """A reclaim policy that cannot be used; ``problems`` says, per field, what to send.

    An :class:`InvalidQuota`, so the portal answers it as it answers any bad rule: 400.
    """

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(self.problems.values()))


class KeepRefused(Exception):
    """A *Keep* press the policy does not allow; the message is for the user."""


@dataclass(frozen=True, slots=True)
class ReclaimPolicy:
    """When an idle GPU goes back to the pool. A window of ``None`` turns its step off."""

    detach_after: float | None = 600.0  # seconds nothing held it
    warn_after: float | None = 1800.0  # seconds it did no work before its user is warned
    reclaim_after: float | None = 3600.0  # seconds it did no work before it is taken
    keep_for: float = 3600.0  # seconds one Keep press holds off every step
    keeps_allowed: int | None = None  # presses per GPU per server start; None: any, 0: no Keep
    busy_percent: float = 1.0  # utilisation above which a reading counts as work
    # Framebuffer at or below it, processes unknown (DCGM): nobody holds the GPU. On an
    # H100 a CUDA context costs 529 MiB and nvidia-smi shows 0 MiB with none
    # (benchmarks/results/gpu_activity_check_h100.json); NVML's figure with none is
    # 480 MiB, reserved memory, but NVML counts processes and never needs the floor.
    memory_floor_mib: float = 256.0
    max_gap: float = 180.0  # seconds between readings beyond which the run starts again

    def __post_init__(self) -> None:
        values = self.as_dict()
        problems = _problems(values, sent=values)
        if problems:
            raise InvalidPolicy(problems)

    def as_dict(self) -> dict[str, float | int | None]:
        """For JSON, and the fields :func:`policy_problems` reads back."""
        return asdict(self)


FIELDS = tuple(f.name for f in fields(ReclaimPolicy))


def policy_problems(sent: Mapping[str, object], over: ReclaimPolicy) -> dict[str, str]:
    """What is wrong with the fields ``sent`` laid over ``over``, by field; {} when nothing.

    A field ``sent`` leaves out keeps ``over``'s value; one sent as ``None`` turns that off
    (a step, or the limit on Keep presses).
    """
    unknown = [name for name in sent if name not in FIELDS]
    if unknown:
        return {
            name: f"unknown field {name!r}; a policy has {', '.join(FIELDS)}" for name in unknown
        }
    return _problems({**over.as_dict(), **sent}, sent)


def parse_policy(sent: Mapping[str, object], over: ReclaimPolicy) -> ReclaimPolicy:
    """The policy ``sent`` lays over ``over``; :class:`InvalidPolicy` says what to change."""
    problems = policy_problems(sent, over)
    if problems:
        raise InvalidPolicy(problems)
    return replace(over, **sent)  # type: ignore[arg-type]  # checked just above


def merged(site: ReclaimPolicy, cohort: Mapping[str, object]) -> ReclaimPolicy:
    """A cohort's policy: the values it sets, the site's for the rest.

    Raises :class:`InvalidPolicy` when the two do not fit together (a cohort's
    ``warn_after`` past the site's new ``reclaim_after``): the caller falls back to the
    site's policy and says so.
    """
    return parse_policy(cohort, over=site)


def cohort_policy(
    site: ReclaimPolicy, overrides: Mapping[str, object] | None, interval: float = 0.0
) -> tuple[ReclaimPolicy, str | None]:
    """The policy of a cohort with these stored overrides, and why it fell back to the
    site's policy if it did: overrides that no longer fit the site's values, or a
    ``max_gap`` no longer than the reclaimer's ``interval`` (no window would ever fill)."""
    if not overrides:
        return site, None
    try:
        policy = merged(site, overrides)
    except InvalidPolicy as e:
        return site, str(e)
    if policy.max_gap <= interval:
        return site, (
            f"max_gap ({policy.max_gap:g} s) must be more than the reclaimer's interval"
            f" ({interval:g} s): readings further apart never add up to a window"
        )
    return policy, None


def _problems(values: Mapping[str, object], sent: Mapping[str, object]) -> dict[str, str]:
    """Field by field first; how fields fit together only once each one makes sense."""
    problems = {name: why for name in FIELDS if (why := _field_problem(name, values[name]))}
    return problems or _fit_problems(values, sent)


def _field_problem(name: str, value: object) -> str | None:
    if name in WINDOWS:
        off = ", or null to turn this step off"
        return None if value is None else _number(name, value, "seconds", MOST_SECONDS, tail=off)
    if name in ("keep_for", "max_gap"):
        return _number(name, value, "seconds", MOST_SECONDS)
    if name == "memory_floor_mib":
        return _number(name, value, "MiB", MOST_MEMORY_FLOOR_MIB, zero_allowed=True)
    if name == "busy_percent":
        # 0 counts any utilisation as work; 100 would count none, so every GPU looks idle.
        if _number(name, value, "percent", 100, zero_allowed=True) or value == 100:
            return (
                f"busy_percent must be a number from 0 to less than 100, such as 1; not {value!r}"
            )
        return None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_KEEPS:
        return (
            f"keeps_allowed must be a whole number from 0 (no Keep) to {MOST_KEEPS},"
            f" or null for no limit; not {value!r}"
        )
    return None


def _number(
    name: str, value: object, unit: str, most: float, *, zero_allowed: bool = False, tail: str = ""
) -> str | None:
    """Why ``value`` is not a number of ``unit`` above 0 (or from 0) to ``most``; None if it is."""
    least = "from 0" if zero_allowed else "more than 0"
    most_text = f"{most:g} (a week)" if most == MOST_SECONDS else f"{most:g}"
    refusal = f"{name} must be a number of {unit}, {least} and at most {most_text}{tail}"
    refusal += f"; not {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return refusal
    if isinstance(value, int) and abs(value) > most:
        return refusal  # JSON's 400-digit integers: too big for a float to check
    above_least = value >= 0 if zero_allowed else value > 0
    return None if math.isfinite(value) and above_least and value <= most else refusal


def _fit_problems(values: Mapping[str, object], sent: Mapping[str, object]) -> dict[str, str]:
    """Problems between fields, each under a field the sender named where one is to blame."""
    warn, reclaim = _seconds(values, "warn_after"), _seconds(values, "reclaim_after")
    if (warn is None) != (reclaim is None):
        return {
            _blame(sent, "warn_after", "reclaim_after"): (
                "warn_after and reclaim_after go together: a GPU is only taken from someone"
                " who was warned first; send both (warn_after less than reclaim_after), or"
                " null for both"
            )
        }
    if warn is not None and reclaim is not None and warn >= reclaim:
        return {
            _blame(sent, "warn_after", "reclaim_after"): (
                f"warn_after ({warn:g} s) must be less than reclaim_after ({reclaim:g} s):"
                " the warning comes first, and the user needs time to act on it"
            )
        }
    gap = _seconds(values, "max_gap")
    for window in WINDOWS:
        length = _seconds(values, window)
        if gap is not None and length is not None and gap >= length:
            return {
                _blame(sent, "max_gap", window): (
                    f"max_gap ({gap:g} s) must be less than {window} ({length:g} s): a window"
                    " is only counted over readings at most max_gap apart"
                )
            }
    return {}


def _seconds(values: Mapping[str, object], name: str) -> float | None:
    value = values[name]
    return value if isinstance(value, int | float) else None


def _blame(sent: Mapping[str, object], *names: str) -> str:
    return next((name for name in names if name in sent), names[0])


# Ten minutes with nothing holding it, half an hour without work, an hour: research-sized.
SITE_DEFAULT = ReclaimPolicy()  # after _problems, which it calls


@dataclass(frozen=True, slots=True)
class GpuWatch:
    """What the reclaimer remembers of one GPU on one machine, since that server started."""

    since: float | None  # first reading of the unbroken run; None: the latest reading failed
    last_at: float  # the latest reading, readable or not
    last_work_at: float | None = None  # the latest reading that did work
    last_held_at: float | None = None  # the latest reading where something held it
    # The first reading of the stretch without work (nothing holding it) under way; None
    # while the latest reading did work (held it). Work may have gone on until any moment
    # between the last reading that saw it and this one, so a window counts from here:
    # never from the last busy reading, which could take a GPU up to a pass too early.
    idle_from: float | None = None
    unheld_from: float | None = None
    utilization: float = 0.0  # as of the latest readable reading
    memory_used_mib: float = 0.0
    warned_at: float | None = None  # when the latest warning went out
    kept_until: float | None = None
    keeps_used: int = 0
    # Who held it at the latest readable reading (``Holder.key``s: "kernel:<id>",
    # "pid:<n>"); None: the source cannot name them, or the latest reading failed.
    holders: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one GPU now, why (for the audit log), and the figures behind it:
    ``seen_s`` (the unbroken run so far), ``unheld_s``, ``idle_s`` (without work), the
    latest ``utilization`` and ``memory_used_mib``, and once warned ``warned_at`` and
    ``reclaim_at``."""

    action: Action
    why: str
    figures: Mapping[str, float] = field(default_factory=dict)

    @property
    def reclaim_at(self) -> float | None:
        """When a warned GPU will be taken at the earliest, if it stays idle."""
        return self.figures.get("reclaim_at")


def observe(
    watch: GpuWatch | None, gpu: GpuActivity | None, at: float, policy: ReclaimPolicy
) -> GpuWatch:
    """``watch`` with the reading ``gpu`` taken at ``at`` folded in.

    ``gpu`` is None when the GPU could not be read at ``at`` (the source failed, or did not
    list it): the run ends there, and the next readable reading starts a new one.
    """
    if watch is None:
        watch = GpuWatch(since=None, last_at=at)
    if gpu is None or not _makes_sense(gpu):
        return replace(watch, since=None, last_at=at, holders=None)
    # A clock stepped back (at < last_at) is a break too: the order of readings is unknown.
    unbroken = watch.since is not None and 0 <= at - watch.last_at <= policy.max_gap
    work = did_work(gpu, policy.busy_percent)
    # A kernel that ran had a context, whatever the memory figure says.
    held = work or holds_context(gpu, policy.memory_floor_mib)

    def stretch_from(start: float | None, busy: bool) -> float | None:
        if busy:
            return None
        return start if unbroken and start is not None else at

    return replace(
        watch,
        since=watch.since if unbroken else at,
        last_at=at,
        last_work_at=at if work else watch.last_work_at,
        last_held_at=at if held else watch.last_held_at,
        idle_from=stretch_from(watch.idle_from, work),
        unheld_from=stretch_from(watch.unheld_from, held),
        utilization=gpu.utilization,
        memory_used_mib=gpu.memory_used_mib,
        holders=None if gpu.holders is None else tuple(sorted({h.key for h in gpu.holders})),
    )


def _makes_sense(gpu: GpuActivity) -> bool:
    """A reading that could not come from a GPU (NaN utilisation...) is unknown, never idle."""
    return (
        math.isfinite(gpu.utilization)
        and 0 <= gpu.utilization <= 100
        and math.isfinite(gpu.memory_used_mib)
        and gpu.memory_used_mib >= 0
        and (gpu.processes is None or gpu.processes >= 0)
    )


def decide(watch: GpuWatch, policy: ReclaimPolicy, now: float) -> Decision:
    """What to do with the GPU ``watch`` follows, at ``now`` (see the module's docstring)."""
    figures = _figures(watch)
    held_off = _held_off(watch, policy, now)
    if held_off:
        return Decision("none", held_off, figures)
    unheld, idle = figures["unheld_s"], figures["idle_s"]
    if policy.detach_after is not None and unheld >= policy.detach_after:
        why = f"nothing held it for {unheld:.0f} s (detach_after {policy.detach_after:g} s)"
        return Decision("detach", why, figures)
    if policy.warn_after is None or policy.reclaim_after is None or idle < policy.warn_after:
        why = f"unheld {unheld:.0f} s, no work for {idle:.0f} s: inside every window"
        return Decision("none", why, figures)
    notice = policy.reclaim_after - policy.warn_after
    warned_at = _warning_this_stretch(watch)
    if warned_at is None:
        why = f"no work for {idle:.0f} s (warn_after {policy.warn_after:g} s)"
        return Decision("warn", why, {**figures, "reclaim_at": now + notice})
    figures = {**figures, "warned_at": warned_at, "reclaim_at": warned_at + notice}
    if idle >= policy.reclaim_after and now >= warned_at + notice:
        why = (
            f"no work for {idle:.0f} s (reclaim_after {policy.reclaim_after:g} s),"
            f" warned {now - warned_at:.0f} s ago"
        )
        return Decision("reclaim", why, figures)
    return Decision(
        "none", f"warned {now - warned_at:.0f} s ago, no work for {idle:.0f} s", figures
    )


def _held_off(watch: GpuWatch, policy: ReclaimPolicy, now: float) -> str | None:
    """Why nothing may be done now whatever the figures say, if so."""
    if watch.since is None:
        return f"unreadable at {watch.last_at:.0f}: unknown is not idle"
    if now - watch.last_at > policy.max_gap:
        return f"no reading since {watch.last_at:.0f}: unknown is not idle"
    if watch.kept_until is not None and now < watch.kept_until:
        return f"kept until {watch.kept_until:.0f}"
    return None


def _figures(watch: GpuWatch) -> dict[str, float]:
    """How long it went unheld and without work, counted over the unbroken run only, from
    the first reading of each stretch (see ``GpuWatch.idle_from``)."""
    since, last = watch.since, watch.last_at
    if since is None:
        return {"seen_s": 0.0, "unheld_s": 0.0, "idle_s": 0.0}

    def stretch(start: float | None) -> float:
        # A stretch begun before the run (a row from before the fields) counts from its
        # start; a clock stepped back can leave one after the latest reading: count 0.
        return 0.0 if start is None else max(last - max(since, start), 0.0)

    return {
        "seen_s": last - since,
        "unheld_s": stretch(watch.unheld_from),
        "idle_s": stretch(watch.idle_from),
        "utilization": watch.utilization,
        "memory_used_mib": watch.memory_used_mib,
    }


def _warning_this_stretch(watch: GpuWatch) -> float | None:
    """When the user was warned about the idle stretch under way, if they were. Work, or a
    break in the readings, since the warning starts a new stretch, and a new warning."""
    if watch.warned_at is None or watch.since is None or watch.idle_from is None:
        return None
    start = max(watch.since, watch.idle_from)
    return watch.warned_at if watch.warned_at >= start else None


def record_warning(watch: GpuWatch, at: float) -> GpuWatch:
    """``watch`` once the warning :func:`decide` asked for went out at ``at``."""
    return replace(watch, warned_at=at)


def keep(watch: GpuWatch, policy: ReclaimPolicy, now: float) -> GpuWatch:
    """``watch`` after its user pressed *Keep* at ``now``; :class:`KeepRefused` if not allowed.

    A press holds off every step until ``now + keep_for`` and withdraws the warning, so
    the GPU is only taken after a fresh one once the Keep runs out.
    """
    allowed = policy.keeps_allowed
    if allowed == 0:
        raise KeepRefused(
            "Keep is turned off here: use the GPU to keep it, or give it back and add one later."
        )
    if allowed is not None and watch.keeps_used >= allowed:
        raise KeepRefused(
            f"You pressed Keep {watch.keeps_used} times on this GPU since your server started,"
            f" all the policy allows ({allowed}): use the GPU to keep it."
        )
    until = now + policy.keep_for
    return replace(
        watch,
        kept_until=until if watch.kept_until is None else max(watch.kept_until, until),
        keeps_used=watch.keeps_used + 1,
        warned_at=None,
    )


# ---------------------------------------------------------------------------
# Which kernels a reclaim ends, and when it must wait
# ---------------------------------------------------------------------------


def kernels_holding(holders: tuple[str, ...] | None) -> frozenset[str] | None:
    """The ids of the kernels among a GPU's ``holders`` (a reclaim shuts down those);
    None when the holders are unknown: then it shuts down every kernel of the server,
    as any of them may hold the GPU."""
    if holders is None:
        return None
    return frozenset(kernel for h in holders if (kernel := kernel_in(h)) is not None)


def entangled(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> bool:
    """Whether ending the kernels holding one GPU may end work on another (their holders
    ``a`` and ``b``): they share a holder, or either's holders are unknown (a reclaim
    then ends every kernel of the server, and any may use the other GPU)."""
    return a is None or b is None or not set(a).isdisjoint(b)


def reclaims_that_wait(
    reclaiming: Mapping[str, tuple[str, ...] | None],
    staying: Mapping[str, tuple[str, ...] | None],
) -> set[str]:
    """Which of one server's GPUs being reclaimed (by id, with their holders) must wait,
    because the kernels a reclaim would end may be using a GPU that stays (``staying``:
    the server's other GPUs, with their holders): :func:`entangled` with one.

    So a reclaim whose holders are known waits only while one of them also holds a GPU
    that stays, or a staying GPU's holders are unknown; one whose holders are unknown
    waits while any GPU stays. A waiting GPU keeps its warning: the user can still give
    it back. (A GPU reclaimed beside it that waits itself is idle, past reclaim_after:
    the kernels they share do no work on it.)
    """
    return {
        gpu
        for gpu, holders in reclaiming.items()
        if any(entangled(holders, other) for other in staying.values())
    }


def reclaim_times(
    warned: Mapping[str, tuple[tuple[str, ...] | None, float]],
    others: Mapping[str, tuple[str, ...] | None],
) -> dict[str, float | None]:
    """When each warned GPU of one server goes if every GPU stays as idle as it is
    (``warned``: holders and the moment its own reclaim is due; ``others``: the server's
    GPUs not warned about, with their holders), as :func:`reclaims_that_wait` will let
    it: with every warned GPU it is entangled with, once the last of them is due; None
    while it is entangled with one not warned about (it waits for that one)."""
    times: dict[str, float | None] = {}
    for gpu, (holders, due) in warned.items():
        if any(entangled(holders, other) for other in others.values()):
            times[gpu] = None
            continue
        with_it = [at for g, (h, at) in warned.items() if g != gpu and entangled(holders, h)]
        times[gpu] = max([due, *with_it])
    return times
