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
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from benchmarks.hubload import (
    HOST_CORES,
    HOST_MEMORY_GIB,
    RESULTS,
    STANDIN_COMMAND,
    STOCK_SPAWNER_CONFIG,
    FabricSize,
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
    shared_fabric_for,
    wait_released,
    write_result,
)
from benchmarks.interrupt import interrupt_on_sigterm
from benchmarks.storm_report import Round, Side, UserRun, print_table, result
from harness.hub import Hub, process_env, running_hub
from harness.kube import (
    KubeApiServer,
    catalog_with_pushed_images,
    kube_apiserver,
    kubespawner_config,
)
from harness.kubelet import running_nodes
from harness.sshhosts import SSHHosts, ssh_hosts

USERS = 200
KUBERNETES_USERS = 100
ROUNDS = 5  # single rounds swung ±25% here (stock alone 16-23 s); 3 were not enough
POLL_EVERY = 0.2
STORM_DEADLINE = 600.0  # seconds for all spawns, and again for all stops


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
    ssh: bool = False,
    spawner: tuple[str, str] | None = None,
) -> Side:
    """One storm on a fresh hub; with ``cluster``, notebooks are pods on it; with ``ssh``,
    processes on the simulated hosts, each a real sshd with the host agent (compose-ssh);
    with ``spawner`` (its name and hub config), whatever that config runs (containers).
    ``options``: user number → what that user asks for (default: one T4)."""
    names = [f"storm{i:04d}" for i in range(users)]
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as hosts_up:
        tmp = Path(tmp_name)
        inventory = tmp / "bench_inventory.toml"
        inventory.write_text(inventory_toml(size))
        config = load_config(spawn_limit=spawn_limit, page_limit=users)
        env = load_env(inventory)
        hosts = None
        if ssh:
            hosts = hosts_up.enter_context(
                ssh_hosts(
                    tmp,
                    host_ids(size),
                    cores=HOST_CORES,
                    memory_gib=HOST_MEMORY_GIB,
                    users=names,
                    notebook_command=STANDIN_COMMAND,
                )
            )
            config += hosts.hub_config()
            name = "ComposeSSHSpawner"
        elif cluster is not None:
            config += kubespawner_config(
                "kubespawner.KubeSpawner" if stock else "compose-kubernetes",
                catalog_with_pushed_images(tmp),
            )
            env["KUBECONFIG"] = str(cluster.kubeconfig)
            name = "KubeSpawner" if stock else "ComposeKubeSpawner"
        elif spawner is not None:
            name, spawner_config = spawner
            config += spawner_config
        else:
            config += STOCK_SPAWNER_CONFIG if stock else ""
            name = "SimpleLocalProcessSpawner" if stock else "ComposeSpawner"
        with (
            running_hub(tmp, config, **env) as hub,
            api_session(users + 1) as session,
        ):
            create_users(hub, names)
            runs = [
                UserRun(name, options(i)) if options else UserRun(name)
                for i, name in enumerate(names)
            ]
            start_all(hub, session, runs)
            peak = None
            if not stock:
                if hosts is not None:
                    told = agent_devices(hosts)
                elif cluster is not None:
                    told = pod_devices(cluster)
                else:
                    told = server_devices(hub, session, users)
                peak = check_holders(hub, told)
            traffic = ssh_traffic(hub) if hosts is not None else {}
            stop_all_s, stop_errors, listings = stop_all(hub, session, runs)
            if not stock:
                wait_released(hub)
            after = None if stock else check_holders(hub)
            log = hub_log_problems(hub)
        if cluster is not None:
            wait_no_pods(cluster)
        keep_log(hub, logs, f"{name_as}-{name}.log")
    return Side(name, runs, stop_all_s, log, listings, peak, after, stop_errors, traffic)


def ssh_traffic(hub: Hub) -> dict[str, float]:
    """The SSH connections and channels the hub has opened so far (its /hub/metrics)."""
    metrics = hub.api.get(f"{hub.url}/hub/metrics", timeout=30)
    metrics.raise_for_status()
    totals = {"ssh_connections": 0.0, "ssh_channels": 0.0}
    for line in metrics.text.splitlines():
        for figure, metric in (
            ("ssh_connections", "composespawner_ssh_connections_total"),
            ("ssh_channels", "composespawner_ssh_channels_total"),
        ):
            if line.startswith(metric):
                totals[figure] += float(line.rsplit(" ", 1)[1])
    return totals


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


def agent_devices(hosts: SSHHosts) -> dict[str, list[str]]:
    """user → the devices their notebook on a compute host was told it has, by its agent's
    record of the process (the hosts are on this machine)."""
    told = {}
    for record in hosts.all_records():
        try:
            env = process_env(int(record["pid"]))
        except FileNotFoundError:
            continue
        told[str(record["user"])] = [d for d in env.get("COMPOSE_DEVICE_IDS", "").split(",") if d]
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
    interrupt_on_sigterm()
    main(sys.argv[1:])
