"""From stop to devices free: composespawner's release, beside the stock spawner's stop.

One user spawns a machine (2 × T4, a 25 Gb/s card and 1920 GB of scratch: four
devices), waits until it is ready, then stops it; 50 times. For each stop the
clock starts just before DELETE /users/<u>/server and two things are polled
every 20 ms: the host's ComputerSystem on the fabric simulator's Redfish tree
(until none of the machine's devices is attached and each block is back to
``Unused``), and the hub (until the server is gone, which for composespawner
also means the ledger has freed the devices). The stock side runs the same loop
with JupyterHub's SimpleLocalProcessSpawner and only the second clock.

Both sides use the stand-in notebook of :mod:`benchmarks.standin_notebook`, on
a fresh demo hub each, whose simulator serves a generated fabric of ``--zones``
racks of 4 hosts, 4 T4s, 4 NICs and 6 NVMe drives (2 by default, the demo's
size). composespawner reads the whole fabric on every release; one stop at a
time, 25 racks measured the same as 2, but under a storm those reads queue
(see spawn_storm).

``python -m benchmarks release_latency`` or ``python -m benchmarks.release_latency --stops 5``.
Writes benchmarks/results/release_latency.json (a smoke run with ``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.hubload import (
    RESULTS,
    STOCK_SPAWNER_CONFIG,
    FabricSize,
    check_holders,
    create_users,
    hub_log_problems,
    inventory_toml,
    keep_log,
    load_config,
    load_env,
    percentile,
    ratio,
    write_result,
)
from benchmarks.interrupt import interrupt_on_sigterm
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for

STOPS = 50
USER = "release-bench"
OPTIONS: dict[str, Any] = {"gpu_model": "t4", "gpu_count": 2, "network": "25g", "scratch_gb": 1920}
POLL_EVERY = 0.02
STOP_DEADLINE = 120.0


@dataclass
class Stop:
    devices: list[str]  # what the notebook was told it has (empty on the stock side)
    devices_free_s: float | None = None
    gone_s: float | None = None


@dataclass
class Side:
    spawner: str
    stops: list[Stop] = field(default_factory=list)
    hub_log: dict[str, int] = field(default_factory=dict)
    leaked_devices: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        free = [s.devices_free_s for s in self.stops if s.devices_free_s is not None]
        gone = [s.gone_s for s in self.stops if s.gone_s is not None]
        return {
            "n": len(self.stops),
            "devices_free_p50_s": percentile(free, 50),
            "devices_free_p95_s": percentile(free, 95),
            "gone_p50_s": percentile(gone, 50),
            "gone_p95_s": percentile(gone, 95),
            "gone_max_s": max(gone, default=float("nan")),
            "leaked_devices": self.leaked_devices,
            "hub_log": self.hub_log,
        }


def fabric(zones: int) -> FabricSize:
    return FabricSize(
        zones=zones, hosts_per_zone=4, gpus_per_zone=4, nics_per_zone=4, drives_per_zone=6
    )


def run_side(stops: int, *, stock: bool, size: FabricSize, logs: Path | None = None) -> Side:
    side = Side("SimpleLocalProcessSpawner" if stock else "ComposeSpawner")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        inventory = tmp / "bench_inventory.toml"
        inventory.write_text(inventory_toml(size))
        config = load_config(spawn_limit=100, page_limit=1)
        if stock:
            config += STOCK_SPAWNER_CONFIG
        with running_hub(tmp, config, **load_env(inventory)) as hub:
            create_users(hub, [USER])
            for _ in range(stops):
                side.stops.append(spawn_and_stop(hub, stock))
            if not stock:
                after = check_holders(hub)
                side.leaked_devices = sorted(set(after.ledger_held) | set(after.fabric_attached))
            side.hub_log = hub_log_problems(hub)
            keep_log(hub, logs, f"release_latency-{side.spawner}.log")
    return side


def spawn_and_stop(hub: Hub, stock: bool) -> Stop:
    response = hub.spawn(USER, OPTIONS)
    if response.status_code not in (201, 202):
        raise RuntimeError(f"spawn refused: {response.status_code} {response.text}")
    hub.wait_ready(USER)
    host, devices = "", []
    if not stock:
        env = process_env(notebook_pid(hub, USER))
        host, devices = env["COMPOSE_HOST"], env["COMPOSE_DEVICE_IDS"].split(",")
        assert set(devices) <= set(hub.attached(host)), "the machine is not composed"
    stop = Stop(devices)
    started = time.perf_counter()
    response = hub.request("DELETE", f"/users/{USER}/server")
    if response.status_code not in (202, 204):
        raise RuntimeError(f"stop refused: {response.status_code} {response.text}")
    checks: dict[str, Callable[[], bool]] = {}
    if not stock:  # first: the fabric frees the devices before the hub forgets the server
        checks["devices_free"] = lambda: not set(devices) & set(hub.attached(host))
    checks["gone"] = lambda: hub.server(USER) is None
    seen = poll_until_all(checks, started)
    stop.gone_s, stop.devices_free_s = seen["gone"], seen.get("devices_free")
    if not stock:
        unused = {d: hub.block_state(d) for d in devices}
        assert set(unused.values()) == {"Unused"}, f"detached but not free: {unused}"
        # The next spawn must not race this machine's last ledger write.
        wait_for(lambda: not check_holders(hub).ledger_held, 30, "the ledger to free all")
    return stop


def poll_until_all(checks: dict[str, Callable[[], bool]], started: float) -> dict[str, float]:
    """Seconds from ``started`` until each check first held; fails at the deadline."""
    seen: dict[str, float] = {}
    while len(seen) < len(checks):
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.perf_counter() - started
        if time.perf_counter() - started > STOP_DEADLINE:
            raise AssertionError(f"not all of {sorted(checks)} within {STOP_DEADLINE:g} s")
        time.sleep(POLL_EVERY)  # the next look, not a stand-in for an event
    return seen


def result(size: FabricSize, ours: Side, stock: Side) -> dict[str, Any]:
    mine, theirs = ours.summary(), stock.summary()
    return {
        "n": mine["n"],
        "fabric": {"zones": size.zones, "hosts": size.hosts, "gpus": size.gpus},
        "devices_per_machine": 4,
        "p50_s": mine["devices_free_p50_s"],
        "p95_s": mine["devices_free_p95_s"],
        "stock_gone_p50_s": theirs["gone_p50_s"],
        "stock_gone_p95_s": theirs["gone_p95_s"],
        "p50_ratio": ratio(mine["devices_free_p50_s"], theirs["gone_p50_s"]),
        "p95_ratio": ratio(mine["devices_free_p95_s"], theirs["gone_p95_s"]),
        "gone_p50_ratio": ratio(mine["gone_p50_s"], theirs["gone_p50_s"]),
        "gone_p95_ratio": ratio(mine["gone_p95_s"], theirs["gone_p95_s"]),
        "leaked_devices": len(ours.leaked_devices),
        "compose": mine,
        "stock": theirs,
    }


def print_table(r: dict[str, Any]) -> None:
    ours, stock = r["compose"], r["stock"]
    print(f"release latency: {r['n']} stops, {r['devices_per_machine']} devices a machine")
    print(f"{'':34}{'p50 s':>8}{'p95 s':>8}")
    rows = (
        ("composespawner: stop → devices free", r["p50_s"], r["p95_s"]),
        ("composespawner: stop → server gone", ours["gone_p50_s"], ours["gone_p95_s"]),
        ("stock spawner: stop → server gone", stock["gone_p50_s"], stock["gone_p95_s"]),
        ("ratio (devices free / stock gone)", r["p50_ratio"], r["p95_ratio"]),
        ("ratio (gone / stock gone)", r["gone_p50_ratio"], r["gone_p95_ratio"]),
    )
    for label, p50, p95 in rows:
        print(f"{label:34}{p50:>8.3f}{p95:>8.3f}")
    print(f"leaked devices {r['leaked_devices']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.release_latency")
    parser.add_argument("--stops", type=int, default=STOPS)
    parser.add_argument("--zones", type=int, default=2, help="racks of 4 hosts in the fabric")
    parser.add_argument("--out", type=Path, default=RESULTS / "release_latency.json")
    parser.add_argument("--logs", type=Path, help="a folder to keep the hubs' logs in")
    args = parser.parse_args(argv or [])
    size = fabric(args.zones)
    ours = run_side(args.stops, stock=False, size=size, logs=args.logs)
    stock = run_side(args.stops, stock=True, size=size, logs=args.logs)
    report = result(size, ours, stock)
    write_result(args.out, report)
    print_table(report)


if __name__ == "__main__":
    interrupt_on_sigterm()
    main(sys.argv[1:])
