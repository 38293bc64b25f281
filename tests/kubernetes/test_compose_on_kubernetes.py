"""Notebooks as pods through KubeSpawner, end to end: a real hub, the fabric simulator,
a real kube-apiserver and the tests' process kubelet on the simulated hosts' nodes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, process_env, running_hub, wait_for
from harness.kube import (
    KubeApiServer,
    catalog_with_pushed_images,
    digest_of,
    kubespawner_config,
)
from harness.kubelet import running_nodes
from harness.paths import ROOT

pytestmark = [pytest.mark.kubernetes, pytest.mark.e2e]
HOSTS = [f"host-{n:02d}" for n in range(1, 9)]  # hub_config/fabric_inventory.toml
PODS = "/api/v1/namespaces/default/pods"
# The notebook command: servers named fail* exit at once, others run the real notebook.
WRAPPER = ROOT / "tests" / "e2e" / "notebook_or_fail.py"
RELEASE_WITHIN = 5.0  # seconds from a pod's end to its devices back in the fabric
START_TIMEOUT = 20  # seconds; servers here are ready in 2-5


@pytest.fixture(scope="module")
def kubelet(apiserver: KubeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with running_nodes(apiserver, HOSTS, tmp_path_factory.mktemp("kubelet")) as log:
        yield log


@pytest.fixture(scope="module")
def hub(
    apiserver: KubeApiServer, kubelet: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("hub")
    config = kubespawner_config("compose-kubernetes", catalog_with_pushed_images(tmp))
    config += f"c.KubeSpawner.cmd = [{sys.executable!r}, {str(WRAPPER)!r}]\n"
    # Only the pod watch may notice a pod's end within seconds: the hub's poll comes late.
    config += "c.Spawner.poll_interval = 300\n"
    config += f"c.KubeSpawner.start_timeout = {START_TIMEOUT}\n"
    with running_hub(tmp, config, KUBECONFIG=str(apiserver.kubeconfig)) as hub:
        yield hub


def user_pod(apiserver: KubeApiServer, user: str, server: str = "") -> dict[str, Any] | None:
    """The pod of ``user``'s server, by KubeSpawner's labels."""
    labels = f"hub.jupyter.org/username={user},hub.jupyter.org/servername={server}"
    found = apiserver.request("GET", PODS, params={"labelSelector": labels})
    assert found.status_code == 200, found.text
    items: list[dict[str, Any]] = found.json()["items"]
    assert len(items) <= 1, [p["metadata"]["name"] for p in items]
    return items[0] if items else None


def kill_and_see_released(hub: Hub, user: str, host: str) -> None:
    """SIGKILL ``user``'s pod process; its devices must be back within RELEASE_WITHIN."""
    os.kill(pod_process(hub, user), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: hub.attached(host) == [], RELEASE_WITHIN, "the devices to go back")
    assert time.monotonic() - killed <= RELEASE_WITHIN


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def gpu_uuids(hub: Hub, host: str) -> list[str]:
    """The UUIDs of the GPUs attached to ``host``, as the fabric reports them."""
    uuids = []
    for block in hub.attached(host):
        found = hub.redfish(f"/redfish/v1/CompositionService/ResourceBlocks/{block}")
        for link in found.get("Processors", []):
            uuids.append(hub.redfish(link["@odata.id"])["UUID"])
    return sorted(uuids)


def pod_process(hub: Hub, user: str) -> int:
    """The pid of the process the kubelet runs for ``user``'s pod."""

    def found() -> int | None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                env = process_env(int(entry.name)) if b"jupyterhub-singleuser" in cmdline else {}
            except OSError:
                continue
            if env.get("JUPYTERHUB_USER") == user:
                return int(entry.name)
        return None

    return wait_for(found, 30, f"{user}'s notebook process")


@pytest.mark.timeout(240)
def test_a_pod_runs_on_the_composed_host_with_exactly_its_devices(
    hub: Hub, apiserver: KubeApiServer, ledger: Ledger
) -> None:
    answer, events = hub.spawn_watching(
        "student1", {"gpu_model": "a100", "gpu_count": 2, "scratch_gb": 1920, "stack": "pytorch"}
    )
    assert answer.status_code in (201, 202), answer.text
    hub.wait_ready("student1")
    host = hub.server_host("student1")
    pod = user_pod(apiserver, "student1")
    assert pod is not None
    spec, env = pod["spec"], container_env(pod)

    # On the composed host's node, and nowhere else it could go.
    assert spec["nodeName"] == host
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}
            ]
        }
    ]
    # Exactly the composed GPUs, by UUID, through the NVIDIA runtime.
    uuids = gpu_uuids(hub, host)
    assert len(uuids) == 2
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == [f"GPU-{u}" for u in uuids]
    assert spec["runtimeClassName"] == "nvidia"
    # The stack's GPU image by digest, its determinism settings, no API token.
    container = spec["containers"][0]
    assert container["image"] == f"composespawner/pytorch@{digest_of('pytorch')}"
    assert env["PYTHONHASHSEED"] == "0"
    assert env["COMPOSE_STACK"] == "pytorch"
    assert spec["automountServiceAccountToken"] is False
    # The scratch drive and the run manifest, mounted; the manifest describes this machine.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    machine_id = env["COMPOSE_MACHINE_ID"]
    assert (
        volumes["composespawner-scratch"]["hostPath"]["path"] == f"/mnt/composespawner/{machine_id}"
    )
    assert mounts["composespawner-scratch"]["mountPath"] == env["COMPOSE_SCRATCH"] == "/scratch"
    assert mounts["composespawner-run"]["readOnly"] is True
    assert env["COMPOSE_RUN_MANIFEST"] == "/etc/composespawner/run.json"
    manifest = json.loads(pod["metadata"]["annotations"]["composespawner.io/run-manifest"])
    assert manifest["machine"]["id"] == machine_id
    assert manifest["stack"]["id"] == "pytorch"

    # The spawn page showed composing and the pod's own events.
    messages = [e.get("message", "") for e in events]
    assert any(m.startswith("claiming 2") for m in messages), messages
    assert any("Started container notebook" in m for m in messages), messages

    # JupyterLab answers through the hub.
    session = hub.login("student1")
    lab = session.get(f"{hub.url}/user/student1/lab", timeout=30)
    assert lab.status_code == 200
    assert "JupyterLab" in lab.text

    hub.stop("student1")
    wait_for(lambda: user_pod(apiserver, "student1") is None, 30, "the pod to be deleted")
    hub.wait_released(machine_id)
    assert hub.attached(host) == []
    assert ledger.holders() == {}


