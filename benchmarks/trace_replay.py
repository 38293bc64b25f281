"""Alibaba's 2023 GPU trace (openb) replayed through composespawner's placement code.

Two clusters from the same 1,213 nodes and 6,212 GPUs of the trace:

* static: each trace node is a server with its own GPUs, so each node is a
  placement zone of its own (a task's GPUs and CPU come from one node);
* composable: zone = rack of 8 trace nodes of one GPU model; the rack's GPUs
  are one pool and a task gets GPUs from the pool of the rack whose host it
  runs on; hosts keep their own CPU and memory.

Every decision is ``place(pool_for(view, ...), ask)`` from
:mod:`composespawner.domain.placement`, unchanged. Placement treats a host as taken
once anything is attached to it; trace nodes are shared by many tasks, so
each step builds a fresh :class:`Inventory` view: every node that still has
the task's CPU and memory is offered as a free host, and the free GPUs of
those nodes' zones as free devices. ``place`` needs only *a* free host in the
zone, so this is the placement a composer of shareable hosts would make.

Measured:

(a) workload inflation as in the FGD paper (Weng et al., USENIX ATC'23): all
    trace tasks plus random draws from them until the requested GPUs reach 130%
    of the cluster's, shuffled, placed one by one and never released; a task
    that does not fit fails. Reported: allocated GPUs / all GPUs at the end.
(b) the trace's own timing: tasks arrive at ``creation_time`` and run for
    ``deletion_time - scheduled_time``; a task that does not fit waits
    (first come, first served, with backfill) until departures make room.

Writes ``benchmarks/results/trace_replay.json``.
"""

from __future__ import annotations

import heapq
import json
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from benchmarks.alibaba_trace import POD_LIST, Node, Task, load_nodes, load_tasks
from composespawner.domain.hardware import Device, Host, Inventory
from composespawner.domain.placement import DeviceAsk, NoFit, Plan, place, pool_for

RESULTS = Path(__file__).with_name("results")

RACK_SIZE = 8
INFLATION = 1.3  # requested GPUs / cluster GPUs, as in the FGD paper
SEEDS = tuple(range(42, 52))  # the paper's artifact averages seeds 42..51
PAPER_STATIC_BESTFIT = 0.931  # FGD paper, default trace, best fit, 130% demand
COMPRESSION = 100_000  # (b) stress run: arrivals this many times closer together


# ---------------------------------------------------------------------------
# Clusters as placement sees them
# ---------------------------------------------------------------------------


def static_zones(nodes: Sequence[Node]) -> dict[str, str]:
    """Node name -> zone: every server is its own island."""
    return {n.name: f"node/{n.name}" for n in nodes}


def composable_zones(nodes: Sequence[Node], rack_size: int = RACK_SIZE) -> dict[str, str]:
    """Node name -> zone: racks of ``rack_size`` nodes of one GPU model, in trace order.

    One model per rack keeps a multi-GPU machine from mixing models (a task
    without a model constraint accepts any model, and a pool of two would let
    placement mix them).
    """
    zones: dict[str, str] = {}
    by_model = sorted(nodes, key=lambda n: n.model)  # stable: trace order within a model
    for model, group in groupby(by_model, key=lambda n: n.model):
        for i, node in enumerate(group):
            zones[node.name] = f"rack/{model}/{i // rack_size:03d}"
    return zones


class DoubleAllocation(AssertionError):
    """A device was handed out while it was already in use: a broken benchmark or placement."""


@dataclass(frozen=True, slots=True)
class Allocation:
    node: str
    zone: str
    gpus: tuple[Device, ...]
    task: Task


