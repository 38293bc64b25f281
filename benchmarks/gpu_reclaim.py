"""Idle GPUs given back while servers run: a course day, without reclaim and with it.

Issue 32's figures. 60 students through a 10-hour day on 8 hosts and 24 T4s in 2 racks
(course_storm's class fabric; the demo's own has 8 T4s in all: too few to say anything,
while 24 for 60 students keeps GPUs scarce, so a GPU held idle is one somebody else
waits for), run twice in one invocation on a fresh fabric simulator and
ledger each: the **baseline** (nobody takes a GPU back) and **with reclaim** (the real
:class:`~composespawner.services.reclaimer.Reclaimer`, policy ``detach_after`` 600 s,
``warn_after`` 1200 s, ``reclaim_after`` 1800 s, the rest the site's defaults).

Real parts: the fabric simulator over HTTP (started with ``--faults-api``): its Redfish
for every attach and detach, through the real Composer and a real SQLite ledger in a
temporary folder; its DCGM exporter per host is what the reclaimer reads (the real
:class:`~composespawner.activity.dcgm.DcgmExporter`), and each GPU's figures are set
through ``/sim/activity`` every minute from what its student is doing. Students compose
their machines and grow them through the Composer directly (as the portal's *grow*
does): no hub, no notebook processes. The notebook servers' kernels API is the one boundary faked (a
strict fake: a kernel shut down that does not exist, or of a server not running, is an
error; every shutdown is recorded). Time is virtual: a minute is a step, the reclaimer
passes once a step (``sweep(now)``), so a day runs in minutes. Nobody presses *Keep*.

The class (:mod:`benchmarks.course_day`, seed 32): arrivals uniform over the first 5
hours; a stay lognormal, median 3 h (sigma 0.35); sessions of a burst of GPU work,
lognormal, median 15 min (sigma 0.75), then an idle gap, lognormal, median 12 min
(sigma 1.2: most pauses are short, a few run past an hour, lunch or a lecture); in a
gap 60 % keep a kernel holding the GPU (a framework's context), 40 % shut it down; on
leaving half stop their server, half leave it running to the day's end (60 % of those
with a kernel holding the GPU). These are assumptions, not measurements: lognormal
because human pause and session lengths are right-skewed with a long tail (the usual
fit for think times), the medians chosen for a lab session. A student who wants to
work and holds no GPU (never got one, or it went back) asks for one (compose, or grow
once the machine runs) every minute until one is free; their burst starts when they
get it.

Figures, from the students' own schedule (not the reclaimer's view): GPU-hours held,
busy (work done) and held idle; GPU-hours given back (minutes a taken GPU's student
would have held it idle: to their next burst, or their server's stop or the day's end);
the share of idle holding given back, given_back / (given_back + idle still held) on the
reclaim side (the gate: at least 0.5; ``idle_kept_share`` at most 0.5), and the same
share while students were in class (``given_back_share_in_class``, not gated: servers
left running after their students went home are the easy part, and the figures split
them out), and the baseline's idle-held GPU-hours beside the reclaim side's; who waited
for a GPU and how long (waits that ended; those still waiting when they left are
counted apart).

Every detach and reclaim is checked against the schedule. The state set at minute m is
what the GPU does from m to m+1, and the pass at m reads it: work that ended at m+1 was
last seen at m. The reclaimer counts a window from the first reading without work (the
one after it), so ``busy_taken`` (the gate: 0) counts a take of a GPU that worked
anywhere in its whole window, and ``shortest_idle_before_*_s`` say how long each kind
of take had seen no work at least. ``held_detached`` (the gate: 0) is a detach of a
GPU a kernel held anywhere in its window.

``python -m benchmarks gpu_reclaim``; ``python -m benchmarks.gpu_reclaim --students 6``.
Writes benchmarks/results/gpu_reclaim.json.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.course_day import (
    Books,
    Habits,
    Student,
    Truth,
    draw_class,
    got_gpu,
    lost_gpu,
    plan_minute,
    wait_figures,
)
from benchmarks.gates import unmet
from benchmarks.hubload import RESULTS, FabricSize, inventory_toml, write_result
from benchmarks.interrupt import interrupt_on_sigterm
from composespawner.activity.dcgm import DcgmExporter
from composespawner.domain.catalog import Catalog
from composespawner.domain.reclaim import ReclaimPolicy
from composespawner.domain.request import MachineRequest
from composespawner.fabric.redfish import RedfishFabric, RedfishTimeouts
from composespawner.ledger import Ledger
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.kernels import Kernel, KernelsUnavailable
from composespawner.services.reclaimer import Action, Reclaimer
from harness.paths import HUB_CONFIG
from harness.simulator import CREDENTIALS, SimulatorProcess

STUDENTS = 60
SEED = 32
FABRIC = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=12)  # course_storm's class
# The windows a detach and a reclaim are checked over (POLICY's).
WINDOW_S = {"detach": 600, "reclaim": 1800}
POLICY = ReclaimPolicy(
    detach_after=WINDOW_S["detach"], warn_after=1200, reclaim_after=WINDOW_S["reclaim"]
)
STEP_S = 60  # a minute of the day; the reclaimer passes once a step
DAY_START = datetime(2026, 11, 23, 8, 0, tzinfo=UTC).timestamp()  # a Monday, 08:00
# The catalog's default size for one GPU (course_storm's students ask the same).
ONE_T4 = MachineRequest(gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0, size="medium")
BUSY = {"utilization": 85.0, "memory_used_mib": 9000.0}  # a training step
HELD = {"utilization": 0.0, "memory_used_mib": 600.0}  # a CUDA context, no kernel running
HTTP_TIMEOUT_S = 10.0


class CourseKernels:
    """The students' notebook servers' kernels: a strict fake of the reclaimer's KernelsApi."""

    def __init__(self) -> None:
        self.running: dict[str, list[str]] = {}  # user -> kernel ids, of servers that run
        self.shut_down_by_reclaimer: list[tuple[str, str]] = []  # (user, kernel id)

    async def kernels(self, user: str, server: str) -> list[Kernel]:
        return [Kernel(k, "python3", "idle", None) for k in self._server(user, server)]

    async def shut_down(self, user: str, server: str, kernel_id: str) -> None:
        kernels = self._server(user, server)
        if kernel_id not in kernels:
            raise KernelsUnavailable(f"HTTP 404: no kernel {kernel_id} on {user}'s server")
        kernels.remove(kernel_id)
        self.shut_down_by_reclaimer.append((user, kernel_id))

    def _server(self, user: str, server: str) -> list[str]:
        if server or user not in self.running:
            raise KernelsUnavailable(f"HTTP 424: {user}/{server} is not running")
        return self.running[user]


