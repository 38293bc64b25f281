"""A spawn storm: N users (200) start servers at once, composespawner versus the stock spawner.

Both sides run in one go, each on its own fresh demo hub (configurable-http-proxy,
the fabric simulator as a hub-managed service, the reconciler and culler) with
the stand-in notebook of :mod:`benchmarks.standin_notebook`; the stock side swaps
in JupyterHub's SimpleLocalProcessSpawner. The simulator serves a generated
fabric of shared hosts, eight servers a host (25 hosts of 64 cores and 512 GiB
in 5 racks, and a quarter more T4s than users: 250 for 200), so every request
fits; each server gets the catalog's default size for one GPU (4 cores, 32 GiB),
so machines pack onto hosts our hub already composed.

Per user: the time from its POST /users/<u>/server (``{"gpu_model": "t4",
"gpu_count": 1, ...}``) to the hub's "ready" event on the spawn's progress
stream (/users/<u>/server/progress, which the spawn-pending page follows in a
browser), or to a 201 when the hub answered only once the server was up.
Event streams cost the hub little while it works; polling readiness instead
(an admin listing of 200 users took about 130 ms of the hub's single thread
under load) slowed the very spawns it timed. Then every server is stopped at
once, and an admin listing every 0.2 s waits until none is left.

The hub's ``concurrent_spawn_limit`` is raised to the number of users on both
sides (``--spawn-limit`` to change it): at the default of 100 half the storm gets
429 with a 30-60 s Retry-After, and p95 would measure that advice, not the
spawner. 429s are still counted, and a 429 is retried after its Retry-After.

For composespawner, at the peak (every server up) and again once all have
stopped: ``double_holders`` counts devices attached to two hosts, attached to a
host other than that of the ledger machine holding them, or listed in two
servers' COMPOSE_DEVICE_IDS; ``leaked_devices`` counts devices still attached on
the fabric or held in the ledger after every server stopped.

With ``--kubernetes`` (``python -m benchmarks spawn_storm_kubernetes``) notebooks
are pods: ``compose-kubernetes`` against stock KubeSpawner, 100 users, both on
one real kube-apiserver with the tests' process kubelet serving every simulated
host as a node (it spreads stock KubeSpawner's pods, which name no node, over
them). The stand-in notebook runs as each pod's process; what servers were told
is read from their pods' environment. Writes spawn_storm_kubernetes.json.

``python -m benchmarks spawn_storm`` or ``python -m benchmarks.spawn_storm --users 20``.
Writes benchmarks/results/spawn_storm.json (a smoke run with ``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from benchmarks.hubload import (
    RESULTS,
    STOCK_SPAWNER_CONFIG,
    FabricSize,
    HolderCheck,
    active_servers,
    api_session,
    check_holders,
    create_users,
    fabric_for,
    host_ids,
    hub_log_problems,
    inventory_toml,
    keep_log,
    load_config,
    load_env,
    percentile,
    ratio,
    shared_fabric_for,
    wait_released,
    write_result,
)
from harness.hub import Hub, process_env, running_hub
from harness.kube import (
    KubeApiServer,
    catalog_with_pushed_images,
    kube_apiserver,
    kubespawner_config,
)
from harness.kubelet import running_nodes

USERS = 200
KUBERNETES_USERS = 100
ROUNDS = 5  # single rounds swung ±25% here (stock alone 16-23 s); 3 were not enough
OPTIONS: dict[str, Any] = {"gpu_model": "t4", "gpu_count": 1, "network": "shared", "scratch_gb": 0}
POLL_EVERY = 0.2
STORM_DEADLINE = 600.0  # seconds for all spawns, and again for all stops


@dataclass
class UserRun:
    user: str
    options: dict[str, Any] = field(default_factory=lambda: dict(OPTIONS))  # user_options
    posted: float = 0.0  # perf_counter of the first POST
    answered: float | None = None  # when the POST was accepted (201/202)
    ready: float | None = None  # the listing that first showed it ready
    stop_sent: float | None = None
    gone: float | None = None
    throttled: int = 0  # 429 answers
    error: str | None = None

    @property
    def ready_s(self) -> float | None:
        return None if self.ready is None else self.ready - self.posted


@dataclass
class Side:
    spawner: str
    runs: list[UserRun]
    stop_all_s: float
    hub_log: dict[str, int]
    listings: list[float]  # seconds each admin listing took while waiting for the stops
    peak: HolderCheck | None = None
    after: HolderCheck | None = None
    stop_errors: list[str] = field(default_factory=list)

    @property
    def ready_times(self) -> list[float]:
        return sorted(r.ready_s for r in self.runs if r.ready_s is not None)

    @property
    def failures(self) -> int:
        return sum(r.error is not None for r in self.runs)

    @property
    def http_429(self) -> int:
        return sum(r.throttled for r in self.runs)

    def summary(self) -> dict[str, Any]:
        times = self.ready_times
        stops = [r.gone - r.stop_sent for r in self.runs if r.gone and r.stop_sent]
        reasons = Counter((r.error or "")[:160] for r in self.runs if r.error)
        return {
            "ready": len(times),
            "failures": self.failures,
            "http_429": self.http_429,
            "p50_s": percentile(times, 50),
            "p95_s": percentile(times, 95),
            "max_s": max(times, default=float("nan")),
            "stop_p50_s": percentile(stops, 50),
            "stop_p95_s": percentile(stops, 95),
            "stop_all_s": self.stop_all_s,
            "failure_reasons": dict(reasons.most_common(5)),
            "stop_errors": self.stop_errors[:5],
            "hub_log": self.hub_log,
            "stop_listing_p50_ms": 1000 * percentile(self.listings, 50),
            "stop_listing_p95_ms": 1000 * percentile(self.listings, 95),
            "stop_listings": len(self.listings),
        }


# -- one storm ----------------------------------------------------------------------


def run_side(
    users: int,
    *,
    stock: bool,
    spawn_limit: int,
    size: FabricSize,
    logs: Path | None = None,
    cluster: KubeApiServer | None = None,
    options: Callable[[int], dict[str, Any]] | None = None,
    name_as: str = "spawn_storm",
) -> Side:
    """One storm on a fresh hub; with ``cluster``, notebooks are pods on it. ``options``:
    user number → what that user asks for (default: one T4)."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        inventory = tmp / "bench_inventory.toml"
        inventory.write_text(inventory_toml(size))
        config = load_config(spawn_limit=spawn_limit, page_limit=users)
        env = load_env(inventory)
        if cluster is not None:
            config += kubespawner_config(
                "kubespawner.KubeSpawner" if stock else "compose-kubernetes",
                catalog_with_pushed_images(tmp),
            )
            env["KUBECONFIG"] = str(cluster.kubeconfig)
            name = "KubeSpawner" if stock else "ComposeKubeSpawner"
        else:
            config += STOCK_SPAWNER_CONFIG if stock else ""
            name = "SimpleLocalProcessSpawner" if stock else "ComposeSpawner"
        with (
            running_hub(tmp, config, **env) as hub,
            api_session(users + 1) as session,
        ):
            names = [f"storm{i:04d}" for i in range(users)]
            create_users(hub, names)
            runs = [
                UserRun(name, options(i)) if options else UserRun(name)
                for i, name in enumerate(names)
            ]
            start_all(hub, session, runs)
            peak = None
            if not stock:
                told = pod_devices(cluster) if cluster else server_devices(hub, session, users)
                peak = check_holders(hub, told)
            stop_all_s, stop_errors, listings = stop_all(hub, session, runs)
            if not stock:
                wait_released(hub)
            after = None if stock else check_holders(hub)
            log = hub_log_problems(hub)
        if cluster is not None:
            wait_no_pods(cluster)
        keep_log(hub, logs, f"{name_as}-{name}.log")
    return Side(name, runs, stop_all_s, log, listings, peak, after, stop_errors)