@dataclass
class Cluster:
    """Free CPU, memory and GPUs of every trace node, grouped into placement zones."""

    nodes: Sequence[Node]
    zone_of: dict[str, str]
    hosts: dict[str, Host] = field(init=False)
    members: dict[str, list[Node]] = field(init=False)  # zone -> its nodes
    free_gpus: dict[str, dict[str, Device]] = field(init=False)  # zone -> block id -> GPU
    free_cpu: dict[str, int] = field(init=False)
    free_memory: dict[str, int] = field(init=False)
    placed: list[tuple[str, str, Host]] = field(init=False)  # node, zone, host
    in_use: set[str] = field(init=False, default_factory=set)
    models: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.hosts, self.members, self.free_gpus = {}, {}, {}
        for node in self.nodes:
            zone = self.zone_of[node.name]
            zones = frozenset({zone})
            self.hosts[node.name] = Host(
                node.name, f"{node.name}/host", zones, node.cpu_milli // 1000,
                node.memory_mib // 1024, "enabled",
            )  # fmt: skip
            self.members.setdefault(zone, []).append(node)
            pool = self.free_gpus.setdefault(zone, {})
            for i in range(node.gpus):
                gpu = Device(f"{node.name}/gpu{i}", "gpu", node.model, zones, node.name, "free")
                pool[gpu.block_id] = gpu
        self.free_cpu = {n.name: n.cpu_milli for n in self.nodes}
        self.free_memory = {n.name: n.memory_mib for n in self.nodes}
        self.models = frozenset(n.model for n in self.nodes)
        self.placed = [(n.name, self.zone_of[n.name], self.hosts[n.name]) for n in self.nodes]

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def allocated_gpus(self) -> int:
        return len(self.in_use)

    def view(self, task: Task) -> Inventory:
        """What the fabric would report for this task: nodes with room for it as free hosts.

        Zones with fewer free GPUs than the task needs are left out: placement
        never picks them, and leaving them out keeps a decision over 1,213
        static zones quick. What is in use is left out too, as the ledger's
        holds would leave it out of the pool.
        """
        need, cpu, memory = task.whole_gpus, task.cpu_milli, task.memory_mib
        hosts = [
            host
            for name, zone, host in self.placed
            if self.free_cpu[name] >= cpu
            and self.free_memory[name] >= memory
            and len(self.free_gpus[zone]) >= need
        ]
        zones = dict.fromkeys(self.zone_of[h.system_id] for h in hosts)
        devices = [gpu for zone in zones for gpu in self.free_gpus[zone].values()]
        return Inventory(hosts=tuple(hosts), devices=tuple(devices), zones=tuple(self.members))

    def decide(self, task: Task) -> Plan | NoFit:
        pool = pool_for(self.view(task), held=(), owners={}, groups=())
        models = task.gpu_spec or self.models
        return place(pool, DeviceAsk(models, task.whole_gpus, "/".join(sorted(models))))

    def allocate(self, task: Task, plan: Plan) -> Allocation:
        """Take what the plan names, checking first that all of it is still free."""
        node, zone = plan.host.system_id, plan.zone
        if any(
            g.block_id in self.in_use or g.block_id not in self.free_gpus[zone] for g in plan.gpus
        ):
            raise DoubleAllocation(f"{task.name}: {[g.block_id for g in plan.gpus]}")
        if self.free_cpu[node] < task.cpu_milli or self.free_memory[node] < task.memory_mib:
            raise DoubleAllocation(f"{task.name}: {node} would be overcommitted")
        for gpu in plan.gpus:
            del self.free_gpus[zone][gpu.block_id]
            self.in_use.add(gpu.block_id)
        self.free_cpu[node] -= task.cpu_milli
        self.free_memory[node] -= task.memory_mib
        return Allocation(node, zone, plan.gpus, task)

    def release(self, allocation: Allocation) -> None:
        for gpu in allocation.gpus:
            self.in_use.remove(gpu.block_id)
            self.free_gpus[allocation.zone][gpu.block_id] = gpu
        self.free_cpu[allocation.node] += allocation.task.cpu_milli
        self.free_memory[allocation.node] += allocation.task.memory_mib

    def try_start(self, task: Task) -> Allocation | None:
        decision = self.decide(task)
        return self.allocate(task, decision) if isinstance(decision, Plan) else None


# ---------------------------------------------------------------------------
# (a) Workload inflation to 130% of the GPUs
# ---------------------------------------------------------------------------


