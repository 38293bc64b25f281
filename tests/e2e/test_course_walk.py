"""Issue 29's walk on the demo: twelve one-GPU servers of the five demo users at once.

The demo's own config and fabric (8 hosts of 64 cores and 512 GiB, 16 slots), with
the stand-in notebook so twelve servers start in seconds: every server gets its own
GPU on a shared host, each notebook is told only its own GPU, the fabric shows on
each host exactly the blocks of the machines its mark lists, no host holds more
than it has, and stopping them all leaves the fabric empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.hubload import STANDIN_ENV, check_holders, create_users
from harness.hub import Hub, notebook_pid, process_env, running_hub

# (user, server, GPU model): three models of rack 1 and two of rack 2.
SERVERS = [
    ("student1", "", "t4"),
    ("student1", "lab2", "t4"),
    ("student1", "lab3", "l40s"),
    ("student2", "", "t4"),
    ("student2", "lab2", "l40s"),
    ("student2", "lab3", "a100"),
    ("researcher1", "", "h100"),
    ("researcher1", "big", "h100"),
    ("teacher1", "", "a100"),
    ("teacher1", "demo", "l40s"),
    ("admin", "", "h100"),
    ("admin", "check", "a100"),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("walk"), **STANDIN_ENV) as hub:
        create_users(hub, sorted({user for user, _, _ in SERVERS}))
        yield hub


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_twelve_one_gpu_servers_share_the_demo_hosts_and_leave_nothing(hub: Hub) -> None:
    def start(entry: tuple[str, str, str]) -> None:
        user, name, model = entry
        response = hub.spawn(user, {"gpu_model": model, "gpu_count": 1}, name=name)
        assert response.status_code in (201, 202), response.text

    with ThreadPoolExecutor(len(SERVERS)) as pool:
        list(pool.map(start, SERVERS))
    envs = {}
    for user, name, _ in SERVERS:
        hub.wait_ready(user, name, timeout=180)
        envs[user, name] = process_env(notebook_pid(hub, user, name))

    gpus = {key: json.loads(env["COMPOSE_GPUS"]) for key, env in envs.items()}
    assert all(len(g) == 1 for g in gpus.values())
    assert len({g[0]["id"] for g in gpus.values()}) == len(SERVERS)  # twelve different GPUs
    for key, env in envs.items():
        assert env["CUDA_VISIBLE_DEVICES"] == f"GPU-{gpus[key][0]['uuid']}", key
    hosts = {env["COMPOSE_HOST"] for env in envs.values()}
    assert len(hosts) < len(SERVERS)  # packed: servers share hosts
    for host in hosts:
        here = [env for env in envs.values() if env["COMPOSE_HOST"] == host]
        assert sorted(hub.attached(host)) == sorted(e["COMPOSE_DEVICE_IDS"] for e in here)
        mark = hub.redfish(f"/redfish/v1/Systems/{host}")["Oem"]["ComposeSpawner"]
        assert sorted(m["Machine"] for m in mark["Machines"]) == sorted(
            e["COMPOSE_MACHINE_ID"] for e in here
        )
    peak = check_holders(
        hub, {f"{u}/{n}": e["COMPOSE_DEVICE_IDS"].split(",") for (u, n), e in envs.items()}
    )
    assert (peak.double_holders, peak.over_capacity) == ([], [])
    assert peak.live_machines == len(SERVERS)

    for user, name, _ in SERVERS:
        hub.stop(user, name)
    for env in envs.values():
        hub.wait_released(env["COMPOSE_MACHINE_ID"])
    after = check_holders(hub)
    # The fabric is empty: nothing attached, held or marked.
    assert (after.fabric_attached, after.ledger_held, after.tagged_hosts) == ([], [], [])