def start_all(hub: Hub, session: requests.Session, runs: list[UserRun]) -> None:
    """Every user POSTs at once and follows its spawn's progress to ready or failed."""
    barrier = threading.Barrier(len(runs))
    with ThreadPoolExecutor(len(runs)) as pool:
        for run in runs:
            pool.submit(spawn_and_follow, hub, session, run, barrier)


def spawn_and_follow(
    hub: Hub, session: requests.Session, run: UserRun, barrier: threading.Barrier
) -> None:
    barrier.wait()
    run.posted = time.perf_counter()
    try:
        response = post_spawn(hub, session, run)
        if response.status_code == 201:  # the hub waited for it: ready now
            run.answered = run.ready = time.perf_counter()
        elif response.status_code == 202:
            run.answered = time.perf_counter()
            follow_progress(hub, session, run)
        else:
            run.error = f"POST {response.status_code}: {response.text[:300]}"
    except requests.RequestException as e:
        run.error = f"request failed: {e!r}"


def post_spawn(hub: Hub, session: requests.Session, run: UserRun) -> requests.Response:
    url = f"{hub.url}/hub/api/users/{run.user}/server"
    while True:
        response = session.post(url, json={"user_options": run.options}, timeout=180)
        if response.status_code != 429:
            return response
        run.throttled += 1
        # The hub's own advice (30-60 s by default): what a polite client does.
        time.sleep(float(response.headers.get("Retry-After", "30")))


