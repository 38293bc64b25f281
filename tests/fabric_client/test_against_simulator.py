"""The Redfish client against the real simulator, run as a subprocess.

The simulator serves ``hub_config/fabric_inventory.toml``: 8 hosts in two
racks, 26 GPUs (2 of them in the shared expansion chassis), NICs of 25 and
100 Gb/s, 1920 GB NVMe drives. It runs once per module in each of its modes
(synchronous answers, and 202 + task monitor); every test starts from a
clean fabric (``DELETE /sim/state``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from composespawner.fabric.base import (
    CompositionTag,
    DeviceInUse,
    DeviceNotFound,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    IncompatibleZone,
    StaleETag,
)
from composespawner.fabric.redfish import RedfishFabric, RedfishRetry, RedfishTimeouts

from .conftest import REPO_ROOT

USER, PASSWORD = "hub-client", "sim-pass-7"
INVENTORY_FILE = REPO_ROOT / "hub_config" / "fabric_inventory.toml"
STARTUP_DEADLINE_S = 30.0
TIMEOUTS = RedfishTimeouts(connect=2, request=3, operation=15, task_poll_max=0.2)
RETRY = RedfishRetry(attempts=10, backoff_first=0.1, backoff_max=0.3)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"simulator exited {process.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)  # polling a condition (the port), bounded by the deadline
    raise RuntimeError(f"simulator not listening on {port} after {STARTUP_DEADLINE_S} s")


def sim_call(base_url: str, method: str, path: str, body: Any = None) -> Any:
    """Call the simulator's test-only /sim API."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base_url}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as answer:
        payload = answer.read()
    return json.loads(payload) if payload else None


@dataclass(frozen=True)
class RunningSimulator:
    url: str
    asynchronous: bool  # answers writes with 202 + task monitor


@pytest.fixture(scope="module", params=["sync", "async-tasks"])
def running_simulator(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningSimulator]:
    port = free_port()
    log = tmp_path_factory.mktemp("simulator") / "simulator.log"
    command = [
        sys.executable, "-m", "composespawner.fabric.simulator",
        "--inventory", str(INVENTORY_FILE), "--port", str(port), "--faults-api",
        "--username", USER, "--password", PASSWORD,
    ]  # fmt: skip
    if request.param == "async-tasks":
        command += ["--async-tasks", "--task-duration", "0.1"]
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=output, stderr=output)
    try:
        wait_for_port(port, process, log)
        yield RunningSimulator(f"http://127.0.0.1:{port}", request.param == "async-tasks")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def simulator(running_simulator: RunningSimulator) -> str:
    return running_simulator.url


@pytest.fixture
async def fabric(simulator: str) -> AsyncIterator[RedfishFabric]:
    sim_call(simulator, "DELETE", "/sim/state")
    client = RedfishFabric(
        simulator, username=USER, password=PASSWORD, timeouts=TIMEOUTS, retry=RETRY
    )
    yield client
    await client.close()
    sim_call(simulator, "DELETE", "/sim/faults")


async def test_discovers_the_simulated_inventory(fabric: RedfishFabric) -> None:
    inventory = await fabric.inventory()

    assert [h.system_id for h in inventory.hosts] == [f"host-0{n}" for n in range(1, 9)]
    assert inventory.zones == ("rack-1", "rack-2")
    assert {h.system_id: h.zones for h in inventory.hosts}["host-05"] == frozenset({"rack-2"})
    assert all((h.cpus, h.memory_gib, h.state) == (64, 512, "enabled") for h in inventory.hosts)
    gpus = [d for d in inventory.devices if d.kind == "gpu"]
    assert len(gpus) == 26
    assert Counter(d.chassis for d in gpus) == {"rack-1": 12, "rack-2": 12, "expansion-1": 2}
    colocated = inventory.device("x1-rtx6000-1")
    assert colocated is not None
    assert (colocated.model, colocated.memory_gib, colocated.zones) == (
        "NVIDIA RTX 6000 Ada Generation", 48, frozenset({"rack-1", "rack-2"})
    )  # fmt: skip
    nics = [d for d in inventory.devices if d.kind == "nic"]
    assert Counter(d.speed_gbps for d in nics) == {25: 8, 100: 4}
    nvme = [d for d in inventory.devices if d.kind == "nvme"]
    assert {d.capacity_gb for d in nvme} == {1920}
    assert len(nvme) == 12
    assert all(d.state == "free" and d.attached_to is None for d in inventory.devices)


