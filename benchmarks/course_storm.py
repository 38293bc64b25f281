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

The share variant: 100 students start at once, each asking for a quarter of a T4
(``"gpu_count": 1, "gpu_share": 4``), composespawner alone (the stock spawner
has no shares), on 8 hosts and 26 T4s (13 a rack: a rack's 4 hosts take 64
students and its GPUs 52 quarters; 24 T4s hold 96 quarters, not 100). Figures:
every student started; at the peak the T4s attached on the fabric against
⌈holders/4⌉ (the ledger's split GPUs' holders), 0 GPUs with more holders than
slots (by the ledger, and by the servers told each GPU), every holder on the
host its GPU is attached to; after the stop every T4 free on the fabric and no
GPU split in the ledger.

``python -m benchmarks course_storm``; ``python -m benchmarks.course_storm --rounds 1``;
the share variant alone: ``python -m benchmarks.course_storm --shares-only``.
Writes benchmarks/results/course_storm.json and course_storm_shares.json.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.hubload import (
    RESULTS,
    FabricSize,
    api_session,
    check_holders,
    create_users,
    fabric_view,
    hub_log_problems,
    inventory_toml,
    keep_log,
    load_config,
    load_env,
    ratio,
    wait_released,
    write_result,
)
from benchmarks.interrupt import interrupt_on_sigterm
from benchmarks.spawn_storm import run_side, server_devices, start_all, stop_all
from benchmarks.storm_report import OPTIONS, Round, Side, UserRun, print_table, result
from composespawner.ledger import Ledger
from harness.hub import Hub, running_hub

STUDENTS = 60
WITH_GPU = 20  # the rest CPU-only
ROUNDS = 3
# 8 hosts in 2 racks; 12 T4s a rack: 24 for the 20 who want one.
FABRIC = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=12)
SHARE_STUDENTS = 100
SHARE = 4  # a quarter of a T4 each
# 8 hosts in 2 racks; 13 T4s a rack: 26 for the 25 that 100 quarters fill.
SHARE_FABRIC = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=13)


def options_for(student: int, with_gpu: int = WITH_GPU) -> dict[str, Any]:
    """What student ``student`` asks for: the first ``with_gpu`` a T4, the others no GPU."""
    if student < with_gpu:
        return dict(OPTIONS)
    return {"gpu_count": 0, "network": "shared", "scratch_gb": 0}


def share_round(students: int, size: FabricSize, n: int, logs: Path | None) -> dict[str, Any]:
    """Round ``n`` of the share variant, and the stock spawner starting as many notebooks
    on the same machine beside it (no GPUs, no shares: how long a start takes here today);
    the sides take turns to go first."""

    def stock() -> Side:
        return run_side(
            students, stock=True, spawn_limit=students, size=size, logs=logs, name_as="shares"
        )

    baseline = stock() if n % 2 else None
    ours = run_shares(students, size, logs=logs)
    baseline = baseline or stock()
    theirs = baseline.summary()
    return {
        **ours,
        "p95_ratio": ratio(ours["compose"]["p95_s"], theirs["p95_s"]),
        "p50_ratio": ratio(ours["compose"]["p50_s"], theirs["p50_s"]),
        "stock": theirs,
    }


def share_options(share: int = SHARE) -> dict[str, Any]:
    """What every student of the share variant asks for: 1/``share`` of one T4."""
    return {**OPTIONS, "gpu_share": share}