def follow_progress(hub: Hub, session: requests.Session, run: UserRun) -> None:
    """Read the spawn's event stream, as the spawn-pending page does, to its last event."""
    url = f"{hub.url}/hub/api/users/{run.user}/server/progress"
    # The hub writes a keepalive every few seconds, so a read waits far less than this.
    with session.get(url, stream=True, timeout=(30, 180)) as response:
        if response.status_code != 200:
            run.error = f"progress {response.status_code}: {response.text[:300]}"
            return
        for line in response.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event.get("ready"):
                run.ready = time.perf_counter()
                return
            if event.get("failed"):
                run.error = str(event.get("message", "spawn failed"))[:300]
                return
    run.error = "progress stream ended without ready or failed"


def watch_stops(hub: Hub, session: requests.Session, runs: list[UserRun]) -> list[float]:
    """Poll the hub's active servers until every stopped server is gone.

    Returns how long each listing took: the benchmark's own load on the hub.
    """
    deadline = time.monotonic() + STORM_DEADLINE
    listings: list[float] = []
    while time.monotonic() < deadline:
        asked = time.perf_counter()
        servers = active_servers(hub, session, len(runs))
        seen = time.perf_counter()
        listings.append(seen - asked)
        for run in runs:
            if run.gone is None and run.stop_sent is not None and run.user not in servers:
                run.gone = seen
        if all(run.gone is not None or run.stop_sent is None for run in runs):
            return listings
        time.sleep(POLL_EVERY)  # the next listing, not a stand-in for an event
    return listings


def server_devices(hub: Hub, session: requests.Session, users: int) -> dict[str, list[str]]:
    """user → the devices their notebook was told it has (COMPOSE_DEVICE_IDS)."""
    told = {}
    for user, server in active_servers(hub, session, users).items():
        pid = server.get("state", {}).get("pid")
        if pid:
            try:
                env = process_env(int(pid))
            except FileNotFoundError:
                continue  # it exited since the listing: its devices are being given back
            told[user] = [d for d in env.get("COMPOSE_DEVICE_IDS", "").split(",") if d]
    return told


def pod_devices(cluster: KubeApiServer) -> dict[str, list[str]]:
    """user → the devices their pod was told it has (COMPOSE_DEVICE_IDS in its spec)."""
    pods = cluster.request("GET", "/api/v1/namespaces/default/pods", timeout=60)
    pods.raise_for_status()
    told = {}
    for pod in pods.json()["items"]:
        env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
        user = pod["metadata"]["labels"].get("hub.jupyter.org/username", "")
        told[user] = [d for d in env.get("COMPOSE_DEVICE_IDS", "").split(",") if d]
    return told


