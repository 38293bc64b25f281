"""The hosts' DCGM exporters in the simulator, read by composespawner's DcgmExporter over HTTP.

GPUs are attached through the simulator's Redfish actions, as the hub attaches them;
``/sim/activity`` sets what they are doing, ``/sim/activity/faults`` breaks exporters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from composespawner.activity import ActivityUnreadable
from composespawner.activity.dcgm import DcgmExporter
from composespawner.domain.activity import GpuActivity, gpu_uuid

from .harness import BLOCKS, SYSTEMS, RedfishClient, SimulatorProcess, StartSimulator

IDLE_MIB = 3.0  # what the simulator shows for a GPU nobody set: attached, no process


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    """One simulator for the module's tests (each starts from a reset fabric)."""
    simulator = SimulatorProcess(["--faults-api"], tmp_path_factory.mktemp("sim") / "simulator.log")
    simulator.start()
    try:
        yield simulator
    finally:
        simulator.stop()


@pytest.fixture
def sim(shared: SimulatorProcess) -> SimulatorProcess:
    assert shared.client.delete("/sim/state", auth=False).status == 204
    return shared


def exporter(simulator: SimulatorProcess, timeout: float = 5.0) -> DcgmExporter:
    return DcgmExporter(lambda host: f"{simulator.url}/dcgm/{host}/metrics", timeout=timeout)


def redfish_uuid(client: RedfishClient, block_id: str) -> str:
    """The GPU's UUID as its Redfish Processor gives it (what the hub records)."""
    return gpu_uuid(client.get(f"{BLOCKS}/{block_id}/Processors/GPU0").json["UUID"])


def attach(client: RedfishClient, system_id: str, *block_ids: str) -> None:
    for block_id in block_ids:
        assert client.attach(system_id, block_id).status == 204


async def test_attached_gpus_are_listed_idle_and_detached_ones_gone(sim: SimulatorProcess) -> None:
    client = sim.client
    attach(client, "host-01", "r1-a100-1", "r1-nic100-1", "r1-t4-2")
    a100, t4 = redfish_uuid(client, "r1-a100-1"), redfish_uuid(client, "r1-t4-2")
    async with exporter(sim) as reader:
        reading = await reader.read("host-01")
        assert dict(reading.gpus) == {  # the NIC is no GPU; nothing set: idle, no holder
            a100: GpuActivity(a100, 0.0, IDLE_MIB, None),
            t4: GpuActivity(t4, 0.0, IDLE_MIB, None),
        }
        assert client.detach("host-01", "r1-a100-1").status == 204
        assert set((await reader.read("host-01")).gpus) == {t4}
        assert dict((await reader.read("host-02")).gpus) == {}  # declared fields, no GPU


async def test_set_figures_are_read_back(sim: SimulatorProcess) -> None:
    client = sim.client
    attach(client, "host-02", "r1-l40s-1", "r1-l40s-2")
    first, second = redfish_uuid(client, "r1-l40s-1"), redfish_uuid(client, "r1-l40s-2")
    body = {
        "r1-l40s-1": {"utilization": 87, "memory_used_mib": 30000},
        f"GPU-{second.upper()}": {"memory_used_mib": 512.5},  # by UUID, as nvidia-smi shows it
    }
    answer = client.put("/sim/activity", body, auth=False)
    assert answer.status == 200, answer.body
    assert answer.json["r1-l40s-2"] == {
        "uuid": second,
        "utilization": 0.0,
        "memory_used_mib": 512.5,
    }
    async with exporter(sim) as reader:
        gpus = (await reader.read("host-02")).gpus
        assert gpus[first] == GpuActivity(first, 87.0, 30000.0, None)
        assert gpus[second] == GpuActivity(second, 0.0, 512.5, None)
        # PATCH changes one GPU; PUT replaces all; DELETE makes every GPU idle again.
        client.patch("/sim/activity", {"r1-l40s-2": {"utilization": 5}}, auth=False)
        assert (await reader.read("host-02")).gpus[first].utilization == 87.0
        assert (await reader.read("host-02")).gpus[second].utilization == 5.0
        client.put("/sim/activity", {"r1-l40s-2": {"utilization": 9}}, auth=False)
        assert (await reader.read("host-02")).gpus[first].utilization == 0.0
        assert client.delete("/sim/activity", auth=False).json == {}
        assert (await reader.read("host-02")).gpus[second] == GpuActivity(
            second, 0.0, IDLE_MIB, None
        )


def test_the_exporter_text_has_the_real_exporters_labels(sim: SimulatorProcess) -> None:
    attach(sim.client, "host-01", "r1-a100-3")
    answer = sim.client.get("/dcgm/host-01/metrics", auth=False)
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    line = next(
        row for row in answer.body.decode().splitlines() if row.startswith("DCGM_FI_DEV_FB_FREE")
    )
    uuid = redfish_uuid(sim.client, "r1-a100-3")
    assert line == (
        f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-{uuid}",pci_bus_id="00000000:41:00.0",'
        'device="nvidia0",modelName="NVIDIA A100 80GB PCIe",Hostname="host-01",'
        f'DCGM_FI_DRIVER_VERSION="550.54.15"}} {80 * 1024 - IDLE_MIB}'
    )