def run_shares(
    students: int, size: FabricSize, share: int = SHARE, logs: Path | None = None
) -> dict[str, Any]:
    """The share variant, once, on a fresh hub: everyone starts a share at once, the books
    are read at the peak, everyone stops at once, and the books are read again."""
    names = [f"storm{i:04d}" for i in range(students)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        inventory = tmp / "bench_inventory.toml"
        inventory.write_text(inventory_toml(size))
        config = load_config(spawn_limit=students, page_limit=students)
        with (
            running_hub(tmp, config, **_hub_env(inventory)) as hub,
            api_session(students + 1) as session,
        ):
            create_users(hub, names)
            runs = [UserRun(name, share_options(share)) for name in names]
            start_all(hub, session, runs)
            peak = share_books(hub, share, server_devices(hub, session, students))
            stop_all_s, stop_errors, listings = stop_all(hub, session, runs)
            wait_released(hub)
            after = share_books(hub, share)
            log = hub_log_problems(hub)
        keep_log(hub, logs, "course_storm-shares-ComposeSpawner.log")
    side = Side("ComposeSpawner", runs, stop_all_s, log, listings, stop_errors=stop_errors)
    return {
        **share_figures(students, share, side, peak, after),
        "run_s": time.perf_counter() - started,
    }


def _hub_env(inventory: Path) -> dict[str, Any]:
    """load_env's environment, typed as running_hub's keywords (its options are not str)."""
    return dict(load_env(inventory))


def share_books(
    hub: Hub, share: int, told: Mapping[str, Iterable[str]] | None = None
) -> dict[str, Any]:
    """What the fabric and the ledger say of the split GPUs now; with ``told`` (server →
    the devices it was told), the GPUs named to more servers than a GPU has slots."""
    view = fabric_view(hub)
    ledger = Ledger(hub.ledger_url())
    try:
        split = ledger.holds().split
        machines = ledger.live_machines()
        held = [block for block in ledger.holders() if not block.endswith("-block")]
    finally:
        ledger.close()
    attached = view.holders_by_block  # block → the hosts it is attached to
    hosts_of = Counter(m.host_id or "" for m in machines for _ in m.shared)
    named = Counter(d for devices in (told or {}).values() for d in devices)
    misplaced = {block for block, gpu in split.items() if attached.get(block) != [gpu.host_id]}
    misplaced |= {
        block
        for m in machines
        for block in m.shared
        if block in split and m.host_id != split[block].host_id
    }
    return {
        "holders": sum(gpu.holders for gpu in split.values()),
        "machines": len(machines),
        "gpus_attached": len(attached),
        "gpus_split": len(split),
        "gpus_held_whole": len(held),
        "over_held": sorted(
            {b for b, gpu in split.items() if gpu.holders > gpu.size}
            | {b for b, n in named.items() if n > share}
        ),
        "misplaced": sorted(misplaced),
        "servers_told": len(told or {}),
        "servers_told_not_one_gpu": sum(len(list(d)) != 1 for d in (told or {}).values()),
        "holders_by_host": dict(sorted(hosts_of.items())),
        "split_by_host": dict(sorted(Counter(g.host_id for g in split.values()).items())),
        **_holder_check(hub),
    }


def _holder_check(hub: Hub) -> dict[str, Any]:
    """The storms' own check, without the servers' devices (a share is named to several)."""
    check = check_holders(hub)
    return {"double_holders": check.double_holders, "over_capacity": check.over_capacity}


SHARE_GATED = (
    "share_not_started",
    "share_failures",
    "share_extra_gpus",
    "share_holders_missing",
    "share_over_held",
    "share_misplaced",
    "share_double_holders",
    "share_hosts_over_capacity",
    "share_leaked_gpus",
)


def share_figures(
    students: int, share: int, side: Side, peak: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """One share storm's figures; those in SHARE_GATED count what went wrong (0 is right)."""
    summary = side.summary()
    needed = math.ceil(peak["holders"] / share)
    leaked = after["gpus_attached"] + after["gpus_split"] + after["gpus_held_whole"]
    return {
        "students": students,
        "share": share,
        "started": summary["ready"],
        "peak_holders": peak["holders"],
        "peak_gpus_attached": peak["gpus_attached"],
        "peak_gpus_needed": needed,
        "share_not_started": students - summary["ready"],
        "share_failures": side.failures,
        # attached beyond (or short of) ⌈holders/size⌉: shares not packed (or lost)
        "share_extra_gpus": abs(peak["gpus_attached"] - needed),
        "share_holders_missing": max(0, summary["ready"] - peak["holders"]),
        "share_over_held": len(peak["over_held"]),
        "share_misplaced": len(peak["misplaced"]) + peak["servers_told_not_one_gpu"],
        "share_double_holders": len(set(peak["double_holders"]) | set(after["double_holders"])),
        "share_hosts_over_capacity": len(set(peak["over_capacity"]) | set(after["over_capacity"])),
        "share_leaked_gpus": leaked,
        "peak": peak,
        "after": after,
        "compose": summary,
    }


def shares_result(size: FabricSize, per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the share variant's rounds: the gated counts as totals, each round kept."""
    return {
        "students": per_round[0]["students"],
        "share": per_round[0]["share"],
        "rounds": len(per_round),
        "fabric": {"zones": size.zones, "hosts": size.hosts, "gpus": size.gpus},
        **{figure: sum(r[figure] for r in per_round) for figure in SHARE_GATED},
        "peak_holders": min(r["peak_holders"] for r in per_round),
        "peak_gpus_attached": max(r["peak_gpus_attached"] for r in per_round),
        "p95_s": max(r["compose"]["p95_s"] for r in per_round),
        "p95_ratio": statistics.median(r["p95_ratio"] for r in per_round),  # not gated
        "stock_failures": sum(r["stock"]["failures"] for r in per_round),
        "per_round": per_round,
    }


def print_shares(r: dict[str, Any]) -> None:
    print(
        f"share variant: {r['students']} students, 1/{r['share']} of a T4 each, on"
        f" {r['fabric']['hosts']} hosts and {r['fabric']['gpus']} T4s, {r['rounds']} round(s)"
    )
    for n, one in enumerate(r["per_round"], 1):
        print(
            f"{n}: started {one['started']}, p50 {one['compose']['p50_s']:.2f} s,"
            f" p95 {one['compose']['p95_s']:.2f} s; at the peak {one['peak_holders']} holders"
            f" on {one['peak_gpus_attached']} T4s attached (need {one['peak_gpus_needed']});"
            f" stop all {one['compose']['stop_all_s']:.1f} s; run {one['run_s']:.0f} s;"
            f" stock p95 {one['stock']['p95_s']:.2f} s (ratio {one['p95_ratio']:.2f})"
        )
    print(", ".join(f"{figure} {r[figure]}" for figure in SHARE_GATED))


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv or [])
    if not args.shares_only:
        run_class(args)
    if args.shares_only or not args.no_shares:
        size = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=args.share_gpus_per_rack)
        per_round = [
            share_round(args.share_students, size, n, args.logs and args.logs / f"shares{n + 1}")
            for n in range(args.share_rounds)
        ]
        report = shares_result(size, per_round)
        write_result(args.shares_out, report)
        print_shares(report)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.course_storm")
    parser.add_argument("--students", type=int, default=STUDENTS)
    parser.add_argument("--with-gpu", type=int, default=WITH_GPU, help="students with a T4")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=RESULTS / "course_storm.json")
    parser.add_argument("--logs", type=Path, help="a folder to keep the hubs' logs in")
    parser.add_argument(
        "--no-ssh", action="store_true", help="leave out the compose-ssh side (bare hosts)"
    )
    shares = parser.add_mutually_exclusive_group()
    shares.add_argument("--no-shares", action="store_true", help="leave out the share variant")
    shares.add_argument("--shares-only", action="store_true", help="run the share variant alone")
    parser.add_argument("--share-students", type=int, default=SHARE_STUDENTS)
    parser.add_argument(
        "--share-gpus-per-rack", type=int, default=SHARE_FABRIC.gpus_per_zone, help="T4s a rack"
    )
    parser.add_argument("--share-rounds", type=int, default=1)
    parser.add_argument("--shares-out", type=Path, default=RESULTS / "course_storm_shares.json")
    return parser


def run_class(args: argparse.Namespace) -> None:
    """The class of whole T4s and CPU-only servers, every side, every round."""
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
    interrupt_on_sigterm()
    main(sys.argv[1:])
