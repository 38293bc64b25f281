"""Claims per second on PostgreSQL: the ledger's real claim transaction, 1 to 32 connections.

What a campus-sized ledger must sustain at a class start (docs/scale.md). Each
connection is a process with its own :class:`Ledger` (its own engine and
PostgreSQL session), as hubs and their worker threads are. It loops over the
life of a machine: ``request_machine`` (insert), ``claim`` (the transaction
that locks the user's quota row and the devices, checks ownership, quota and
GPU-hours, and takes a host and one GPU), then ``stopping`` and ``release``
(which frees them and writes the usage record). Claims per second counts
claims completed while the whole cycle runs, so it is a machine-lifecycle
rate; a claim's own time is reported as p50 and p95. Each connection works on
its own slice of the pool, as placement spreads concurrent spawns over free
hosts: collisions (``DevicesTaken``) are counted, not hidden.

The pool: 4,000 GPUs on 4,000 hosts in 40 racks, synced into a scratch
database on 127.0.0.1:5432 (dropped afterwards), and SQLite (WAL) at one
connection for reference. ``python -m benchmarks ledger_claims``
(``--seconds``, ``--connections 1 8 32``). Writes benchmarks/results/ledger_claims.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.hubload import RESULTS, percentile, write_result
from benchmarks.interrupt import interrupt_on_sigterm
from composespawner.ledger import DevicesTaken, Ledger
from composespawner.ledger.records import DeviceRecord
from harness.postgres import connectable_admin_engine, scratch_database

RACKS = 40
HOSTS_PER_RACK = 100
CONNECTIONS = (1, 8, 32)
SECONDS = 10.0


@dataclass
class Worker:
    claims: list[float] = field(default_factory=list)  # seconds each claim took
    collisions: int = 0


def pool() -> list[DeviceRecord]:
    devices = []
    for rack in range(RACKS):
        zone = f"rack-{rack:02d}"
        for host in range(HOSTS_PER_RACK):
            name = f"{zone}-h{host:03d}"
            devices.append(
                DeviceRecord(f"{name}-block", "host", "64 CPUs", frozenset({zone}), zone)
            )
            devices.append(DeviceRecord(f"{name}-gpu", "gpu", "A100", frozenset({zone}), zone))
    return devices


def run_connections(url: str, connections: int, seconds: float) -> dict[str, Any]:
    """``connections`` processes (each a session of its own, no shared GIL) for ``seconds``."""
    hosts = sorted(d.block_id.removesuffix("-block") for d in pool() if d.kind == "host")
    context = multiprocessing.get_context("fork")  # no engine is open in this process now
    start = context.Barrier(connections + 1)
    results = context.Queue()
    workers = [
        context.Process(target=work, args=(url, n, hosts[n::connections], start, seconds, results))
        for n in range(connections)
    ]
    for worker in workers:
        worker.start()
    start.wait(timeout=120)
    began = time.monotonic()
    done: list[Worker] = [results.get(timeout=seconds + 120) for _ in workers]
    elapsed = time.monotonic() - began
    for worker in workers:
        worker.join(timeout=30)
    claims = [t for w in done for t in w.claims]
    return {
        "connections": connections,
        "claims_per_s": len(claims) / elapsed,
        "claim_p50_ms": statistics.median(claims) * 1000,
        "claim_p95_ms": percentile(claims, 95) * 1000,
        "collisions": sum(w.collisions for w in done),
    }


def work(url: str, n: int, mine: list[str], start: Any, seconds: float, results: Any) -> None:
    """One connection: machines' lives on its slice of hosts until the time is up."""
    ledger = Ledger(url, timeout=30.0)
    worker = Worker()
    try:
        ledger.machine("warm-up")  # the connection is made before the clock starts
        start.wait(timeout=120)
        stop_at = time.monotonic() + seconds
        i = 0
        while time.monotonic() < stop_at:
            name = mine[i % len(mine)]
            i += 1
            machine = ledger.request_machine(f"user-{n}-{i}", "", {"gpu_count": 1})
            began = time.perf_counter()
            try:
                ledger.claim(
                    machine,
                    host_id=name,
                    zone=name[:7],
                    block_ids=[f"{name}-gpu"],
                    host_block=f"{name}-block",
                )
            except DevicesTaken:
                worker.collisions += 1
                ledger.release(machine, to="failed", failure="taken")
                continue
            worker.claims.append(time.perf_counter() - began)
            ledger.transition(machine, "stopping", "benchmark")
            ledger.release(machine)
    finally:
        ledger.close()
        results.put(worker)


def stocked(url: str) -> None:
    ledger = Ledger(url)
    try:
        ledger.upgrade()
        ledger.sync_devices(pool())
    finally:
        ledger.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ledger_claims")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="per connection count")
    parser.add_argument("--connections", type=int, nargs="+", default=list(CONNECTIONS))
    parser.add_argument("--out", type=Path, default=RESULTS / "ledger_claims.json")
    args = parser.parse_args(argv or [])
    rows: list[dict[str, Any]] = []
    server = connectable_admin_engine()
    try:
        for connections in args.connections:
            with scratch_database(server) as url:  # a fresh database each: no bloat carried
                stocked(url)
                rows.append(
                    {"backend": "postgresql", **run_connections(url, connections, args.seconds)}
                )
    finally:
        server[0].dispose()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledger.sqlite'}"
        stocked(url)
        rows.append({"backend": "sqlite", **run_connections(url, 1, args.seconds)})
    write_result(
        args.out, {"seconds": args.seconds, "pool_gpus": RACKS * HOSTS_PER_RACK, "rows": rows}
    )
    print("ledger claims: the real claim transaction, each connection its own session")
    print(f"{'backend':<11} {'conns':>5} {'claims/s':>9} {'p50 ms':>7} {'p95 ms':>7}")
    for r in rows:
        print(
            f"{r['backend']:<11} {r['connections']:>5} {r['claims_per_s']:>9.0f}"
            f" {r['claim_p50_ms']:>7.1f} {r['claim_p95_ms']:>7.1f}"
            f"  collisions {r['collisions']}"
        )


if __name__ == "__main__":
    interrupt_on_sigterm()
    main(sys.argv[1:])
