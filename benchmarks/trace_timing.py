"""Trace replay (b): the trace's own timing, tasks arriving and leaving, through a
:class:`benchmarks.trace_replay.Cluster`."""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from benchmarks.alibaba_trace import Task


class Cluster(Protocol):
    """What a replay needs of :class:`benchmarks.trace_replay.Cluster`."""

    def try_start(self, task: Task) -> Any | None: ...  # an allocation, or None: no room

    def release(self, allocation: Any) -> None: ...


Allocation = Any  # what try_start returns


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
