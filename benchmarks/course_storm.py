"""A course starts at once: 60 students on a pool of 8 shared hosts, composespawner versus stock.

The class a shared pool is for: 20 students ask for one whole T4, 40 for a
CPU-only server (``gpu_count`` 0), each the catalog's default size for its
GPU count (4 cores and 32 GiB with a GPU, 2 cores and 8 GiB without). The
fabric has 8 hosts of 64 cores, 512 GiB and 16 slots in 2 racks, and 12 T4s a
rack: one host per student would take 60 hosts. Both sides run in one go on
fresh demo hubs with the stand-in notebook, as :mod:`benchmarks.spawn_storm`
does (its machinery, its figures); the stock side starts 60 notebooks with
JupyterHub's SimpleLocalProcessSpawner on the same machine. A third side runs the
same class with ``compose-ssh``: every simulated host a real sshd on its own
loopback address with the host agent as the hub key's forced command, each
notebook started there as the student's own account (created at its first
start, as on a bare host without campus accounts).

Figures: p95 submit → ready and its ratio to stock (the gate: at most 1.2); 0
failures; at the peak and after every stop, 0 hosts over capacity (the ledger's
machines on each host against the fabric's ProcessorSummary/MemorySummary, and
at most 16 devices attached), 0 double holders, 0 devices left attached or held;
and the most hosts composed at once. For compose-ssh the same, against stock and
against the local launcher, and the SSH connections and channels per start.

``python -m benchmarks course_storm``; ``python -m benchmarks.course_storm --rounds 1``.
Writes benchmarks/results/course_storm.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.hubload import RESULTS, FabricSize, write_result
from benchmarks.spawn_storm import run_side
from benchmarks.storm_report import OPTIONS, Round, print_table, result

STUDENTS = 60
WITH_GPU = 20  # the rest CPU-only
ROUNDS = 3
# 8 hosts in 2 racks; 12 T4s a rack: 24 for the 20 who want one.
FABRIC = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=12)


def options_for(student: int, with_gpu: int = WITH_GPU) -> dict[str, Any]:
    """What student ``student`` asks for: the first ``with_gpu`` a T4, the others no GPU."""
    if student < with_gpu:
        return dict(OPTIONS)
    return {"gpu_count": 0, "network": "shared", "scratch_gb": 0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.course_storm")
    parser.add_argument("--students", type=int, default=STUDENTS)
    parser.add_argument("--with-gpu", type=int, default=WITH_GPU, help="students with a T4")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=RESULTS / "course_storm.json")
    parser.add_argument("--logs", type=Path, help="a folder to keep the hubs' logs in")
    parser.add_argument(
        "--no-ssh", action="store_true", help="leave out the compose-ssh side (bare hosts)"
    )
    args = parser.parse_args(argv or [])
    sides = ["compose", "stock"] if args.no_ssh else ["compose", "ssh", "stock"]
    rounds = []
    for n in range(args.rounds):
        # Each round starts with another side (as spawn_storm): no side favoured.
        order = sides[n % len(sides) :] + sides[: n % len(sides)]
        ran = {
            side: run_side(
                args.students,
                stock=side == "stock",
                ssh=side == "ssh",
                spawn_limit=args.students,
                size=FABRIC,
                logs=args.logs and args.logs / f"round{n + 1}",
                options=lambda i: options_for(i, args.with_gpu),
                name_as="course_storm",
            )
            for side in order
        }
        rounds.append(Round(ours=ran["compose"], stock=ran["stock"], ssh=ran.get("ssh")))
    report = result(args.students, args.students, FABRIC, rounds)
    report["platform"] = "local processes" + ("" if args.no_ssh else "; compose-ssh on sshd hosts")
    report["class"] = {"students": args.students, "one_t4": args.with_gpu}
    write_result(args.out, report)
    print_table(report)


if __name__ == "__main__":
    main(sys.argv[1:])