def inflated(
    tasks: Sequence[Task], target: float, demand: Callable[[Task], float], rng: random.Random
) -> list[Task]:
    """The trace's tasks, topped up with random draws until demand would pass ``target``.

    As the FGD simulator does it (``TunePodsByNodeTotalResource``): add draws
    while the next one still fits under the target, or drop random tasks while
    over it; then shuffle.
    """
    workload = list(tasks)
    total = sum(demand(t) for t in workload)
    while total > target and workload:
        total -= demand(workload.pop(rng.randrange(len(workload))))
    while True:
        draw = tasks[rng.randrange(len(tasks))]
        if total + demand(draw) > target:
            break
        workload.append(draw)
        total += demand(draw)
    rng.shuffle(workload)
    return workload


@dataclass(frozen=True, slots=True)
class Filled:
    """The end state of one inflation run."""

    allocated_share: float
    tasks: int
    failed: int
    failed_gpu_tasks: int


def fill(cluster: Cluster, workload: Iterable[Task]) -> Filled:
    """Place tasks one by one, never releasing; what does not fit fails."""
    tasks = failed = failed_gpu = 0
    for task in workload:
        tasks += 1
        if cluster.try_start(task) is None:
            failed += 1
            failed_gpu += task.whole_gpus > 0
    return Filled(cluster.allocated_gpus / cluster.total_gpus, tasks, failed, failed_gpu)


def sharing_best_fit(nodes: Sequence[Node], workload: Iterable[Task], rng: random.Random) -> float:
    """Calibration only, NOT composespawner's code: static best fit with GPU sharing.

    Approximates the FGD simulator's BestFit (score = 0.5 x CPU left / 128
    cores + 0.5 x GPU left / 8 GPUs, lowest wins, ties at random); a share
    goes to the fullest GPU that still has room. Returns allocated milli-GPUs /
    all milli-GPUs, the paper's measure, to check the inflation method against
    the paper's 93.1% before comparing whole-GPU placements.
    """
    free = _SharedNodes(nodes)
    for task in workload:
        best = free.best_fits(task)
        if best:
            free.take(rng.choice(best), task)
    total = sum(n.gpus for n in nodes) * 1000
    return (total - sum(sum(g) for g in free.gpus)) / total


