"""Alibaba's 2023 GPU trace (openb), read from ``../shared/data``: its nodes and its tasks.

Columns as the trace's README gives them (Weng et al., USENIX ATC'23): per node its
CPU (milli-cores), memory (MiB), GPUs and model; per task what it asked for (CPU,
memory, GPUs, the thousandths of a GPU it shares) and when it was created,
scheduled and deleted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACE = SHARED / "data" / "alibaba-openb-2023"
NODE_LIST = TRACE / "openb_node_list_gpu_node.csv"
POD_LIST = TRACE / "openb_pod_list_default.csv"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU; < 1000 with num_gpu == 1 is a share of one GPU
    gpu_spec: frozenset[str]  # acceptable models; empty: any
    arrival: int  # creation_time, s
    duration: int | None  # deletion_time - scheduled_time; None: never ran (Pending)

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000

    @property
    def whole_gpus(self) -> int:
        """What a fabric that hands out whole devices must give: a share takes one GPU."""
        return self.num_gpu

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


def load_nodes(path: Path = NODE_LIST) -> list[Node]:
    with path.open(newline="") as f:
        return [
            Node(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
            for r in csv.DictReader(f)
        ]


def load_tasks(path: Path = POD_LIST) -> list[Task]:
    with path.open(newline="") as f:
        return [_task(r) for r in csv.DictReader(f)]


def _task(row: dict[str, str]) -> Task:
    created = int(row.get("creation_time") or 0)
    started = int(row.get("scheduled_time") or created)
    deleted = row.get("deletion_time") or ""
    ran = row.get("pod_phase") != "Pending" and bool(row.get("scheduled_time")) and bool(deleted)
    return Task(
        name=row["name"],
        cpu_milli=int(row["cpu_milli"]),
        memory_mib=int(row["memory_mib"]),
        num_gpu=int(row["num_gpu"]),
        gpu_milli=int(row["gpu_milli"]),
        gpu_spec=frozenset(s for s in (row.get("gpu_spec") or "").split("|") if s),
        arrival=created,
        duration=int(deleted) - started if ran else None,
    )