def wait_no_pods(cluster: KubeApiServer) -> None:
    """Until the last pod is gone: the next side starts on an empty cluster."""
    deadline = time.monotonic() + STORM_DEADLINE
    while time.monotonic() < deadline:
        pods = cluster.request("GET", "/api/v1/namespaces/default/pods", timeout=60)
        if pods.ok and not pods.json()["items"]:
            return
        time.sleep(POLL_EVERY)  # polling the cluster, bounded by the deadline
    raise RuntimeError("pods of the last storm are still there")


def stop_all(
    hub: Hub, session: requests.Session, runs: list[UserRun]
) -> tuple[float, list[str], list[float]]:
    """DELETE every server that exists at once; seconds until none is left, and errors."""
    existing = set(active_servers(hub, session, len(runs)))
    stopping = [run for run in runs if run.user in existing]
    errors: list[str] = []
    listings: list[float] = []
    started = time.perf_counter()
    if stopping:
        barrier = threading.Barrier(len(stopping))
        with ThreadPoolExecutor(len(stopping)) as pool:
            for run in stopping:
                pool.submit(delete_server, hub, session, run, barrier, errors)
            listings = watch_stops(hub, session, runs)
    errors += [f"{r.user}: not gone within {STORM_DEADLINE:g} s" for r in stopping if not r.gone]
    return time.perf_counter() - started, errors, listings


def delete_server(
    hub: Hub,
    session: requests.Session,
    run: UserRun,
    barrier: threading.Barrier,
    errors: list[str],
) -> None:
    barrier.wait()
    run.stop_sent = time.perf_counter()
    try:
        response = session.delete(f"{hub.url}/hub/api/users/{run.user}/server", timeout=180)
    except requests.RequestException as e:
        errors.append(f"{run.user}: DELETE failed: {e!r}")
        return
    if response.status_code not in (202, 204):
        errors.append(f"{run.user}: DELETE {response.status_code}: {response.text[:200]}")


# -- the report ----------------------------------------------------------------------