@pytest.mark.parametrize(
    "body",
    [
        {"r1-nic100-1": {"utilization": 1}},  # not a GPU
        {"no-such-block": {}},
        {"r1-t4-1": {"utilization": 101}},
        {"r1-t4-1": {"utilization": -1}},
        {"r1-t4-1": {"utilization": True}},
        {"r1-t4-1": {"utilization": "busy"}},
        {"r1-t4-1": {"memory_used_mib": 16 * 1024 + 1}},  # over the T4's 16 GiB
        {"r1-t4-1": {"processes": 1}},
        {"r1-t4-1": 50},
        ["r1-t4-1"],
    ],
)
def test_bad_figures_are_refused(sim: SimulatorProcess, body: object) -> None:
    answer = sim.client.put("/sim/activity", body, auth=False)
    assert answer.status == 400
    assert "error" in answer.json
    assert sim.client.get("/sim/activity", auth=False).json == {}  # nothing applied


@pytest.mark.parametrize(("fault", "said"), [("error", "HTTP 500"), ("garbage", "not Prometheus")])
async def test_a_broken_exporter_is_unreadable(
    sim: SimulatorProcess, fault: str, said: str
) -> None:
    attach(sim.client, "host-01", "r1-t4-1")
    attach(sim.client, "host-02", "r1-t4-2")
    assert sim.client.put("/sim/activity/faults", {"host-01": fault}, auth=False).status == 200
    async with exporter(sim) as reader:
        with pytest.raises(ActivityUnreadable, match=said):
            await reader.read("host-01")
        assert len((await reader.read("host-02")).gpus) == 1  # its neighbour's still answers
        assert sim.client.delete("/sim/activity/faults", auth=False).json == {}
        assert len((await reader.read("host-01")).gpus) == 1


async def test_a_hung_exporter_is_unreadable_within_the_timeout(sim: SimulatorProcess) -> None:
    attach(sim.client, "host-01", "r1-t4-1")
    assert sim.client.put("/sim/activity/faults", {"*": "hang"}, auth=False).status == 200
    start = time.monotonic()
    async with exporter(sim, timeout=0.5) as reader:
        with pytest.raises(ActivityUnreadable, match=r"no answer within 0\.5s"):
            await reader.read("host-01")
    assert time.monotonic() - start < 3.0
    # The simulator let go of the request when the reader left, and answers the next one.
    sim.client.delete("/sim/activity/faults", auth=False)
    assert sim.client.get("/dcgm/host-01/metrics", auth=False, timeout=5.0).status == 200
    assert "Traceback" not in sim.log()


@pytest.mark.parametrize("body", [{"host-01": "slow"}, {"host-01": None}, ["hang"]])
def test_bad_exporter_faults_are_refused(sim: SimulatorProcess, body: object) -> None:
    assert sim.client.put("/sim/activity/faults", body, auth=False).status == 400
    assert sim.client.get("/sim/activity/faults", auth=False).json == {}


async def test_an_unknown_system_has_no_exporter(sim: SimulatorProcess) -> None:
    async with exporter(sim) as reader:
        with pytest.raises(ActivityUnreadable, match="HTTP 404"):
            await reader.read("host-99")


async def test_a_state_reset_makes_everything_idle_and_well(sim: SimulatorProcess) -> None:
    attach(sim.client, "host-01", "r1-t4-1")
    sim.client.put("/sim/activity", {"r1-t4-1": {"utilization": 50}}, auth=False)
    sim.client.put("/sim/activity/faults", {"*": "error"}, auth=False)
    assert sim.client.delete("/sim/state", auth=False).status == 204
    assert sim.client.get("/sim/activity", auth=False).json == {}
    assert sim.client.get("/sim/activity/faults", auth=False).json == {}
    attach(sim.client, "host-01", "r1-t4-1")
    async with exporter(sim) as reader:
        assert [g.utilization for g in (await reader.read("host-01")).gpus.values()] == [0.0]


async def test_a_composed_system_lists_its_gpus(start_simulator: StartSimulator) -> None:
    """Under specific composition the exporter is the composed system's (its host's)."""
    specific = start_simulator("--composition", "specific", "--faults-api")
    refs = [{"@odata.id": f"{BLOCKS}/{b}"} for b in ("host-03-block", "r1-a100-2", "r1-t4-3")]
    created = specific.client.post(SYSTEMS, {"Name": "m", "Links": {"ResourceBlocks": refs}})
    assert created.status == 201
    system_id = created.headers["Location"].rsplit("/", 1)[-1]
    async with exporter(specific) as reader:
        gpus = (await reader.read(system_id)).gpus
    expected = {redfish_uuid(specific.client, b) for b in ("r1-a100-2", "r1-t4-3")}
    assert set(gpus) == expected


def test_exporters_without_the_faults_api_but_no_switches(start_simulator: StartSimulator) -> None:
    plain = start_simulator()  # as the demo runs it: its reclaimer reads the exporters
    assert plain.client.get("/dcgm/host-01/metrics", auth=False).status == 200
    assert plain.client.get("/sim/activity", auth=False).status == 404
    assert plain.client.get("/sim/activity/faults", auth=False).status == 404
