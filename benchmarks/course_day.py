"""The course day of :mod:`benchmarks.gpu_reclaim`, pure: what students do, and the books.

Time is in whole minutes from the day's start; a student does one thing a minute.
Every student's draws come from their own seeded RNG, in the same order on both sides,
so the baseline and the reclaim side meet the same class; only what waiting for a GPU
does to their day differs.

What is drawn (assumptions, stated, not measured; see gpu_reclaim's docstring):

* arrival: uniform over the first ``arrive_within`` minutes of the day;
* stay: lognormal, median ``stay_median`` minutes, sigma ``stay_sigma``, cut at day's end;
* a session: a burst of GPU work, lognormal (median ``burst_median``, sigma
  ``burst_sigma``), then an idle gap, lognormal (median ``gap_median``, sigma
  ``gap_sigma``), during which the student keeps a kernel holding the GPU with
  probability ``hold_in_gap`` (else they shut it down: nothing holds the GPU);
* leaving: the student stops the server with probability ``stop_on_leave``; if not, the
  server runs on to the day's end, a kernel holding the GPU with probability ``hold_in_gap``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

Doing = Literal["busy", "held", "unheld"]  # what a GPU a student holds does this minute
Phase = Literal["away", "wanting", "working", "gap", "left", "stopped"]


@dataclass(frozen=True)
class Habits:
    """The distributions a class is drawn from (minutes; sigmas of the natural log)."""

    day_minutes: int = 600  # 08:00 to 18:00
    arrive_within: int = 300
    stay_median: float = 180.0
    stay_sigma: float = 0.35
    burst_median: float = 15.0
    burst_sigma: float = 0.75
    gap_median: float = 12.0
    gap_sigma: float = 1.2
    hold_in_gap: float = 0.6
    stop_on_leave: float = 0.5


def lognormal_minutes(rng: random.Random, median: float, sigma: float) -> int:
    """A lognormal draw with this median, in whole minutes, at least one."""
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


@dataclass
class Student:
    """One student's day as it unfolds; ``rng`` draws their sessions in order."""

    name: str
    arrive: int
    leave: int
    stops_server: bool
    holds_after_leaving: bool
    rng: random.Random
    habits: Habits
    phase: Phase = "away"
    left_for: int = 0  # minutes to go in this burst or gap
    holds_kernel: bool = False
    has_machine: bool = False
    gpu: str | None = None  # the block the student's machine holds
    kernel: str | None = None
    kernels_started: int = 0
    wanting_since: int | None = None
    waits: list[int] = field(default_factory=list)  # minutes of each wait that ended
    gave_up_waiting: int = 0  # minutes waited in a wait the day ended
    given_back_since: int | None = None  # the GPU went back while it would have sat idle

    def next_burst(self) -> int:
        return lognormal_minutes(self.rng, self.habits.burst_median, self.habits.burst_sigma)

    def next_gap(self) -> tuple[int, bool]:
        minutes = lognormal_minutes(self.rng, self.habits.gap_median, self.habits.gap_sigma)
        return minutes, self.rng.random() < self.habits.hold_in_gap

    def doing(self) -> Doing | None:
        """What the student's GPU does this minute (None: they hold none)."""
        if self.gpu is None:
            return None
        if self.phase == "working":
            return "busy"
        return "held" if self.kernel is not None else "unheld"


def draw_class(students: int, habits: Habits, seed: int) -> list[Student]:
    """The class: each student drawn from a RNG of their own (``seed`` and their number)."""
    drawn = []
    for n in range(students):
        rng = random.Random(seed * 100_003 + n)
        arrive = rng.randrange(habits.arrive_within)
        stay = lognormal_minutes(rng, habits.stay_median, habits.stay_sigma)
        stops = rng.random() < habits.stop_on_leave
        holds = rng.random() < habits.hold_in_gap
        leave = min(arrive + stay, habits.day_minutes)
        drawn.append(Student(f"student{n:02d}", arrive, leave, stops, holds, rng, habits))
    return drawn


Step = Literal["ask", "start_kernel", "stop_kernel", "stop_server"]


def plan_minute(student: Student, minute: int) -> list[Step]:
    """Advance ``student`` to ``minute``: their phase, and what they do to the world now.

    ``ask``: they want a GPU and hold none (compose or grow; the caller tells them with
    :func:`got_gpu`); ``start_kernel``/``stop_kernel``: their kernel, which holds the GPU;
    ``stop_server``: they leave and stop their server.
    """
    steps: list[Step] = []
    if student.phase in ("left", "stopped"):
        return steps
    if minute >= student.leave and student.phase != "away":
        return _leave(student, minute)
    if student.phase == "away":
        if minute < student.arrive or minute >= student.leave:
            return steps
        student.phase = "wanting"
    elif student.phase in ("working", "gap"):
        student.left_for -= 1
        if student.left_for > 0:
            return steps
        if student.phase == "working":
            student.left_for, student.holds_kernel = student.next_gap()
            student.phase = "gap"
            if not student.holds_kernel and student.kernel is not None:
                steps.append("stop_kernel")
            return steps
        student.phase = "wanting"
    if student.phase == "wanting":
        student.given_back_since = None  # from now on they would have used it
        if student.gpu is not None:
            return [*_start_work(student), *steps]
        if student.wanting_since is None:
            student.wanting_since = minute
        steps.append("ask")
    return steps


