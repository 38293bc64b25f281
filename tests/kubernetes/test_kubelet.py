"""The tests' process kubelet against the real API server: it binds, runs, reports and
deletes pods as a node would, so KubeSpawner meets a cluster that behaves like one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from harness.hub import wait_for
from harness.kube import KubeApiServer
from harness.kubelet import process_kubelet

pytestmark = pytest.mark.kubernetes
NODES = ["host-01", "host-02"]
PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture(scope="module")
def kubelet(apiserver: KubeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("kubelet")
    with process_kubelet(apiserver.url, apiserver.token, apiserver.ca, NODES, folder) as log:
        wait_for(lambda: apiserver.ready_nodes() == set(NODES), 30, "the nodes")
        yield log


def make_pod(
    apiserver: KubeApiServer, name: str, args: list[str], *, node: str = "host-01"
) -> dict[str, Any]:
    manifest = {
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "args": args,
                    "env": [{"name": "GREETING", "value": "bound to 0.0.0.0"}],
                    "ports": [{"name": "notebook-port", "containerPort": 8888}],
                }
            ],
        },
    }
    created = apiserver.request("POST", PODS, json=manifest)
    assert created.status_code == 201, created.text
    result: dict[str, Any] = created.json()
    return result


def pod(apiserver: KubeApiServer, name: str) -> dict[str, Any] | None:
    answer = apiserver.request("GET", f"{PODS}/{name}")
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def ready(apiserver: KubeApiServer, name: str) -> dict[str, Any] | None:
    found = pod(apiserver, name)
    statuses = (found or {}).get("status", {}).get("containerStatuses") or [{}]
    return found if statuses[0].get("ready") else None


def remove(apiserver: KubeApiServer, name: str, grace: int = 0) -> None:
    """Delete a pod and wait until it is gone (the kubelet ends what runs first)."""
    deleted = apiserver.request("DELETE", f"{PODS}/{name}", json={"gracePeriodSeconds": grace})
    assert deleted.status_code == 200, deleted.text
    wait_for(lambda: pod(apiserver, name) is None, 30, f"pod {name} to be gone")


SERVE = [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", "8888"]


@pytest.mark.timeout(60)
def test_a_pod_runs_on_its_node_at_its_own_address_and_goes_when_deleted(
    apiserver: KubeApiServer, kubelet: Path
) -> None:
    make_pod(apiserver, "serves", SERVE)
    running = wait_for(lambda: ready(apiserver, "serves"), 30, "the pod to be ready")
    assert running["spec"]["nodeName"] == "host-01"
    assert running["status"]["phase"] == "Running"
    address = running["status"]["podIP"]
    assert address.startswith("127.")
    assert address != "127.0.0.1"  # the node's own address
    assert requests.get(f"http://{address}:8888/", timeout=10).status_code == 200

    # A second pod gets the same port on an address of its own.
    make_pod(apiserver, "serves-too", SERVE, node="host-02")
    other = wait_for(lambda: ready(apiserver, "serves-too"), 30, "the second pod")
    assert other["spec"]["nodeName"] == "host-02"
    assert other["status"]["podIP"] != address

    pids = pids_serving(address)
    assert pids
    remove(apiserver, "serves", grace=5)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    remove(apiserver, "serves-too")


@pytest.mark.timeout(60)
def test_a_pod_whose_process_dies_is_failed_with_its_exit_code(
    apiserver: KubeApiServer, kubelet: Path
) -> None:
    make_pod(apiserver, "dies", [sys.executable, "-c", "raise SystemExit(3)"])

    def failed() -> dict[str, Any] | None:
        found = pod(apiserver, "dies")
        return found if found and found["status"].get("phase") == "Failed" else None

    ended = wait_for(failed, 30, "the pod to fail")
    state = ended["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3
    remove(apiserver, "dies")


@pytest.mark.timeout(60)
def test_a_pod_for_a_node_nobody_serves_stays_pending(
    apiserver: KubeApiServer, kubelet: Path
) -> None:
    make_pod(apiserver, "elsewhere", SERVE, node="host-99")
    # The kubelet has handled a later pod by the time this one is checked.
    make_pod(apiserver, "marker", SERVE)
    wait_for(lambda: ready(apiserver, "marker"), 30, "the marker pod")
    waiting = pod(apiserver, "elsewhere")
    assert waiting is not None
    assert (waiting["status"]["phase"], waiting["spec"].get("nodeName")) == ("Pending", None)
    for name in ("elsewhere", "marker"):
        remove(apiserver, name)


def pids_serving(address: str) -> list[int]:
    """Processes whose command line is the test server (the pod's), by /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"http.server" in command and b"--bind\x00" + address.encode() in command:
                found.append(int(entry))
    return found