@pytest.mark.timeout(240)
def test_a_pod_that_dies_gives_its_devices_back_within_seconds(
    hub: Hub, apiserver: KubeApiServer, ledger: Ledger
) -> None:
    answer = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1})
    assert answer.status_code in (201, 202), answer.text
    hub.wait_ready("student2")
    host = hub.server_host("student2")
    assert len(hub.attached(host)) == 1

    kill_and_see_released(hub, "student2", host)
    pod = user_pod(apiserver, "student2")
    # The kubelet reported it Failed, killed by SIGKILL (or KubeSpawner has deleted it since).
    if pod is not None:
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    wait_for(lambda: ledger.live_machines("student2") == [], 10, "the ledger to agree")


@pytest.mark.timeout(300)
def test_a_hub_killed_with_a_pod_running_finds_it_again(
    hub: Hub, apiserver: KubeApiServer, ledger: Ledger
) -> None:
    answer = hub.spawn("researcher1", {"gpu_model": "h100", "gpu_count": 1})
    assert answer.status_code in (201, 202), answer.text
    hub.wait_ready("researcher1")
    host = hub.server_host("researcher1")
    pod = user_pod(apiserver, "researcher1")
    assert pod is not None

    hub.crash()
    hub.restart()
    # The server is still there on its machine, its pod untouched...
    server = hub.wait_ready("researcher1")
    assert server["ready"]
    again = user_pod(apiserver, "researcher1")
    assert again is not None
    assert again["metadata"]["uid"] == pod["metadata"]["uid"]
    assert len(hub.attached(host)) == 1
    # ...and watched again: its end still gives the devices back at once.
    kill_and_see_released(hub, "researcher1", host)
    wait_for(lambda: ledger.live_machines("researcher1") == [], 10, "the ledger to agree")


@pytest.mark.timeout(120)
def test_a_pod_that_fails_before_it_is_ready_ends_the_start_at_once(
    hub: Hub, apiserver: KubeApiServer, ledger: Ledger
) -> None:
    started = time.monotonic()
    answer = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1}, name="fail-now")
    assert answer.status_code in (202, 500), answer.text
    hub.wait_gone("student2", "fail-now", timeout=30)
    # Well before the start timeout KubeSpawner alone would wait out.
    assert time.monotonic() - started < START_TIMEOUT
    wait_for(lambda: hub.composed_hosts() == {}, RELEASE_WITHIN, "every device to be detached")
    assert "Your notebook's pod ended before it was ready, with exit code 3" in hub.log_tail(200)
    wait_for(
        lambda: user_pod(apiserver, "student2", "fail-now") is None, 30, "the failed pod to go"
    )
    # The ledger records the release once the fabric confirmed it: a moment after.
    wait_for(
        lambda: ledger.live_machines("student2") == [] or None,
        RELEASE_WITHIN,
        "the machine to be released in the ledger",
    )


@pytest.mark.timeout(60)
def test_a_starter_kit_is_refused_on_kubernetes_with_nothing_claimed(
    hub: Hub, ledger: Ledger
) -> None:
    answer = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "kit": "digits"}, "kit")
    assert answer.status_code == 400, answer.text
    assert "Starter kits cannot be put in your home on this cluster" in answer.json()["message"]
    assert hub.server("student1", "kit") is None
    assert ledger.live_machines("student1") == []


@pytest.mark.timeout(180)
def test_a_pod_that_never_gets_ready_gives_its_devices_back_at_the_start_timeout(
    hub: Hub, apiserver: KubeApiServer, ledger: Ledger
) -> None:
    answer = hub.spawn("researcher1", {"gpu_model": "t4", "gpu_count": 1}, name="hang")
    assert answer.status_code == 202, answer.text
    host = hub.server_host("researcher1", "hang")
    assert hub.attached(host) != []
    hub.wait_gone("researcher1", "hang", timeout=START_TIMEOUT + 60)
    wait_for(lambda: hub.attached(host) == [], RELEASE_WITHIN, "the devices to go back")
    wait_for(
        lambda: user_pod(apiserver, "researcher1", "hang") is None, 30, "the pod to be deleted"
    )
    assert ledger.live_machines("researcher1") == []