class _SharedNodes:
    """Free CPU, memory and milli-GPUs per GPU of each node, for the sharing reference."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.cpu = [n.cpu_milli for n in nodes]
        self.memory = [n.memory_mib for n in nodes]
        self.gpus = [[1000] * n.gpus for n in nodes]

    def best_fits(self, task: Task) -> list[int]:
        """Indexes of the nodes with the lowest best-fit score among those that fit."""
        best: list[int] = []
        best_score = float("inf")
        for i, node in enumerate(self.nodes):
            if self.cpu[i] < task.cpu_milli or self.memory[i] < task.memory_mib:
                continue
            if (task.gpu_spec and node.model not in task.gpu_spec) or not _gpus_fit(
                self.gpus[i], task
            ):
                continue
            cpu_left = self.cpu[i] - task.cpu_milli
            score = cpu_left / 128_000 + (sum(self.gpus[i]) - task.gpu_demand_milli) / 8_000
            if score < best_score:
                best, best_score = [i], score
            elif score == best_score:
                best.append(i)
        return best

    def take(self, i: int, task: Task) -> None:
        self.cpu[i] -= task.cpu_milli
        self.memory[i] -= task.memory_mib
        _take_gpus(self.gpus[i], task)


def _gpus_fit(free: list[int], task: Task) -> bool:
    if task.sharing:
        return any(f >= task.gpu_milli for f in free)
    return sum(f == 1000 for f in free) >= task.num_gpu


def _take_gpus(free: list[int], task: Task) -> None:
    if task.sharing:
        i = min((i for i, f in enumerate(free) if f >= task.gpu_milli), key=lambda i: free[i])
        free[i] -= task.gpu_milli
        return
    for _ in range(task.num_gpu):
        free[free.index(1000)] = 0


# ---------------------------------------------------------------------------
# (b) The trace's own timing
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waits:
    tasks: int
    waited: int
    mean_wait_s: float  # over all tasks
    mean_wait_of_waiting_s: float  # over the tasks that waited
    never_started: int  # still waiting when the last task left

    @property
    def waiting_share(self) -> float:
        return self.waited / self.tasks if self.tasks else 0.0


def replay(cluster: Cluster, tasks: Iterable[Task], compression: float = 1) -> Waits:
    """Arrivals at creation time / ``compression``, each running for its recorded duration.

    Waiting tasks are retried in arrival order whenever something arrives or
    leaves; any that fits starts (backfill). Within one retry pass resources
    only shrink, so a task shaped like one that just failed is not asked again.
    """
    ran = sorted((t for t in tasks if t.duration is not None), key=lambda t: t.arrival)
    departures: list[tuple[float, int, Allocation]] = []
    waiting: list[tuple[float, Task]] = []
    waits: list[float] = []
    arrivals = [(t.arrival / compression, t) for t in ran]
    i = 0
    while i < len(arrivals) or departures:
        now = min(
            arrivals[i][0] if i < len(arrivals) else float("inf"),
            departures[0][0] if departures else float("inf"),
        )
        while departures and departures[0][0] <= now:
            cluster.release(heapq.heappop(departures)[2])
        while i < len(arrivals) and arrivals[i][0] <= now:
            waiting.append(arrivals[i])
            i += 1
        waiting = _start_what_fits(cluster, waiting, now, waits, departures)
    return _waits(len(ran), waits, len(waiting))


def _start_what_fits(
    cluster: Cluster,
    waiting: list[tuple[float, Task]],
    now: float,
    waits: list[float],
    departures: list[tuple[float, int, Allocation]],
) -> list[tuple[float, Task]]:
    failed_shapes: set[tuple[int, int, int, frozenset[str]]] = set()
    still: list[tuple[float, Task]] = []
    for arrived, task in waiting:
        shape = (task.cpu_milli, task.memory_mib, task.whole_gpus, task.gpu_spec)
        started = None if shape in failed_shapes else cluster.try_start(task)
        if started is None:
            failed_shapes.add(shape)
            still.append((arrived, task))
            continue
        waits.append(now - arrived)
        assert task.duration is not None
        heapq.heappush(departures, (now + task.duration, len(waits), started))  # unique order
    return still


def _waits(tasks: int, waits: list[float], never: int) -> Waits:
    waited = [w for w in waits if w > 0]
    return Waits(
        tasks=tasks,
        waited=len(waited) + never,
        mean_wait_s=statistics.fmean(waits) if waits else 0.0,
        mean_wait_of_waiting_s=statistics.fmean(waited) if waited else 0.0,
        never_started=never,
    )


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inflated:
    """One seed of (a)."""

    seed: int
    static: Filled
    composable: Filled
    sharing_reference: float | None


def inflation_run(
    seed: int, nodes: Sequence[Node], tasks: Sequence[Task], reference: bool = True
) -> Inflated:
    capacity = sum(n.gpus for n in nodes)
    whole = inflated(tasks, INFLATION * capacity, lambda t: t.whole_gpus, random.Random(seed))
    static = fill(Cluster(nodes, static_zones(nodes)), whole)
    composable = fill(Cluster(nodes, composable_zones(nodes)), whole)
    shared = None
    if reference:
        rng = random.Random(seed)
        milli = inflated(tasks, INFLATION * capacity * 1000, lambda t: t.gpu_demand_milli, rng)
        shared = sharing_best_fit(nodes, milli, rng)
    return Inflated(seed, static, composable, shared)


def timed_run(
    layout: str, compression: float, nodes: Sequence[Node], tasks: Sequence[Task]
) -> Waits:
    zones = static_zones(nodes) if layout == "static" else composable_zones(nodes)
    return replay(Cluster(nodes, zones), tasks, compression)


def main() -> None:
    started = time.monotonic()
    nodes, tasks = load_nodes(), load_tasks()
    # Seeds and replays are independent: two processes halve the wall time on 2 cores.
    with ProcessPoolExecutor(max_workers=2) as workers:
        replays = {
            (layout, factor): workers.submit(timed_run, layout, factor, nodes, tasks)
            for factor in (1, COMPRESSION)
            for layout in ("static", "composable")
        }
        seeds = [workers.submit(inflation_run, seed, nodes, tasks) for seed in SEEDS]
        inflation = [f.result() for f in seeds]
        waits: dict[tuple[str, float], Waits] = {k: f.result() for k, f in replays.items()}
    result = summary(nodes, tasks, inflation, waits)
    result["run_seconds"] = round(time.monotonic() - started, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trace_replay.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


ASSUMPTIONS = [
    "Trace: openb_node_list_gpu_node.csv (1,213 nodes) and openb_pod_list_default.csv.",
    "Static: one placement zone per trace node; its GPUs, CPU and memory serve only tasks there.",
    "Composable: zone = rack of 8 trace nodes of one GPU model (trace order within a model; the"
    " last rack of a model may be smaller); a task runs on a node of the rack with room for its"
    " CPU and memory and gets GPUs from the rack's pool.",
    "Each step offers placement an Inventory view: nodes with room for the task's CPU and memory"
    " as free hosts, the free GPUs of their zones as free devices (zones with too few free GPUs"
    " left out: placement would not pick them). Decisions: pool_for + place, unchanged.",
    "GPU sharing: a task with num_gpu 1 and gpu_milli < 1000 gets one whole GPU and counts as one"
    " requested GPU; allocated share = GPUs handed out / all GPUs.",
    "Tasks without GPUs (num_gpu 0) are placed too (CPU and memory only) and count in the task"
    " totals but not in GPU demand.",
    "(a) as the FGD artifact: all trace tasks plus random draws until requested GPUs would pass"
    " 130% of the cluster's, shuffled, placed once, never released; seeds 42-51, mean reported.",
    "(a) calibration: the paper's 93.1% is best fit WITH GPU sharing (milli-GPU shares); the"
    " sharing reference re-implements that policy approximately (not composespawner code) to"
    " check the inflation method itself.",
    "(b) tasks arrive at creation_time and hold resources for deletion_time - scheduled_time;"
    " Pending tasks (no scheduled_time, never ran) are left out. A task that does not fit waits;"
    " waiting tasks are retried in arrival order whenever a task arrives or leaves, and any that"
    " fits starts (backfill). Tasks still waiting at the end count as waiting, not in mean waits.",
    "(b) as recorded the tasks that ran never ask for more than 70 GPUs at once (about 1% of"
    " the cluster), so nothing waits; the stress run divides arrival times by"
    f" {COMPRESSION:,} (149 days into about 2 minutes, durations as recorded), where demand"
    " peaks at about 106% of the GPUs.",
]


def summary(
    nodes: Sequence[Node],
    tasks: Sequence[Task],
    inflation: Sequence[Inflated],
    waits: dict[tuple[str, float], Waits],
) -> dict[str, object]:
    references = [r.sharing_reference for r in inflation if r.sharing_reference is not None]
    result: dict[str, object] = {
        "trace": POD_LIST.name,
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "tasks": len(tasks),
        "static_zones": len(set(static_zones(nodes).values())),
        "composable_zones": len(set(composable_zones(nodes).values())),
        "rack_size": RACK_SIZE,
        "sharing_tasks": sum(t.sharing for t in tasks),
        "sharing_policy": "one whole GPU per GPU-sharing task",
        "seeds": [r.seed for r in inflation],
        "inflation": INFLATION,
        "inflated_tasks_mean": statistics.fmean(r.static.tasks for r in inflation),
        "static_bestfit_allocated_share": statistics.fmean(
            r.static.allocated_share for r in inflation
        ),
        "composable_allocated_share": statistics.fmean(
            r.composable.allocated_share for r in inflation
        ),
        "static_bestfit_allocated_share_by_seed": [r.static.allocated_share for r in inflation],
        "composable_allocated_share_by_seed": [r.composable.allocated_share for r in inflation],
        "static_failed_tasks_mean": statistics.fmean(r.static.failed for r in inflation),
        "composable_failed_tasks_mean": statistics.fmean(r.composable.failed for r in inflation),
        "paper_static_bestfit_share": PAPER_STATIC_BESTFIT,
        "sharing_bestfit_reference_share": statistics.fmean(references) if references else None,
        "replayed_tasks": sum(t.duration is not None for t in tasks),
        "skipped_pending_tasks": sum(t.duration is None for t in tasks),
        "compression": COMPRESSION,
    }
    for (layout, factor), w in waits.items():
        suffix = "" if factor == 1 else "_compressed"
        result[f"{layout}_waiting_share{suffix}"] = w.waiting_share
        result[f"{layout}_mean_wait_s{suffix}"] = w.mean_wait_s
        result[f"{layout}_mean_wait_of_waiting_s{suffix}"] = w.mean_wait_of_waiting_s
        result[f"{layout}_never_started{suffix}"] = w.never_started
    result["assumptions"] = ASSUMPTIONS
    return result


def print_table(r: dict[str, Any]) -> None:
    print(
        f"Alibaba openb 2023: {r['nodes']:,} nodes, {r['gpus']:,} GPUs, {r['tasks']:,} tasks"
        f" ({r['trace']})"
    )
    print(
        f"static: one zone per trace node ({r['static_zones']:,} zones); composable: zone ="
        f" rack of {r['rack_size']} nodes of one GPU model ({r['composable_zones']} racks),"
        " GPUs pooled per rack, hosts keep their own CPU and memory"
    )
    print(
        f"GPU-sharing tasks (gpu_milli < 1000): {r['sharing_tasks']:,}, each given one whole"
        " GPU (placement hands out whole devices)"
    )
    print()
    print(
        f"(a) demand grown to {r['inflation']:.0%} of GPUs, mean of {len(r['seeds'])} seeds"
        f" ({r['inflated_tasks_mean']:,.0f} tasks)"
    )
    print(f"    {'':46}{'allocated':>10}{'GPUs left':>11}{'failed tasks':>14}")
    rows = (
        ("static best fit, placement.py", r["static_bestfit_allocated_share"],
         r["static_failed_tasks_mean"]),
        ("composable, placement.py", r["composable_allocated_share"],
         r["composable_failed_tasks_mean"]),
    )  # fmt: skip
    for label, share, failed in rows:
        left = (1 - share) * r["gpus"]
        print(f"    {label:46}{share:>10.2%}{left:>11,.1f}{failed:>14,.0f}")
    paper = r["paper_static_bestfit_share"]
    print(f"    {'paper (FGD, ATC23): static best fit, sharing':46}{paper:>10.1%}")
    reference = r["sharing_bestfit_reference_share"]
    if reference is not None:
        print(f"    {'this method: static best fit, sharing (ref.)':46}{reference:>10.2%}")
    print()
    print(
        f"(b) trace timing: {r['replayed_tasks']:,} tasks that ran"
        f" ({r['skipped_pending_tasks']:,} Pending tasks left out)"
    )
    print(f"    {'':34}{'waited':>9}{'mean wait s':>13}{'of waiting s':>14}{'never ran':>11}")
    for suffix, label in (("", "as recorded"), ("_compressed", f"arrivals /{r['compression']:,}")):
        for layout in ("static", "composable"):
            print(
                f"    {label + ', ' + layout:34}{r[f'{layout}_waiting_share{suffix}']:>9.2%}"
                f"{r[f'{layout}_mean_wait_s{suffix}']:>13,.1f}"
                f"{r[f'{layout}_mean_wait_of_waiting_s{suffix}']:>14,.1f}"
                f"{r[f'{layout}_never_started{suffix}']:>11,}"
            )
    print(f"run: {r.get('run_seconds', 0):.0f} s")


if __name__ == "__main__":
    main()