async def test_tag_attach_detach_untag(fabric: RedfishFabric) -> None:
    tag = CompositionTag(hub="hub-test", machine="m-7", owner="ada/thesis")
    await fabric.tag_host("host-01", tag)
    await fabric.attach("host-01", "r1-a100-1")
    await fabric.attach("host-01", "x1-rtx6000-1")

    composed = await fabric.inventory()
    host = composed.host("host-01")
    assert host is not None
    assert host.tag == tag
    assert set(host.attached) == {"r1-a100-1", "x1-rtx6000-1"}
    for block_id in ("r1-a100-1", "x1-rtx6000-1"):
        device = composed.device(block_id)
        assert device is not None
        assert (device.state, device.attached_to) == ("attached", "host-01")

    mark, linked = await fabric.host_mark("host-01")
    assert mark == tag
    assert set(linked) == {host.block_id, "r1-a100-1", "x1-rtx6000-1"}

    await fabric.attach("host-01", "r1-a100-1")  # again: already there, fine
    await fabric.detach("host-01", "r1-a100-1")
    await fabric.detach("host-01", "x1-rtx6000-1")
    await fabric.detach("host-01", "x1-rtx6000-1")  # again: already gone, fine
    await fabric.tag_host("host-01", None)

    released = await fabric.inventory()
    host = released.host("host-01")
    assert host is not None
    assert (host.tag, host.attached) == (None, ())
    assert all(d.state == "free" for d in released.devices)
    assert await fabric.host_mark("host-01") == (None, (host.block_id,))


async def test_block_held_by_another_host_is_in_use(fabric: RedfishFabric) -> None:
    await fabric.attach("host-01", "r1-t4-1")
    with pytest.raises(DeviceInUse) as refused:
        await fabric.attach("host-02", "r1-t4-1")
    assert any(m.endswith("ResourceBlockInUse") for m in refused.value.message_ids)
    host = (await fabric.inventory()).host("host-02")
    assert host is not None
    assert host.attached == ()


async def test_block_of_another_rack_is_an_incompatible_zone(fabric: RedfishFabric) -> None:
    with pytest.raises(IncompatibleZone):
        await fabric.attach("host-01", "r2-h100-1")


async def test_unknown_block_and_host_are_not_found(fabric: RedfishFabric) -> None:
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-01", "r9-nothing-1")
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-99", "r1-t4-2")


async def test_short_outage_is_ridden_out(simulator: str, fabric: RedfishFabric) -> None:
    sim_call(simulator, "PUT", "/sim/faults", {"unreachable_for_s": 0.5})
    inventory = await fabric.inventory()
    assert len(inventory.hosts) == 8


async def test_fabric_that_drops_everything_is_unreachable(
    simulator: str, fabric: RedfishFabric
) -> None:
    sim_call(simulator, "PUT", "/sim/faults", {"drop_connections": True})
    with pytest.raises(FabricUnreachable):
        await fabric.attach("host-01", "r1-t4-3")


async def test_etags_that_stay_stale(simulator: str, fabric: RedfishFabric) -> None:
    sim_call(simulator, "PUT", "/sim/faults", {"stale_etags": True})
    with pytest.raises(StaleETag):
        await fabric.tag_host("host-02", CompositionTag("hub-test", "m-8", "bob/"))


async def test_failing_attachments_are_refused(simulator: str, fabric: RedfishFabric) -> None:
    sim_call(simulator, "PUT", "/sim/faults", {"fail_after_attachments": 0})
    with pytest.raises(FabricRefused) as failed:
        await fabric.attach("host-03", "r1-l40s-1")
    assert type(failed.value) is FabricRefused
    assert failed.value.status == 500
    state = sim_call(simulator, "GET", "/sim/state")
    assert "r1-l40s-1" not in json.dumps(state["hosts"])


async def test_failed_task(running_simulator: RunningSimulator, fabric: RedfishFabric) -> None:
    asynchronous = running_simulator.asynchronous
    sim_call(running_simulator.url, "PUT", "/sim/faults", {"task_failure": True})
    if asynchronous:
        with pytest.raises(FabricTaskFailed) as failed:
            await fabric.attach("host-04", "r1-nvme-1")
        assert any(m.endswith("InternalError") for m in failed.value.message_ids)
    else:  # no tasks, nothing to fail
        await fabric.attach("host-04", "r1-nvme-1")
    host = (await fabric.inventory()).host("host-04")
    assert host is not None
    assert host.attached == (() if asynchronous else ("r1-nvme-1",))