def got_gpu(student: Student, minute: int, block: str) -> list[Step]:
    """The student was given ``block``: their wait ends and their burst starts."""
    student.gpu = block
    student.has_machine = True
    if student.wanting_since is not None:
        student.waits.append(minute - student.wanting_since)
        student.wanting_since = None
    return _start_work(student)


def _start_work(student: Student) -> list[Step]:
    student.phase = "working"
    student.left_for = student.next_burst()
    return [] if student.kernel is not None else ["start_kernel"]


def _leave(student: Student, minute: int) -> list[Step]:
    if student.wanting_since is not None:
        student.gave_up_waiting = minute - student.wanting_since
        student.wanting_since = None
    if student.stops_server and student.has_machine:
        student.phase = "stopped"
        student.given_back_since = None
        return ["stop_server"]
    student.phase = "left"
    if not student.holds_after_leaving and student.kernel is not None:
        return ["stop_kernel"]
    return []


def lost_gpu(student: Student, minute: int) -> None:
    """The reclaimer took the student's GPU (and, for a reclaim, their kernel)."""
    student.gpu = None
    if student.phase in ("gap", "left"):
        student.given_back_since = minute


@dataclass
class Books:
    """One side's GPU-minutes, counted a minute at a time from what students did."""

    held: int = 0  # minutes a GPU was attached to a student's machine
    busy: int = 0
    held_idle_by_kernel: int = 0  # idle, a kernel holding it
    given_back: int = 0  # minutes a GPU was back in the pool that its student would have
    # held idle (gap or gone home) had it not been taken: the counterfactual of reclaim
    idle_held_after_leaving: int = 0  # of held idle: its student had gone home
    given_back_after_leaving: int = 0  # of given back: its student had gone home

    def count(self, students: list[Student]) -> None:
        for student in students:
            doing = student.doing()
            gone = student.phase == "left"
            if doing is not None:
                self.held += 1
                self.busy += doing == "busy"
                self.held_idle_by_kernel += doing == "held"
                self.idle_held_after_leaving += gone
            elif student.given_back_since is not None and student.has_machine:
                self.given_back += 1
                self.given_back_after_leaving += gone

    @property
    def idle_held(self) -> int:
        return self.held - self.busy


@dataclass
class Truth:
    """What each GPU did, minute by minute, as the students' schedule had it."""

    by_gpu: dict[str, dict[int, Doing]] = field(default_factory=dict)

    def record(self, students: list[Student], minute: int) -> None:
        for student in students:
            doing = student.doing()
            if student.gpu is not None and doing is not None:
                self.by_gpu.setdefault(student.gpu, {})[minute] = doing

    def busy_within(self, gpu: str, start: int, end: int) -> bool:
        """Whether ``gpu`` did work at any minute from ``start`` to ``end`` included."""
        seen = self.by_gpu.get(gpu, {})
        return any(seen.get(m) == "busy" for m in range(start, end + 1))

    def idle_before(self, gpu: str, minute: int, *, held_counts: bool) -> int:
        """Whole minutes before ``minute`` since ``gpu`` last did work (or, ``held_counts``,
        since a kernel last held it); ``minute`` itself when it never did."""
        doings = ("busy", "held") if held_counts else ("busy",)
        seen = self.by_gpu.get(gpu, {})
        last = max((m for m, doing in seen.items() if m < minute and doing in doings), default=-1)
        return minute - last - 1

    def held_within(self, gpu: str, start: int, end: int) -> bool:
        """Whether a kernel held ``gpu`` (working or not) at any minute of ``start``..``end``."""
        seen = self.by_gpu.get(gpu, {})
        return any(seen.get(m) in ("busy", "held") for m in range(start, end + 1))


def wait_figures(students: list[Student]) -> dict[str, float | int]:
    """Who waited for a GPU and how long (minutes): waits that ended, and given up."""
    waits = sorted(w for s in students for w in s.waits if w > 0)
    gave_up = [s.gave_up_waiting for s in students if s.gave_up_waiting > 0]
    return {
        "students_waited": sum(1 for s in students if any(s.waits) or s.gave_up_waiting),
        "waits": len(waits),
        "wait_median_min": _quantile(waits, 0.5),
        "wait_p95_min": _quantile(waits, 0.95),
        "wait_max_min": max(waits, default=0),
        "students_gave_up": len(gave_up),
        "gave_up_after_median_min": _quantile(sorted(gave_up), 0.5),
        "never_got_a_gpu": sum(1 for s in students if not s.has_machine),
    }


def _quantile(ordered: list[int], q: float) -> float:
    """Nearest-rank quantile of sorted values; 0 when there are none."""
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])
