"""The idle-GPU reclaim policy, pure: what may be set, and what the reclaimer decides.

Examples for every rule first, then properties over random reading histories: a busy
GPU is never taken, unknown is never idle, and a GPU is only taken after a warning the
user had time to act on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composespawner.domain.activity import GpuActivity
from composespawner.domain.quotas import InvalidQuota
from composespawner.domain.reclaim import (
    FIELDS,
    SITE_DEFAULT,
    Decision,
    GpuWatch,
    InvalidPolicy,
    KeepRefused,
    ReclaimPolicy,
    decide,
    keep,
    merged,
    observe,
    parse_policy,
    policy_problems,
    record_warning,
)

pytestmark = pytest.mark.timeout(60)

POLICY = ReclaimPolicy(
    detach_after=600, warn_after=1800, reclaim_after=3600, keep_for=3600, keeps_allowed=2
)
STEP = 60.0  # seconds between readings in the examples

# What a source reports: NVML counts processes, the DCGM exporter cannot (None).
FREE = GpuActivity("gpu0", utilization=0.0, memory_used_mib=3.0, processes=0)
HELD = GpuActivity("gpu0", utilization=0.0, memory_used_mib=520.0, processes=1)
BUSY = GpuActivity("gpu0", utilization=87.0, memory_used_mib=9000.0, processes=1)
FREE_DCGM = replace(FREE, processes=None)
HELD_DCGM = replace(HELD, processes=None)
NONSENSE = replace(FREE, utilization=math.nan)

Kind = Literal["free", "held", "busy", "unreadable", "nonsense", "tick", "keep"]
READING: dict[str, GpuActivity | None] = {
    "free": FREE,
    "held": HELD,
    "busy": BUSY,
    "unreadable": None,
    "nonsense": NONSENSE,
}


def watch_over(*stretches: tuple[GpuActivity | None, float]) -> tuple[GpuWatch, float]:
    """The watch after readings every STEP s from 0, each stretch one reading for so long,
    and the time of the last reading."""
    watch: GpuWatch | None = None
    at = 0.0
    for gpu, seconds in stretches:
        for _ in range(round(seconds / STEP)):
            watch = observe(watch, gpu, at, POLICY)
            at += STEP
    return observe(watch, stretches[-1][0], at, POLICY), at  # the last stretch's end


# -- the policy: what may be set ----------------------------------------------------------


def test_the_site_default_is_acceptable_and_reads_back() -> None:
    assert policy_problems(SITE_DEFAULT.as_dict(), SITE_DEFAULT) == {}
    assert parse_policy(POLICY.as_dict(), SITE_DEFAULT) == POLICY
    assert parse_policy({}, POLICY) == POLICY
    site = SITE_DEFAULT
    assert (site.detach_after, site.warn_after, site.reclaim_after) == (600, 1800, 3600)


@pytest.mark.parametrize(
    ("sent", "field", "says"),
    [
        ({"detach_after": -600}, "detach_after", "more than 0"),
        ({"detach_after": 0}, "detach_after", "or null to turn this step off"),
        ({"warn_after": math.nan}, "warn_after", "not nan"),
        ({"reclaim_after": math.inf}, "reclaim_after", "at most 604800 (a week)"),
        ({"reclaim_after": 8 * 24 * 3600}, "reclaim_after", "at most 604800"),
        ({"detach_after": "600"}, "detach_after", "a number of seconds"),
        ({"detach_after": True}, "detach_after", "not True"),
        ({"keep_for": None}, "keep_for", "a number of seconds"),
        ({"keep_for": 0}, "keep_for", "more than 0"),
        ({"max_gap": -1}, "max_gap", "more than 0"),
        ({"keeps_allowed": -1}, "keeps_allowed", "from 0 (no Keep)"),
        ({"keeps_allowed": 2.5}, "keeps_allowed", "a whole number"),
        ({"keeps_allowed": False}, "keeps_allowed", "a whole number"),
        ({"keeps_allowed": 10**6}, "keeps_allowed", "to 1000"),
        ({"warn_after": 10**400}, "warn_after", "at most 604800 (a week)"),
        ({"busy_percent": -(10**400)}, "busy_percent", "less than 100"),
        ({"busy_percent": 100}, "busy_percent", "less than 100"),
        ({"busy_percent": -0.5}, "busy_percent", "from 0"),
        ({"memory_floor_mib": 4096}, "memory_floor_mib", "at most 1024"),
        ({"memory_floor_mib": [64]}, "memory_floor_mib", "a number of MiB"),
        ({"warn_after": 3600}, "warn_after", "less than reclaim_after (3600 s)"),
        ({"reclaim_after": 1000}, "reclaim_after", "less than reclaim_after (1000 s)"),
        ({"warn_after": None}, "warn_after", "go together"),
        ({"reclaim_after": None}, "reclaim_after", "go together"),
        ({"max_gap": 600}, "max_gap", "less than detach_after (600 s)"),
        ({"detach_after": 120}, "detach_after", "max_gap (180 s) must be less than"),
        ({"detach_after": 60, "cull": 1}, "cull", "unknown field 'cull'; a policy has"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field_and_what_to_send(
    sent: dict[str, object], field: str, says: str
) -> None:
    problems = policy_problems(sent, POLICY)
    assert list(problems) == [field]
    assert says in problems[field]
    with pytest.raises(InvalidPolicy, match=field) as refused:
        parse_policy(sent, POLICY)
    assert refused.value.problems == problems
    assert isinstance(refused.value, InvalidQuota)  # the portal answers it with a 400


def test_every_problem_is_named_at_once() -> None:
    problems = policy_problems({"detach_after": -1, "keep_for": "1h", "busy_percent": 200}, POLICY)
    assert set(problems) == {"detach_after", "keep_for", "busy_percent"}


def test_a_policy_cannot_be_built_bad_in_code_either() -> None:
    with pytest.raises(InvalidPolicy, match="warn_after"):
        ReclaimPolicy(warn_after=7200, reclaim_after=3600)


def test_steps_can_be_turned_off() -> None:
    policy = parse_policy({"detach_after": None, "warn_after": None, "reclaim_after": None}, POLICY)
    assert (policy.detach_after, policy.warn_after, policy.reclaim_after) == (None, None, None)


def test_a_cohorts_values_win_where_it_sets_them() -> None:
    course = merged(SITE_DEFAULT, {"detach_after": 300, "warn_after": 600, "reclaim_after": 1200})
    assert (course.detach_after, course.warn_after, course.reclaim_after) == (300, 600, 1200)
    assert (course.max_gap, course.keep_for) == (SITE_DEFAULT.max_gap, SITE_DEFAULT.keep_for)
    no_quiet_detach = merged(SITE_DEFAULT, {"detach_after": None})
    assert no_quiet_detach == replace(SITE_DEFAULT, detach_after=None)
    assert merged(SITE_DEFAULT, {}) == SITE_DEFAULT


def test_a_cohort_value_that_no_longer_fits_the_site_is_refused() -> None:
    # The cohort once set warn_after 2400 under a site reclaim_after of 3600; the site
    # then shortened it to 1800.
    site = replace(SITE_DEFAULT, warn_after=900, reclaim_after=1800)
    with pytest.raises(InvalidPolicy) as refused:
        merged(site, {"warn_after": 2400})
    assert set(refused.value.problems) == {"warn_after"}


# -- observe and decide: examples for every rule ------------------------------------------


@pytest.mark.parametrize(
    ("stretches", "action", "why"),
    [
        pytest.param([(FREE, 600)], "detach", "nothing held it for 600 s", id="free for 10 min"),
        pytest.param([(FREE, 540)], "none", "unheld 540 s", id="free for 9 min"),
        pytest.param([(FREE_DCGM, 600)], "detach", "nothing held", id="dcgm: few MiB, no count"),
        pytest.param([(HELD_DCGM, 1700)], "none", "unheld 0 s", id="dcgm: a context's MiB"),
        # Counted from the first reading that saw it free: it may have been held until
        # just before, so a window never includes the pass in which it was let go.
        pytest.param([(BUSY, 3000), (FREE, 600)], "detach", "for 600 s", id="worked, let go"),
        pytest.param([(BUSY, 3000), (FREE, 540)], "none", "unheld 540 s", id="let go 9 min"),
        pytest.param([(HELD, 1800)], "warn", "no work for 1800 s", id="held idle 30 min"),
        pytest.param([(HELD, 1740)], "none", "no work for 1740 s", id="held idle 29 min"),
        pytest.param([(BUSY, 3000), (HELD, 1740)], "none", "no work for 1740 s", id="29 min"),
        pytest.param([(BUSY, 3000), (HELD, 1800)], "warn", "no work for 1800 s", id="30 min"),
        pytest.param(
            [(FREE, 400), (None, 60), (FREE, 540)], "none", "unheld 540 s", id="unreadable"
        ),
        pytest.param(
            [(FREE, 400), (NONSENSE, 60), (FREE, 540)], "none", "unheld 540", id="nan reading"
        ),
        pytest.param([(FREE, 600), (None, 0)], "none", "unreadable at 600", id="unreadable now"),
    ],
)
def test_what_the_reclaimer_decides(
    stretches: list[tuple[GpuActivity | None, float]], action: str, why: str
) -> None:
    watch, now = watch_over(*stretches)
    decision = decide(watch, POLICY, now)
    assert decision.action == action
    assert why in decision.why


def test_the_figures_are_what_the_audit_log_keeps() -> None:
    watch, now = watch_over((BUSY, 600), (HELD, 1800))
    decision = decide(watch, POLICY, now)
    assert decision.action == "warn"
    assert decision.figures == {
        "seen_s": 2400.0,
        "unheld_s": 0.0,
        "idle_s": 1800.0,
        "utilization": 0.0,
        "memory_used_mib": 520.0,
        "reclaim_at": now + 1800,
    }
    assert decision.reclaim_at == now + 1800


def test_a_gap_longer_than_max_gap_starts_the_count_again() -> None:
    watch, now = watch_over((FREE, 400))
    now += 181  # one reading missed too many
    for at in range(int(now), int(now) + 541, 60):
        watch = observe(watch, FREE, at, POLICY)
    decision = decide(watch, POLICY, now + 540)
    assert decision.action == "none"
    assert decision.figures["seen_s"] == 540


def test_no_reading_for_longer_than_max_gap_means_no_action() -> None:
    watch, now = watch_over((FREE, 900))
    assert decide(watch, POLICY, now + 180).action == "detach"
    stale = decide(watch, POLICY, now + 181)
    assert stale.action == "none"
    assert "unknown is not idle" in stale.why


def test_a_clock_stepped_back_starts_the_count_again() -> None:
    watch, now = watch_over((FREE, 900))
    watch = observe(watch, FREE, now - 3600, POLICY)
    assert watch.since == now - 3600
    assert decide(watch, POLICY, now - 3600).action == "none"


# -- the reclaimer's loop, as a sequence of decisions --------------------------------------


def actions(policy: ReclaimPolicy, script: Iterable[tuple[Kind, float]]) -> list[tuple[float, str]]:
    """(when, what) for every action but "none" that a reclaimer following :func:`decide`
    takes over ``script``: (kind, seconds) stretches of events every STEP s from 0."""
    events, at = [], 0.0
    for kind, seconds in script:
        for _ in range(round(seconds / STEP)):
            events.append((at, kind))
            at += STEP
    return [(e.at, e.action) for e in run(policy, events) if e.action != "none"]


@dataclass(frozen=True)
class Event:
    at: float
    kind: Kind
    action: str
    decision: Decision | None = None
    refused: bool = False


def run(policy: ReclaimPolicy, events: list[tuple[float, Kind]]) -> list[Event]:
    """Fold the events in as the reclaimer would: read, decide, warn; stop once the GPU goes.

    ``tick``: decide without a new reading; ``keep``: the user presses Keep (and a reading
    of an idle, held GPU comes in).
    """
    watch: GpuWatch | None = None
    out: list[Event] = []
    for at, kind in events:
        refused = False
        if kind == "keep" and watch is not None:
            try:
                watch = keep(watch, policy, at)
            except KeepRefused:
                refused = True
        if kind != "tick":
            watch = observe(watch, READING.get(kind, HELD), at, policy)
        if watch is None:
            continue  # a tick before any reading: nothing to decide on
        decision = decide(watch, policy, at)
        out.append(Event(at, kind, decision.action, decision, refused))
        if decision.action == "warn":
            watch = record_warning(watch, at)
        if decision.action in ("detach", "reclaim"):
            break
    return out


def test_with_quiet_detach_off_an_unheld_idle_gpu_is_warned_then_reclaimed() -> None:
    policy = replace(POLICY, detach_after=None)
    assert [t for t, _ in actions(policy, [("free", 100 * STEP)])] == [1800, 3600]


def test_with_warn_and_reclaim_off_a_held_gpu_stays() -> None:
    policy = replace(POLICY, warn_after=None, reclaim_after=None)
    assert actions(policy, [("held", 300 * STEP)]) == []


def test_a_held_idle_gpu_is_warned_once_then_reclaimed() -> None:
    assert actions(POLICY, [("held", 100 * STEP)]) == [(1800, "warn"), (3600, "reclaim")]


def test_work_after_the_warning_saves_the_gpu_until_it_idles_again() -> None:
    script: list[tuple[Kind, float]] = [("held", 2400), ("busy", 60), ("held", 6000)]
    # The stretch restarts at the first reading after the work (2460): it may have run
    # until just before it.
    assert actions(POLICY, script) == [(1800, "warn"), (4260, "warn"), (6060, "reclaim")]


def test_a_warning_seen_too_late_still_gives_the_user_its_notice() -> None:
    # The reclaimer was not running for the first hour: idle for long enough, but the
    # user is told first and keeps reclaim_after - warn_after to act.
    watch, now = watch_over((HELD, 3600))
    decided = []
    for _ in range(100):
        decision = decide(watch, POLICY, now)
        if decision.action == "warn":
            watch = record_warning(watch, now)
            assert decision.reclaim_at == now + 1800
        decided.append((now, decision.action))
        if decision.action == "reclaim":
            break
        now += STEP
        watch = observe(watch, HELD, now, POLICY)
    assert [d for d in decided if d[1] != "none"] == [(3600, "warn"), (5400, "reclaim")]


def test_a_break_in_the_readings_after_the_warning_means_a_fresh_warning() -> None:
    script: list[tuple[Kind, float]] = [("held", 2400), ("unreadable", 60), ("held", 6000)]
    # The run starts again at 2460: warned at 2460 + 1800, taken at 2460 + 3600.
    assert actions(POLICY, script) == [(1800, "warn"), (4260, "warn"), (6060, "reclaim")]


def test_keep_holds_off_every_step_then_a_fresh_warning_comes() -> None:
    script: list[tuple[Kind, float]] = [("held", 2400), ("keep", 60), ("held", 9000)]
    # Kept from 2400 to 6000; warned again then, taken 30 minutes later.
    assert actions(POLICY, script) == [(1800, "warn"), (6000, "warn"), (7800, "reclaim")]
    free_kept: list[tuple[Kind, float]] = [("free", 300), ("keep", 60), ("free", 9000)]
    assert actions(POLICY, free_kept) == [(3900, "detach")]


def test_keep_is_limited_as_the_policy_says() -> None:
    watch, now = watch_over((HELD, 1800))
    watch = keep(keep(watch, POLICY, now), POLICY, now + 10)
    assert watch.keeps_used == 2
    assert watch.kept_until == now + 10 + 3600
    with pytest.raises(KeepRefused, match=r"pressed Keep 2 times .* allows \(2\)"):
        keep(watch, POLICY, now + 20)
    with pytest.raises(KeepRefused, match="Keep is turned off here"):
        keep(watch, replace(POLICY, keeps_allowed=0), now)
    unlimited = replace(POLICY, keeps_allowed=None)
    for press in range(20):
        watch = keep(watch, unlimited, now + press)
    assert watch.keeps_used == 22


def test_a_second_keep_never_shortens_the_first() -> None:
    policy = replace(POLICY, keep_for=3600)
    watch, now = watch_over((HELD, 60))
    long_keep = keep(watch, policy, now)
    short_keep = keep(long_keep, replace(policy, keep_for=600), now + 10)
    assert short_keep.kept_until == long_keep.kept_until


# -- properties ---------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> ReclaimPolicy:
    """Valid policies whose windows are a few readings long, so histories reach them."""
    gap = draw(st.floats(30, 300))
    detach = draw(sometimes_off(st.floats(gap + 1, 2000)))
    warn = draw(sometimes_off(st.floats(gap + 1, 2000)))
    reclaim = None if warn is None else warn + draw(st.floats(1, 2000))
    return ReclaimPolicy(
        detach_after=detach,
        warn_after=warn,
        reclaim_after=reclaim,
        keep_for=draw(st.floats(1, 3000)),
        keeps_allowed=draw(st.none() | st.integers(0, 3)),
        max_gap=gap,
    )


def sometimes_off(seconds: st.SearchStrategy[float]) -> st.SearchStrategy[float | None]:
    """A window, or now and then none (Hypothesis draws the first choice more often)."""
    return seconds | st.none()


KINDS: list[Kind] = ["free", "held", "busy", "unreadable", "nonsense", "tick", "keep"]
MOSTLY_IDLE: list[Kind] = [*KINDS, "free", "free", "held", "held", "held"]  # so windows fill


@st.composite
def histories(draw: st.DrawFn) -> tuple[ReclaimPolicy, list[tuple[float, Kind]]]:
    """A policy, and events under it: stretches of one kind, a reading every few seconds
    to max_gap, some stretches long enough to fill a window, some after too long a gap."""
    policy = draw(policies())
    events, at = [], 0.0
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(MOSTLY_IDLE))
        every = policy.max_gap * draw(st.sampled_from([0.1, 0.5, 1.0]))  # 1.0: just unbroken
        if draw(st.integers(0, 4)) == 0:  # readings missed before this stretch
            at += draw(st.floats(policy.max_gap, 3 * policy.max_gap))
        for _ in range(draw(st.sampled_from([1, 10, 30, 60]))):
            at += every
            events.append((at, kind))
    return policy, events


def readings(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind != "tick"]


def _within(events: Iterable[Event], t: float, window: float) -> list[Event]:
    return [e for e in events if t - e.at < window]


def _broken_within(events: list[Event], t: float, window: float, gap: float) -> bool:
    """An unreadable reading, or readings more than max_gap apart, inside the window."""
    seen = readings(events)
    if any(e.kind in ("unreadable", "nonsense") for e in _within(seen, t, window)):
        return True
    return any(b.at - a.at > gap and t - b.at < window for a, b in pairwise(seen))


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_gpu_that_worked_or_was_held_inside_its_window_is_never_taken(
    history: tuple[ReclaimPolicy, list[tuple[float, Kind]]],
) -> None:
    policy, events = history[0], run(*history)
    for i, event in enumerate(events):
        if event.action == "none":
            continue
        before = readings(events[: i + 1])
        if event.action == "detach":
            assert policy.detach_after is not None
            recent = _within(before, event.at, policy.detach_after)
            assert not [e for e in recent if e.kind in ("held", "busy", "keep")]
        if event.action in ("warn", "reclaim"):
            assert policy.warn_after is not None
            assert not [e for e in _within(before, event.at, policy.warn_after) if e.kind == "busy"]


@settings(max_examples=300, deadline=None)
@given(histories())
def test_unknown_inside_a_window_means_no_action(
    history: tuple[ReclaimPolicy, list[tuple[float, Kind]]],
) -> None:
    policy, events = history[0], run(*history)
    windows = {
        "detach": policy.detach_after,
        "warn": policy.warn_after,
        "reclaim": policy.reclaim_after,
    }
    for i, event in enumerate(events):
        window = windows.get(event.action)
        if window is None:
            continue
        assert not _broken_within(events[: i + 1], event.at, window, policy.max_gap)
        last_reading = readings(events[: i + 1])[-1]
        assert event.at - last_reading.at <= policy.max_gap


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_gpu_is_only_reclaimed_after_a_warning_it_had_time_to_heed(
    history: tuple[ReclaimPolicy, list[tuple[float, Kind]]],
) -> None:
    policy, events = history[0], run(*history)
    acted = [e for e in events if e.action != "none"]
    assert all(e.action == "warn" for e in acted[:-1])  # nothing after a GPU is taken
    for i, event in enumerate(events):
        if event.action != "reclaim":
            continue
        assert policy.warn_after is not None
        assert policy.reclaim_after is not None
        warns = [e for e in events[:i] if e.action == "warn"]
        assert warns, "reclaimed without a warning"
        warned = warns[-1]
        assert event.at >= warned.at + (policy.reclaim_after - policy.warn_after)
        since_warning = events[events.index(warned) + 1 : i + 1]
        assert not [e for e in since_warning if e.kind == "busy" or kept(e)]
        assert warned.decision is not None
        assert event.at >= (warned.decision.reclaim_at or math.inf)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_user_is_warned_again_only_after_work_a_keep_or_a_break(
    history: tuple[ReclaimPolicy, list[tuple[float, Kind]]],
) -> None:
    policy, events = history[0], run(*history)
    warns = [i for i, e in enumerate(events) if e.action == "warn"]
    for first, second in pairwise(warns):
        between = events[first + 1 : second + 1]
        broken = _broken_within(
            events[: second + 1],
            events[second].at,
            events[second].at - events[first].at,
            policy.max_gap,
        )
        assert broken or [e for e in between if e.kind == "busy" or kept(e)]


def kept(event: Event) -> bool:
    return event.kind == "keep" and not event.refused


@settings(max_examples=300, deadline=None)
@given(policies())
def test_every_valid_policy_reads_back_from_its_json(policy: ReclaimPolicy) -> None:
    assert policy_problems(policy.as_dict(), SITE_DEFAULT) == {}
    assert parse_policy(policy.as_dict(), SITE_DEFAULT) == policy


BAD_SECONDS = st.sampled_from([-1.0, 0.0, math.nan, math.inf, -math.inf, 8 * 24 * 3600.0])
BAD_TYPES = st.sampled_from([True, False, "600", b"600", [600], {"seconds": 600}])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), st.one_of(BAD_SECONDS, BAD_TYPES))
def test_every_bad_value_is_refused_under_its_own_name(field: str, value: object) -> None:
    if field in ("busy_percent", "memory_floor_mib") and isinstance(value, float) and value == 0:
        value = -1.0  # 0 is a fine floor: any utilisation is work, any memory a holder
    problems = policy_problems({field: value}, SITE_DEFAULT)
    assert list(problems) == [field]
    assert field in problems[field]