@dataclass
class Side:
    """What one run of the day did, beside its books."""

    name: str
    books: Books = field(default_factory=Books)
    truth: Truth = field(default_factory=Truth)
    actions: dict[str, int] = field(default_factory=dict)  # kind/outcome -> count
    busy_taken: list[str] = field(default_factory=list)
    held_detached: list[str] = field(default_factory=list)
    kernels_shut_down: int = 0
    # kind -> the fewest seconds a GPU taken had been unheld (detach) or without work
    # (reclaim) by the schedule, against the policy's detach_after and reclaim_after
    shortest_idle_s: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    sweep_s: list[float] = field(default_factory=list)
    run_s: float = 0.0


class Day:
    """One side's day: the students, the composer on the simulator, the reclaimer if any."""

    def __init__(
        self,
        side: Side,
        students: list[Student],
        composer: Composer,
        http: aiohttp.ClientSession,
        sim_url: str,
        reclaimer: Reclaimer | None,
        kernels: CourseKernels,
    ) -> None:
        self.side, self.students, self.composer = side, students, composer
        self.http, self.sim_url, self.reclaimer, self.kernels = http, sim_url, reclaimer, kernels
        self.machine_of: dict[str, str] = {}  # student -> machine id
        self._figures: dict[str, dict[str, float]] | None = None
        self._gpus: set[str] = set()
        # Counts GPUs freed. A student refused for want of a GPU is refused again until
        # one is freed (claims only take more), so they ask again only then: the same
        # answers without thousands of refused composes.
        self._freed = 0
        self._refused_at: dict[str, int] = {}

    async def run(self, minutes: int) -> None:
        inventory = await self.composer.pool.known_inventory()
        self._gpus = {d.block_id for d in inventory.devices if d.kind == "gpu"}
        for minute in range(minutes + 1):
            asks: list[Student] = []
            for student in self.students:
                for step in plan_minute(student, minute):
                    if step == "ask":
                        asks.append(student)
                    else:
                        await self._do(student, step, minute)
            # First come, first served: the longest waiting asks first.
            for student in sorted(asks, key=lambda s: (s.wanting_since or 0, s.name)):
                if self._refused_at.get(student.name) != self._freed:
                    await self._ask(student, minute)
            await self._set_figures()
            self.side.truth.record(self.students, minute)
            self.side.books.count(self.students)
            if self.reclaimer is not None:
                started = time.perf_counter()
                actions = await self.reclaimer.sweep(DAY_START + minute * STEP_S)
                self.side.sweep_s.append(time.perf_counter() - started)
                for action in actions:
                    self._taken(action, minute)
        await self._check_books()
        self.side.kernels_shut_down = len(self.kernels.shut_down_by_reclaimer)

    async def _do(self, student: Student, step: str, minute: int) -> None:
        if step == "start_kernel":
            student.kernels_started += 1
            student.kernel = f"{student.name}-k{student.kernels_started}"
            self.kernels.running.setdefault(student.name, []).append(student.kernel)
        elif step == "stop_kernel":
            running = self.kernels.running.get(student.name, [])
            if student.kernel in running:
                running.remove(student.kernel)
            student.kernel = None
        elif step == "stop_server":
            try:
                await self.composer.release(self.machine_of.pop(student.name), reason="stopped")
            except Exception as e:  # a benchmark reports, it does not stop the day
                self.side.errors.append(f"minute {minute}: stopping {student.name}: {e}")
            self._freed += 1
            self.kernels.running.pop(student.name, None)
            student.gpu = student.kernel = None

    async def _ask(self, student: Student, minute: int) -> None:
        """Compose the student's machine with a T4, or grow the running one by one."""
        try:
            if student.name not in self.machine_of:
                composed = await self.composer.compose(
                    user=student.name,
                    groups=frozenset(),
                    server="",
                    request=ONE_T4,
                    progress=lambda message: None,
                    then=("launching", "starting notebook"),
                )
                await self.composer.record(composed.machine_id, "running", "notebook up")
                self.machine_of[student.name] = composed.machine_id
                self.kernels.running[student.name] = []
                machine = await self.composer.running_machine(student.name, "")
            else:
                machine = await self.composer.grow(student.name, frozenset(), "", 1)
        except ComposeRefused as e:
            if e.reason != "no-fit":
                self.side.errors.append(f"minute {minute}: {student.name} refused: {e}")
            self._refused_at[student.name] = self._freed
            return  # nothing free: they wait, and ask again once a GPU is freed
        except ComposeFailed as e:
            self.side.errors.append(f"minute {minute}: {student.name}: {e}")
            return
        gpus = [b for b in machine.block_ids if b in self._gpus]
        if len(gpus) != 1:
            self.side.errors.append(f"minute {minute}: {student.name} holds GPUs {gpus}")
            return
        for step in got_gpu(student, minute, gpus[0]):
            await self._do(student, step, minute)

    async def _set_figures(self) -> None:
        """Every GPU's figures as its student's minute has them (PUT: the rest idle)."""
        figures = {
            s.gpu: BUSY if doing == "busy" else HELD
            for s in self.students
            if s.gpu is not None and (doing := s.doing()) in ("busy", "held")
        }
        if figures == self._figures:
            return
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        url = f"{self.sim_url}/sim/activity"
        async with self.http.put(url, json=figures, timeout=timeout) as answer:
            if answer.status != 200:
                raise RuntimeError(f"PUT /sim/activity: {answer.status} {await answer.text()}")
        self._figures = figures

    def _taken(self, action: Action, minute: int) -> None:
        """Book what the reclaimer did, and check it against the students' schedule."""
        key = f"{action.kind}/{action.outcome}"
        self.side.actions[key] = self.side.actions.get(key, 0) + 1
        if action.kind == "warn" or action.outcome != "done":
            return
        student = next(s for s in self.students if s.name == action.user)
        if student.gpu != action.block_id:
            self.side.errors.append(f"minute {minute}: took {action.block_id} of {student.name}")
            return
        # The pass at minute m reads what the GPU does from m to m+1: the whole window
        # before a take, by the schedule, must be without work (without a holder).
        last = minute - int(WINDOW_S[action.kind] // STEP_S)
        said = f"minute {minute}: {action.kind} of {action.block_id} ({student.name})"
        truth = self.side.truth
        if truth.busy_within(action.block_id, last, minute):
            self.side.busy_taken.append(said)
        if action.kind == "detach" and truth.held_within(action.block_id, last, minute):
            self.side.held_detached.append(said)
        idle = truth.idle_before(action.block_id, minute, held_counts=action.kind == "detach")
        shortest = self.side.shortest_idle_s.get(action.kind, idle * STEP_S)
        self.side.shortest_idle_s[action.kind] = min(shortest, idle * STEP_S)
        if student.kernel not in self.kernels.running.get(student.name, []):
            student.kernel = None  # the reclaimer shut it down
        lost_gpu(student, minute)
        self._freed += 1

    async def _check_books(self) -> None:
        """The ledger holds exactly the GPUs the students think they hold."""
        holders = await self.composer.runner.run(self.composer.ledger.holders)
        held = {block for block in holders if block in self._gpus}
        theirs = {s.gpu for s in self.students if s.gpu is not None}
        self.side.mismatches += [f"ledger only: {b}" for b in sorted(held - theirs)]
        self.side.mismatches += [f"students only: {b}" for b in sorted(theirs - held)]


async def _run_day(
    side: Side, students: list[Student], sim_url: str, work: Path, reclaim: bool
) -> None:
    ledger = Ledger(f"sqlite:///{work / 'ledger.sqlite'}")
    ledger.upgrade()
    fabric = RedfishFabric(
        sim_url,
        username=CREDENTIALS[0],
        password=CREDENTIALS[1],
        timeouts=RedfishTimeouts(connect=5, request=HTTP_TIMEOUT_S, operation=30),
    )
    composer = Composer(
        ledger=ledger,
        fabric=fabric,
        catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
        hub_id="gpu-reclaim-bench",
        snapshot_ttl=0,  # a minute is milliseconds here: every placement reads the fabric
    )
    source = DcgmExporter(lambda host: f"{sim_url}/dcgm/{host}/metrics", HTTP_TIMEOUT_S)
    kernels = CourseKernels()
    reclaimer = (
        Reclaimer(composer, source, site_policy=POLICY, kernels=kernels) if reclaim else None
    )
    try:
        async with aiohttp.ClientSession() as http:
            day = Day(side, students, composer, http, sim_url, reclaimer, kernels)
            await day.run(students[0].habits.day_minutes)
    finally:
        await source.close()
        await composer.close()


def run_side(
    name: str, students: list[Student], size: FabricSize, reclaim: bool, logs: Path | None
) -> Side:
    """One day on a fresh simulator and ledger."""
    side = Side(name)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        work = Path(tmp_name)
        inventory = work / "inventory.toml"
        inventory.write_text(inventory_toml(size))
        log_path = (logs or work) / f"gpu_reclaim-{name}-simulator.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        args = ["--faults-api", "--inventory", str(inventory)]  # the last --inventory wins
        with SimulatorProcess(args, log_path) as simulator:
            asyncio.run(_run_day(side, students, simulator.url, work, reclaim))
    side.run_s = time.perf_counter() - started
    return side


def side_figures(side: Side, students: list[Student]) -> dict[str, Any]:
    books = side.books
    hours = 60.0
    return {
        "held_gpu_h": books.held / hours,
        "busy_gpu_h": books.busy / hours,
        "idle_held_gpu_h": books.idle_held / hours,
        "idle_held_by_kernel_gpu_h": books.held_idle_by_kernel / hours,
        "given_back_gpu_h": books.given_back / hours,
        "idle_held_after_leaving_gpu_h": books.idle_held_after_leaving / hours,
        "given_back_after_leaving_gpu_h": books.given_back_after_leaving / hours,
        "busy_share_of_held": books.busy / books.held if books.held else 0.0,
        **wait_figures(students),
        "actions": dict(sorted(side.actions.items())),
        "kernels_shut_down": side.kernels_shut_down,
        "busy_taken": len(side.busy_taken),
        "shortest_idle_before_detach_s": side.shortest_idle_s.get("detach"),
        "shortest_idle_before_reclaim_s": side.shortest_idle_s.get("reclaim"),
        "held_detached": len(side.held_detached),
        "errors": len(side.errors) + len(side.mismatches),
        "problems": (side.busy_taken + side.held_detached + side.errors + side.mismatches)[:20],
        "sweep_ms_mean": 1000 * sum(side.sweep_s) / len(side.sweep_s) if side.sweep_s else 0.0,
        "run_s": side.run_s,
    }


def result(
    baseline: dict[str, Any],
    reclaim: dict[str, Any],
    size: FabricSize,
    habits: Habits,
    class_of: tuple[int, int],
) -> dict[str, Any]:
    """Both sides, and the figures the gates read (counts of what went wrong: 0 is right)."""
    given, kept = reclaim["given_back_gpu_h"], reclaim["idle_held_gpu_h"]
    share = given / (given + kept) if given + kept else 0.0
    base_idle = baseline["idle_held_gpu_h"]
    # The same share counting only students still in class (their servers left running
    # after they went home are the easy part).
    given_in = given - reclaim["given_back_after_leaving_gpu_h"]
    kept_in = kept - reclaim["idle_held_after_leaving_gpu_h"]
    return {
        "students": class_of[0],
        "seed": class_of[1],
        "fabric": {"racks": size.zones, "hosts": size.hosts, "t4s": size.gpus},
        "policy": POLICY.as_dict(),
        "habits": habits.__dict__,
        "given_back_share": share,
        "idle_kept_share": 1.0 - share,  # gated: at most 0.5
        "given_back_share_in_class": given_in / (given_in + kept_in) if given_in + kept_in else 0.0,
        "idle_held_baseline_gpu_h": base_idle,
        "idle_held_reclaim_gpu_h": kept,
        "idle_held_ratio": kept / base_idle if base_idle else 0.0,
        "busy_ratio": reclaim["busy_gpu_h"] / baseline["busy_gpu_h"]
        if baseline["busy_gpu_h"]
        else 0.0,
        "busy_taken": baseline["busy_taken"] + reclaim["busy_taken"],
        "held_detached": baseline["held_detached"] + reclaim["held_detached"],
        # not gated: counts the takes whose window began in a burst's last minute
        "shortest_idle_before_detach_s": reclaim["shortest_idle_before_detach_s"],
        "shortest_idle_before_reclaim_s": reclaim["shortest_idle_before_reclaim_s"],
        "errors": baseline["errors"] + reclaim["errors"],
        "baseline": baseline,
        "reclaim": reclaim,
    }


ROWS = [
    ("GPU-hours held", "held_gpu_h", ".1f"),
    ("  busy (work done)", "busy_gpu_h", ".1f"),
    ("  held idle", "idle_held_gpu_h", ".1f"),
    ("  held idle by a kernel", "idle_held_by_kernel_gpu_h", ".1f"),
    ("  held idle, student gone", "idle_held_after_leaving_gpu_h", ".1f"),
    ("GPU-hours given back", "given_back_gpu_h", ".1f"),
    ("  student gone", "given_back_after_leaving_gpu_h", ".1f"),
    ("students who waited", "students_waited", "d"),
    ("waits", "waits", "d"),
    ("wait median (min)", "wait_median_min", ".0f"),
    ("wait p95 (min)", "wait_p95_min", ".0f"),
    ("wait max (min)", "wait_max_min", ".0f"),
    ("gave up waiting at leaving", "students_gave_up", "d"),
    ("never got a GPU", "never_got_a_gpu", "d"),
    ("busy GPUs taken", "busy_taken", "d"),
    ("held GPUs detached", "held_detached", "d"),
    ("errors", "errors", "d"),
    ("run (s)", "run_s", ".0f"),
]


def print_table(report: dict[str, Any]) -> None:
    fabric = report["fabric"]
    print(
        f"gpu_reclaim: {report['students']} students, {fabric['hosts']} hosts,"
        f" {fabric['t4s']} T4s, policy {report['policy']}"
    )
    print(f"{'':28} {'baseline':>10} {'reclaim':>10}")
    for label, key, form in ROWS:
        base, ours = report["baseline"][key], report["reclaim"][key]
        print(f"{label:28} {base:>10{form}} {ours:>10{form}}")
    reclaim = report["reclaim"]
    print(
        f"reclaimer actions: {reclaim['actions']}; {reclaim['kernels_shut_down']} kernels shut"
        f" down; by the schedule, the shortest a taken GPU had gone unheld before a detach"
        f" {reclaim['shortest_idle_before_detach_s']} s (detach_after {WINDOW_S['detach']} s),"
        f" without work before a reclaim {reclaim['shortest_idle_before_reclaim_s']} s"
        f" (reclaim_after {WINDOW_S['reclaim']} s)"
    )
    print(
        f"idle-held GPU-hours with reclaim / baseline: {report['idle_held_ratio']:.2f};"
        f" busy GPU-hours with reclaim / baseline: {report['busy_ratio']:.2f};"
        f" share of idle holding given back: {report['given_back_share']:.2f} (gate >= 0.5),"
        f" {report['given_back_share_in_class']:.2f} while students were in class"
    )
    for problem in report["baseline"]["problems"] + report["reclaim"]["problems"]:
        print(f"problem: {problem}")
    for line in unmet("gpu_reclaim", report):
        print(f"GATE NOT MET: {line}")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv or [])
    habits = Habits()
    if args.stop_on_leave is not None:
        habits = replace(habits, stop_on_leave=args.stop_on_leave)
    if args.minutes is not None:  # a shorter day keeps the class's shape
        scale = args.minutes / habits.day_minutes
        habits = replace(
            habits,
            day_minutes=args.minutes,
            arrive_within=max(1, round(habits.arrive_within * scale)),
            stay_median=habits.stay_median * scale,
        )
    size = FabricSize(
        zones=args.racks, hosts_per_zone=args.hosts_per_rack, gpus_per_zone=args.t4s_per_rack
    )
    logging.basicConfig(level=logging.WARNING)
    figures = {}
    for name, reclaim in (("baseline", False), ("reclaim", True)):
        students = draw_class(args.students, habits, args.seed)
        side = run_side(name, students, size, reclaim, args.logs)
        figures[name] = side_figures(side, students)
    report = result(
        figures["baseline"], figures["reclaim"], size, habits, (args.students, args.seed)
    )
    write_result(args.out, report)
    print_table(report)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_reclaim")
    parser.add_argument("--students", type=int, default=STUDENTS)
    parser.add_argument("--minutes", type=int, help="a shorter day (default 600: 08:00-18:00)")
    parser.add_argument("--racks", type=int, default=FABRIC.zones)
    parser.add_argument("--hosts-per-rack", type=int, default=FABRIC.hosts_per_zone)
    parser.add_argument("--t4s-per-rack", type=int, default=FABRIC.gpus_per_zone)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--stop-on-leave", type=float, help="share of students who stop their server on leaving"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_reclaim.json")
    parser.add_argument("--logs", type=Path, help="a folder to keep the simulators' logs in")
    return parser


if __name__ == "__main__":
    interrupt_on_sigterm()
    main(sys.argv[1:])
