"""Asynchronous writes (202 + task monitor), state across restarts, the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.simulator import INVENTORY, free_port

from .harness import (
    SYSTEMS,
    RedfishClient,
    SimulatorProcess,
    StartSimulator,
    poll_monitor,
)

TAG = {"Hub": "hub-a", "Machine": "m-1", "Owner": "bob/"}


@pytest.fixture
def async_client(start_simulator: StartSimulator) -> RedfishClient:
    return start_simulator("--faults-api", "--async-tasks", "--task-duration", "0.2").client


def test_attach_through_a_task_monitor(async_client: RedfishClient) -> None:
    client = async_client
    accepted = client.attach("host-01", "r1-a100-1")
    assert accepted.status == 202
    monitor = accepted.headers["Location"]
    assert monitor.startswith("/redfish/v1/TaskService/TaskMonitors/")
    assert accepted.json["TaskState"] == "Running"
    # Applied when the task completes, not before.
    assert client.sim_state()["hosts"]["host-01"]["attached"] == []
    final = poll_monitor(client, monitor)
    assert final.status == 204
    assert client.sim_state()["hosts"]["host-01"]["attached"] == ["r1-a100-1"]
    assert client.get(monitor).status == 204  # asking again gives the same answer
    task = client.get(accepted.json["@odata.id"]).json
    assert (task["TaskState"], task["TaskStatus"], task["PercentComplete"]) == (
        "Completed",
        "OK",
        100,
    )
    assert task["Messages"][0]["MessageId"] == "Base.1.22.1.Success"
    members = client.get("/redfish/v1/TaskService/Tasks").json["Members"]
    assert {"@odata.id": accepted.json["@odata.id"]} in members


def test_refusal_arrives_through_the_task_monitor(async_client: RedfishClient) -> None:
    client = async_client
    first = client.attach("host-01", "r1-a100-1")
    assert poll_monitor(client, first.headers["Location"]).status == 204
    accepted = client.attach("host-02", "r1-a100-1")
    final = poll_monitor(client, accepted.headers["Location"])
    assert (final.status, final.message_ids) == (409, ["Composition.1.1.3.ResourceBlockInUse"])
    task = client.get(accepted.json["@odata.id"]).json
    assert (task["TaskState"], task["TaskStatus"]) == ("Exception", "Critical")
    assert task["Messages"][0]["MessageId"] == "Composition.1.1.3.ResourceBlockInUse"


def test_malformed_requests_are_refused_before_any_task(async_client: RedfishClient) -> None:
    answer = async_client.attach("host-01", "r1-a100-99")
    assert (answer.status, answer.message_ids) == (
        404,
        ["Composition.1.1.3.ResourceBlockNotFound"],
    )
    assert async_client.get("/redfish/v1/TaskService/Tasks").json["Members"] == []


def test_task_failure_fault(async_client: RedfishClient) -> None:
    client = async_client
    client.faults(task_failure=True)
    final = poll_monitor(client, client.attach("host-01", "r1-a100-1").headers["Location"])
    assert (final.status, final.message_ids) == (500, ["Base.1.22.1.InternalError"])
    assert client.sim_state()["hosts"]["host-01"]["attached"] == []


def test_unknown_task_monitor_is_404(async_client: RedfishClient) -> None:
    assert async_client.get("/redfish/v1/TaskService/TaskMonitors/nope").status == 404


def test_attachments_and_tags_survive_a_restart(
    simulator: SimulatorProcess, client: RedfishClient
) -> None:
    assert client.attach("host-03", "r1-l40s-2").status == 204
    assert client.attach("host-07", "r2-nvme-1").status == 204
    headers = {"If-Match": "*"}
    tagged = client.patch(f"{SYSTEMS}/host-03", {"Oem": {"ComposeSpawner": TAG}}, headers=headers)
    assert tagged.status == 200
    etag = client.get(f"{SYSTEMS}/host-03").headers["ETag"]
    simulator.restart()
    state = client.sim_state()["hosts"]
    assert state["host-03"] == {"attached": ["r1-l40s-2"], "tag": TAG}
    assert state["host-07"]["attached"] == ["r2-nvme-1"]
    assert client.get(f"{SYSTEMS}/host-03").headers["ETag"] == etag
    assert client.attach("host-01", "r1-l40s-2").status == 409  # still held


def test_writes_at_once_are_each_answered_only_once_saved(
    client: RedfishClient, tmp_path: Path
) -> None:
    """Writes that arrive together share a save; none is answered before it is in the file."""
    hosts = sorted(client.sim_state()["hosts"])
    assert len(hosts) >= 4

    def tag(host: str) -> dict[str, Any]:
        mark = {**TAG, "Machine": f"m-{host}"}
        answer = client.patch(
            f"{SYSTEMS}/{host}", {"Oem": {"ComposeSpawner": mark}}, headers={"If-Match": "*"}
        )
        assert answer.status == 200, answer.body
        saved = json.loads((tmp_path / "state.json").read_text())
        return {"answered": mark, "saved": saved["hosts"][host]["tag"]}

    with ThreadPoolExecutor(len(hosts)) as pool:
        for seen in pool.map(tag, hosts):
            assert seen["saved"] == seen["answered"]


def test_unreadable_state_file_refuses_to_start(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    state_file.write_text("{not json")
    result = run_cli("--state-file", str(state_file))
    assert result.returncode == 2
    assert "not JSON" in result.stderr


def test_bad_inventory_refuses_to_start(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text('[[zones]]\nid = "z"\n[[chassis]]\nid = "c"\ntype = "Spaceship"\n')
    result = run_cli(inventory=inventory)
    assert result.returncode == 2
    assert "Spaceship" in result.stderr


def test_binds_to_the_jupyterhub_service_url(tmp_path: Path) -> None:
    port = free_port()
    env = {"JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}/services/fabric/"}
    simulator = SimulatorProcess(
        [], tmp_path / "simulator.log", env=env, port_option=False, port=port
    )
    simulator.start()  # waits until the service root answers on that port
    try:
        assert simulator.client.get("/redfish/v1/", auth=False).status == 200
    finally:
        assert simulator.stop() == 0  # SIGTERM is a clean exit


def test_console_script_runs_the_simulator() -> None:
    script = Path(sys.executable).parent / "composespawner"
    help_text = subprocess.run(
        [str(script), "fabric-simulator", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "--async-tasks" in help_text
    assert "--faults-api" in help_text


def run_cli(*args: str, inventory: Path = INVENTORY) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fabricsim"]
    return subprocess.run(
        [*command, "--inventory", str(inventory), "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_unwritable_state_file_refuses_to_start(tmp_path: Path) -> None:
    result = run_cli("--state-file", str(tmp_path / "no-such-dir" / "state.json"))
    assert result.returncode == 2
    assert "cannot write" in result.stderr