def result(users: int, spawn_limit: int, size: FabricSize, rounds: list[Round]) -> dict[str, Any]:
    """Ratios are medians over rounds; failures, 429s, double holders and leaks are totals."""
    per_round = [round_.summary() for round_ in rounds]
    middle = sorted(per_round, key=lambda r: r["p95_ratio"])[len(per_round) // 2]
    return {
        "users": users,
        "spawn_limit": spawn_limit,
        "rounds": len(rounds),
        "fabric": {"zones": size.zones, "hosts": size.hosts, "gpus": size.gpus},
        "p50_ratio": statistics.median(r["p50_ratio"] for r in per_round),
        "p95_ratio": statistics.median(r["p95_ratio"] for r in per_round),
        "failures": sum(r["failures"] for r in per_round),
        "http_429": sum(r["http_429"] for r in per_round),
        "double_holders": sum(r["double_holders"] for r in per_round),
        "leaked_devices": sum(r["leaked_devices"] for r in per_round),
        "stock_failures": sum(r["stock_failures"] for r in per_round),
        "stock_http_429": sum(r["stock_http_429"] for r in per_round),
        "peak_live_machines": min(r["peak_live_machines"] for r in per_round),
        "peak_hosts_composed": max(r["peak_hosts_composed"] for r in per_round),
        "hosts_over_capacity": sum(r["hosts_over_capacity"] for r in per_round),
        "compose": middle["compose"],
        "stock": middle["stock"],
        "per_round": per_round,
    }


@dataclass
class Round:
    """One storm on each side, run back to back."""

    ours: Side
    stock: Side

    def summary(self) -> dict[str, Any]:
        mine, theirs = self.ours.summary(), self.stock.summary()
        peak = self.ours.peak or HolderCheck()
        after = self.ours.after or HolderCheck()
        leaked = set(after.ledger_held) | set(after.fabric_attached)
        doubled = set(peak.double_holders) | set(after.double_holders)
        return {
            "p50_ratio": ratio(mine["p50_s"], theirs["p50_s"]),
            "p95_ratio": ratio(mine["p95_s"], theirs["p95_s"]),
            "failures": self.ours.failures,
            "http_429": self.ours.http_429,
            "double_holders": len(doubled),
            "leaked_devices": len(leaked),
            "stock_failures": self.stock.failures,
            "stock_http_429": self.stock.http_429,
            "peak_live_machines": peak.live_machines,
            "peak_hosts_composed": len(peak.tagged_hosts),
            "hosts_over_capacity": len(set(peak.over_capacity) | set(after.over_capacity)),
            "leaked_hosts": after.tagged_hosts,
            "leaked_device_ids": sorted(leaked)[:20],
            "double_holder_ids": sorted(doubled)[:20],
            "compose": mine,
            "stock": theirs,
        }


def print_table(r: dict[str, Any]) -> None:
    print(
        f"spawn storm: {r['users']} users at once, concurrent_spawn_limit {r['spawn_limit']},"
        f" {r['rounds']} rounds (sides alternate which goes first)"
    )
    print(f"{'':28}{'ready':>7}{'fail':>6}{'429':>6}{'p50 s':>8}{'p95 s':>8}{'stop all s':>12}")
    for n, one in enumerate(r["per_round"], 1):
        for label, side in (
            (f"{n}: composespawner", one["compose"]),
            (f"{n}: stock", one["stock"]),
        ):
            print(
                f"{label:28}{side['ready']:>7}{side['failures']:>6}{side['http_429']:>6}"
                f"{side['p50_s']:>8.2f}{side['p95_s']:>8.2f}{side['stop_all_s']:>12.1f}"
            )
        print(f"{f'{n}: ratio':28}{'':19}{one['p50_ratio']:>8.2f}{one['p95_ratio']:>8.2f}")
    print(f"{'median ratio':28}{'':19}{r['p50_ratio']:>8.2f}{r['p95_ratio']:>8.2f}")
    print(
        f"failures {r['failures']}, 429s {r['http_429']}, double holders {r['double_holders']},"
        f" leaked devices {r['leaked_devices']}, hosts over capacity {r['hosts_over_capacity']},"
        f" peak hosts composed {r['peak_hosts_composed']} of {r['fabric']['hosts']}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spawn_storm")
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="notebooks as pods: compose-kubernetes against stock KubeSpawner",
    )
    parser.add_argument("--users", type=int, help=f"default {USERS} ({KUBERNETES_USERS} on pods)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="storms per side (default 5)")
    parser.add_argument("--spawn-limit", type=int, help="concurrent_spawn_limit (default: users)")
    parser.add_argument(
        "--out", type=Path, help="default benchmarks/results/spawn_storm[_kubernetes].json"
    )
    parser.add_argument("--logs", type=Path, help="a folder to keep the hubs' logs in")
    args = parser.parse_args(argv or [])
    users = args.users or (KUBERNETES_USERS if args.kubernetes else USERS)
    out = args.out or RESULTS / (
        "spawn_storm_kubernetes.json" if args.kubernetes else "spawn_storm.json"
    )
    spawn_limit = users if args.spawn_limit is None else args.spawn_limit
    size = fabric_for(users) if args.kubernetes else shared_fabric_for(users)
    with contextlib.ExitStack() as stack:
        cluster = None
        if args.kubernetes:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            cluster = stack.enter_context(kube_apiserver(folder / "kube"))
            stack.enter_context(running_nodes(cluster, host_ids(size), folder / "kubelet"))
        rounds = []
        for n in range(args.rounds):
            # Alternate which side goes first, so drift in the machine's state over
            # the run (page cache, disk, other load) does not favour one side.
            order = (False, True) if n % 2 == 0 else (True, False)
            sides = {
                stock: run_side(
                    users,
                    stock=stock,
                    spawn_limit=spawn_limit,
                    size=size,
                    logs=args.logs and args.logs / f"round{n + 1}",
                    cluster=cluster,
                )
                for stock in order
            }
            rounds.append(Round(ours=sides[False], stock=sides[True]))
    report = result(users, spawn_limit, size, rounds)
    report["platform"] = "kubernetes" if args.kubernetes else "local processes"
    write_result(out, report)
    print_table(report)


if __name__ == "__main__":
    main(sys.argv[1:])
