"""The Redfish client against the real simulator, run as a subprocess.

The simulator serves ``hub_config/fabric_inventory.toml``: 8 hosts in two
racks, 26 GPUs (2 of them in the shared expansion chassis), NICs of 25 and
100 Gb/s, 1920 GB NVMe drives. It answers over https only, as real fabric
managers do, with a certificate from a CA the tests make (trustme), which the
client trusts through its CA-bundle knob. It runs once per module in each of
its modes (synchronous answers, and 202 + task monitor); every test starts
from a clean fabric (``DELETE /sim/state``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import requests

from composespawner.domain.hardware import CompositionTag, Device, HostMark
from composespawner.fabric.base import (
    DeviceInUse,
    DeviceNotFound,
    FabricCertificateError,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    IncompatibleZone,
    StaleETag,
)
from composespawner.fabric.redfish import RedfishFabric, RedfishRetry, RedfishTimeouts
from composespawner.services.settings import build_composer, upgrade_ledger
from composespawner.spawners.spawner import ComposeSpawner
from harness.simulator import SimulatorProcess, SimulatorSwitches
from harness.tls import TLSFiles, make_tls_files

from .conftest import REPO_ROOT

USER, PASSWORD = "hub-client", "sim-pass-7"
CATALOG_FILE = REPO_ROOT / "hub_config" / "catalog.toml"
TIMEOUTS = RedfishTimeouts(connect=2, request=3, operation=15, task_poll_max=0.2)
RETRY = RedfishRetry(attempts=10, backoff_first=0.1, backoff_max=0.3)


@dataclass(frozen=True)
class RunningSimulator:
    url: str
    asynchronous: bool  # answers writes with 202 + task monitor
    tls: TLSFiles
    composition: str = "expandable"  # --composition

    @property
    def switches(self) -> SimulatorSwitches:
        """The simulator's test-only /sim API."""
        return SimulatorSwitches(self.url, self.tls.ca_bundle)

    def client(self, ca_bundle: Path | None) -> RedfishFabric:
        return RedfishFabric(
            self.url,
            username=USER,
            password=PASSWORD,
            ca_bundle=str(ca_bundle) if ca_bundle else None,
            timeouts=TIMEOUTS,
            retry=RETRY,
        )


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


# Each mode: how the simulator composes, and whether it answers writes with tasks.
MODES = {
    "sync": ("expandable", False),
    "async-tasks": ("expandable", True),
    "specific": ("specific", False),
    "specific-async-tasks": ("specific", True),
    "action-async-tasks": ("action", True),
}


WHOLE_SYSTEM = [mode for mode, (composition, _) in MODES.items() if composition != "expandable"]
EXPANDABLE = [mode for mode in MODES if mode not in WHOLE_SYSTEM]


def only(*modes: str) -> pytest.MarkDecorator:
    """Run a test against these modes alone (attach/detach/join_host exist only on expandable
    hosts; compose/decompose cover every mode)."""
    return pytest.mark.parametrize("running_simulator", modes, indirect=True)


@pytest.fixture(scope="module", params=list(MODES))
def running_simulator(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles
) -> Iterator[RunningSimulator]:
    log = tmp_path_factory.mktemp("simulator") / "simulator.log"
    composition, asynchronous = MODES[request.param]
    args = ["--faults-api", "--composition", composition]
    if asynchronous:
        args += ["--async-tasks", "--task-duration", "0.1"]
    process = SimulatorProcess(args, log, tls=tls_files, credentials=(USER, PASSWORD))
    with process:
        yield RunningSimulator(process.url, asynchronous, tls_files, composition)


@pytest.fixture
def simulator(running_simulator: RunningSimulator) -> RunningSimulator:
    return running_simulator


@pytest.fixture
async def fabric(simulator: RunningSimulator) -> AsyncIterator[RedfishFabric]:
    simulator.switches.reset()
    client = simulator.client(ca_bundle=simulator.tls.ca_bundle)
    yield client
    await client.close()
    simulator.switches.clear_faults()


def host_id(simulator: RunningSimulator, name: str) -> str:
    """How the client names a host: its system, or its compute block where systems are composed."""
    return name if simulator.composition == "expandable" else f"{name}-block"


async def test_discovers_the_simulated_inventory(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    inventory = await fabric.inventory()

    names = [host_id(simulator, f"host-0{n}") for n in range(1, 9)]
    assert [h.system_id for h in inventory.hosts] == names
    assert inventory.zones == ("rack-1", "rack-2")
    zones = {h.system_id: h.zones for h in inventory.hosts}
    assert zones[host_id(simulator, "host-05")] == frozenset({"rack-2"})
    # A free compute block says nothing of its CPUs and memory; its composed system does.
    size = (64, 512) if simulator.composition == "expandable" else (0, 0)
    assert all((h.cpus, h.memory_gib, h.state) == (*size, "enabled") for h in inventory.hosts)
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


@only(*EXPANDABLE)
async def test_join_attach_detach_leave(fabric: RedfishFabric) -> None:
    tag = CompositionTag(hub="hub-test", machine="m-7", owner="ada/thesis")
    await fabric.join_host("host-01", tag)
    await fabric.attach("host-01", "r1-a100-1")
    await fabric.attach("host-01", "x1-rtx6000-1")

    composed = await fabric.inventory()
    host = composed.host("host-01")
    assert host is not None
    assert host.mark == HostMark.of(tag)
    assert set(host.attached) == {"r1-a100-1", "x1-rtx6000-1"}
    for block_id in ("r1-a100-1", "x1-rtx6000-1"):
        device = composed.device(block_id)
        assert device is not None
        assert (device.state, device.attached_to) == ("attached", "host-01")

    mark, linked = await fabric.host_mark("host-01")
    assert mark == HostMark.of(tag)
    assert set(linked) == {host.block_id, "r1-a100-1", "x1-rtx6000-1"}

    await fabric.attach("host-01", "r1-a100-1")  # again: already there, fine
    await fabric.detach("host-01", "r1-a100-1")
    await fabric.detach("host-01", "x1-rtx6000-1")
    await fabric.detach("host-01", "x1-rtx6000-1")  # again: already gone, fine
    await fabric.leave_host("host-01", tag)

    released = await fabric.inventory()
    host = released.host("host-01")
    assert host is not None
    assert (host.mark, host.attached) == (None, ())
    assert all(d.state == "free" for d in released.devices)
    assert await fabric.host_mark("host-01") == (None, (host.block_id,))


@only(*EXPANDABLE)
async def test_block_held_by_another_host_is_in_use(fabric: RedfishFabric) -> None:
    await fabric.attach("host-01", "r1-t4-1")
    with pytest.raises(DeviceInUse) as refused:
        await fabric.attach("host-02", "r1-t4-1")
    assert any(m.endswith("ResourceBlockInUse") for m in refused.value.message_ids)
    host = (await fabric.inventory()).host("host-02")
    assert host is not None
    assert host.attached == ()


@only(*EXPANDABLE)
async def test_block_of_another_rack_is_an_incompatible_zone(fabric: RedfishFabric) -> None:
    with pytest.raises(IncompatibleZone):
        await fabric.attach("host-01", "r2-h100-1")


@only(*EXPANDABLE)
async def test_unknown_block_and_host_are_not_found(fabric: RedfishFabric) -> None:
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-01", "r9-nothing-1")
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-99", "r1-t4-2")


async def test_short_outage_is_ridden_out(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    simulator.switches.faults(unreachable_for_s=0.5)
    inventory = await fabric.inventory()
    assert len(inventory.hosts) == 8


@only(*EXPANDABLE)
async def test_fabric_that_drops_everything_is_unreachable(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    simulator.switches.faults(drop_connections=True)
    with pytest.raises(FabricUnreachable):
        await fabric.attach("host-01", "r1-t4-3")


@only(*EXPANDABLE)
async def test_etags_that_stay_stale(simulator: RunningSimulator, fabric: RedfishFabric) -> None:
    simulator.switches.faults(stale_etags=True)
    with pytest.raises(StaleETag):
        await fabric.join_host("host-02", CompositionTag("hub-test", "m-8", "bob/"))
    assert simulator.switches.state()["hosts"]["host-02"]["tag"] is None


@only(*EXPANDABLE)
async def test_failing_attachments_are_refused(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    simulator.switches.faults(fail_after_attachments=0)
    with pytest.raises(FabricRefused) as failed:
        await fabric.attach("host-03", "r1-l40s-1")
    assert type(failed.value) is FabricRefused
    assert failed.value.status == 500
    state = simulator.switches.state()
    assert "r1-l40s-1" not in json.dumps(state["hosts"])


@only(*EXPANDABLE)
async def test_failed_task(running_simulator: RunningSimulator, fabric: RedfishFabric) -> None:
    asynchronous = running_simulator.asynchronous
    running_simulator.switches.faults(task_failure=True)
    if asynchronous:
        with pytest.raises(FabricTaskFailed) as failed:
            await fabric.attach("host-04", "r1-nvme-1")
        assert any(m.endswith("InternalError") for m in failed.value.message_ids)
    else:  # no tasks, nothing to fail
        await fabric.attach("host-04", "r1-nvme-1")
    host = (await fabric.inventory()).host("host-04")
    assert host is not None
    assert host.attached == (() if asynchronous else ("r1-nvme-1",))


# --- compose / decompose, in every mode -----------------------------------------------------

TAG = CompositionTag(hub="hub-test", machine="m-21", owner="ada/thesis")


async def devices_of(fabric: RedfishFabric, *block_ids: str) -> list[Device]:
    inventory = await fabric.inventory()
    found = [inventory.device(b) for b in block_ids]
    assert all(found)
    return [d for d in found if d is not None]


async def test_compose_then_decompose_a_machine(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    host = host_id(simulator, "host-01")
    devices = await devices_of(fabric, "r1-a100-1", "r1-nic100-1", "r1-nvme-1")
    lines: list[str] = []

    system_id = await fabric.compose(host, devices, TAG, lines.append)

    if simulator.composition == "expandable":
        assert system_id == host
        assert lines == [
            f"attaching GPU 1/1 (NVIDIA A100 80GB PCIe) to {host}",
            f"attaching 100 Gb/s network card to {host}",
            f"attaching scratch NVMe 1/1 to {host}",
        ]
    else:
        assert system_id.startswith("composed-")
        assert lines == [f"composing 1 GPU, 1 network card, 1 scratch NVMe on {host}"]
    composed = await fabric.inventory()
    found = composed.host(host)
    assert found is not None
    assert (found.mark, set(found.attached)) == (HostMark.of(TAG), {d.block_id for d in devices})
    assert (found.cpus, found.memory_gib) == (64, 512)
    for device in devices:
        assert composed.device(device.block_id) == replace(
            device, state="attached", attached_to=host
        )
    linked = (host_block(simulator, host), *found.attached)
    assert await fabric.host_mark(host) == (HostMark.of(TAG), linked)
    # Again, as a retry after a lost answer would: the same machine, not a second one.
    assert await fabric.compose(host, devices, TAG, lines.append) == system_id

    assert await fabric.decompose(host, [d.block_id for d in devices], TAG) is True
    released = await fabric.inventory()
    free_host = released.host(host)
    assert free_host is not None
    assert (free_host.mark, free_host.attached, free_host.state) == (None, (), "enabled")
    assert all(d.state == "free" for d in released.devices)
    assert await fabric.decompose(host, [d.block_id for d in devices], TAG) is False


def host_block(simulator: RunningSimulator, host: str) -> str:
    return f"{host}-block" if simulator.composition == "expandable" else host


async def test_a_fresh_client_finds_the_machine_already_composed(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    host = host_id(simulator, "host-02")
    devices = await devices_of(fabric, "r1-l40s-1")
    first = await fabric.compose(host, devices, TAG, lambda line: None)
    other = simulator.client(simulator.tls.ca_bundle)
    try:
        assert await other.compose(host, devices, TAG, lambda line: None) == first
    finally:
        await other.close()
    systems = simulator.switches.state()
    assert json.dumps(systems).count("r1-l40s-1") == 1


@only(*WHOLE_SYSTEM)
async def test_two_tries_at_once_compose_one_machine(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    # Both look, find nothing and send: the service takes one, refuses the other
    # (ResourceBlockInUse), and the refused one finds the machine composed for it.
    # As when a POST whose answer was lost is sent again.
    host = host_id(simulator, "host-05")
    devices = await devices_of(fabric, "r2-a100-3")
    other = simulator.client(simulator.tls.ca_bundle)
    try:
        results = await asyncio.gather(
            fabric.compose(host, devices, TAG, lambda line: None),
            other.compose(host, devices, TAG, lambda line: None),
        )
    finally:
        await other.close()
    assert results[0] == results[1]
    assert len(simulator.switches.state()["composed"]) == 1


async def test_a_host_composed_by_another_hub_is_in_use(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    host = host_id(simulator, "host-03")
    mine, theirs = await devices_of(fabric, "r1-t4-1"), await devices_of(fabric, "r1-t4-2")
    await fabric.compose(host, mine, TAG, lambda line: None)
    other = CompositionTag(hub="hub-other", machine="m-22", owner="bob/")
    with pytest.raises(DeviceInUse, match="m-21"):
        await fabric.compose(host, theirs, other, lambda line: None)
    assert (await fabric.inventory()).device("r1-t4-2").state == "free"  # type: ignore[union-attr]
    # Nor does a release for the other machine touch ours.
    assert await fabric.decompose(host, ["r1-t4-1"], other) is False
    assert (await fabric.inventory()).device("r1-t4-1").state == "attached"  # type: ignore[union-attr]


async def test_devices_of_another_rack_are_an_incompatible_zone(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    host = host_id(simulator, "host-04")
    devices = await devices_of(fabric, "r1-a100-2", "r2-h100-1")
    with pytest.raises(IncompatibleZone):
        await fabric.compose(host, devices, TAG, lambda line: None)
    if simulator.composition != "expandable":  # all or nothing: nothing taken
        inventory = await fabric.inventory()
        assert inventory.device("r1-a100-2").state == "free"  # type: ignore[union-attr]
        assert inventory.host(host).mark is None  # type: ignore[union-attr]


async def test_a_failing_composition_takes_nothing(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    simulator.switches.faults(fail_after_attachments=1)
    host = host_id(simulator, "host-06")
    devices = await devices_of(fabric, "r2-h100-2", "r2-h100-3")
    with pytest.raises(FabricRefused) as failed:
        await fabric.compose(host, devices, TAG, lambda line: None)
    assert failed.value.status == 500
    if simulator.composition != "expandable":
        assert (await fabric.inventory()).host(host).mark is None  # type: ignore[union-attr]


@only(*(mode for mode in WHOLE_SYSTEM if MODES[mode][1]))
async def test_a_failed_composition_task(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    simulator.switches.faults(task_failure=True)
    host = host_id(simulator, "host-07")
    with pytest.raises(FabricTaskFailed):
        await fabric.compose(host, await devices_of(fabric, "r2-t4-1"), TAG, lambda line: None)
    assert (await fabric.inventory()).host(host).mark is None  # type: ignore[union-attr]


@only(*WHOLE_SYSTEM)
async def test_whole_system_fabrics_refuse_attach_detach_join_and_leave(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    host = host_id(simulator, "host-08")
    for call in (
        fabric.attach(host, "r2-a100-1"),
        fabric.detach(host, "r2-a100-1"),
        fabric.join_host(host, TAG),
        fabric.leave_host(host, TAG),
    ):
        with pytest.raises(FabricRefused, match="composes whole systems"):
            await call


# --- shared hosts: several machines of one hub on one host -----------------------------------

ADA = CompositionTag(hub="hub-test", machine="m-31", owner="ada/course")
BOB = CompositionTag(hub="hub-test", machine="m-32", owner="bob/course")


def machines_on(simulator: RunningSimulator, system: str) -> list[str]:
    """The machines the simulator's state lists on a system's mark, in order."""
    state = simulator.switches.state()
    entry = state["hosts"].get(system) or state["composed"].get(system) or {}
    mark = entry.get("tag") or {}
    return [m["Machine"] for m in mark.get("Machines", [])]


@only(*EXPANDABLE)
async def test_two_machines_share_a_host_and_each_takes_only_its_own_devices(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    ada, bob = (
        await devices_of(fabric, "r1-a100-1", "r1-nvme-1"),
        await devices_of(fabric, "r1-t4-1"),
    )
    await fabric.compose("host-01", ada, ADA, lambda line: None)
    await fabric.compose("host-01", bob, BOB, lambda line: None)
    host = (await fabric.inventory()).host("host-01")
    assert host is not None
    assert host.mark == HostMark("hub-test", (ADA, BOB))
    assert set(host.attached) == {"r1-a100-1", "r1-nvme-1", "r1-t4-1"}

    # Ada's release detaches her devices alone; Bob stays on the mark with his.
    assert await fabric.decompose("host-01", ["r1-a100-1", "r1-nvme-1"], ADA) is True
    mark, linked = await fabric.host_mark("host-01")
    assert mark == HostMark("hub-test", (BOB,))
    assert set(linked) == {"host-01-block", "r1-t4-1"}
    assert await fabric.decompose("host-01", ["r1-a100-1", "r1-nvme-1"], ADA) is False

    # The last machine's release takes the mark with it.
    assert await fabric.decompose("host-01", ["r1-t4-1"], BOB) is True
    assert await fabric.host_mark("host-01") == (None, ("host-01-block",))
    assert simulator.switches.state()["hosts"]["host-01"] == {"attached": [], "tag": None}


@only(*EXPANDABLE)
async def test_machines_joining_one_host_at_once_are_all_on_its_mark(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    # Three clients (nothing remembered between them), two machines each: every
    # join reads, then writes against the ETag it read; the losers read again.
    clients = [fabric, simulator.client(simulator.tls.ca_bundle)]
    clients.append(simulator.client(simulator.tls.ca_bundle))
    tags = [CompositionTag("hub-test", f"m-4{n}", f"user{n}/") for n in range(6)]
    try:
        await asyncio.gather(
            *(clients[n % 3].join_host("host-02", tag) for n, tag in enumerate(tags))
        )
        assert sorted(machines_on(simulator, "host-02")) == sorted(t.machine for t in tags)
        # And all leaving at once leave no one behind, and no mark.
        await asyncio.gather(
            *(clients[n % 3].leave_host("host-02", tag) for n, tag in enumerate(tags[:5]))
        )
        assert machines_on(simulator, "host-02") == [tags[5].machine]
    finally:
        for client in clients[1:]:
            await client.close()


@only(*EXPANDABLE)
async def test_a_join_whose_etags_stay_stale_changes_nothing(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    await fabric.join_host("host-02", ADA)
    simulator.switches.faults(stale_etags=True)
    with pytest.raises(StaleETag):
        await fabric.join_host("host-02", BOB)
    with pytest.raises(StaleETag):
        await fabric.leave_host("host-02", ADA)
    simulator.switches.clear_faults()
    assert machines_on(simulator, "host-02") == [ADA.machine]  # nobody lost, nobody added


@only(*EXPANDABLE)
async def test_a_host_of_another_hub_or_client_is_refused_and_left_untouched(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    theirs = CompositionTag(hub="hub-other", machine="m-9", owner="eve/")
    await fabric.join_host("host-03", theirs)
    await fabric.attach("host-03", "r1-t4-2")
    before = simulator.switches.state()["hosts"]["host-03"]
    with pytest.raises(DeviceInUse, match="hub-other"):
        await fabric.join_host("host-03", ADA)
    with pytest.raises(DeviceInUse, match="hub-other"):
        await fabric.compose("host-03", await devices_of(fabric, "r1-t4-3"), ADA, ignore)
    assert await fabric.decompose("host-03", ["r1-t4-2"], ADA) is False
    # Another client's composition: devices attached, no mark of ours.
    await fabric.attach("host-04", "r1-l40s-1")
    with pytest.raises(DeviceInUse, match="another client"):
        await fabric.join_host("host-04", ADA)
    state = simulator.switches.state()["hosts"]
    assert state["host-03"] == before
    assert state["host-04"] == {"attached": ["r1-l40s-1"], "tag": None}


@only(*EXPANDABLE)
async def test_leaving_a_host_one_is_not_on_writes_nothing(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    await fabric.join_host("host-05", ADA)
    etag = raw_etag(simulator, "host-05")
    await fabric.leave_host("host-05", BOB)  # never joined
    await fabric.leave_host("host-06", BOB)  # no mark at all
    assert raw_etag(simulator, "host-05") == etag
    assert machines_on(simulator, "host-05") == [ADA.machine]
    assert simulator.switches.state()["hosts"]["host-06"]["tag"] is None


def ignore(line: str) -> None:
    """Progress lines no test here reads."""


def raw_etag(simulator: RunningSimulator, system: str) -> str:
    """The system's ETag as a GET shows it now (a write changes it)."""
    answer = requests.get(
        f"{simulator.url}/redfish/v1/Systems/{system}",
        auth=(USER, PASSWORD),
        verify=str(simulator.tls.ca_bundle),
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    etag: str = answer.json()["@odata.etag"]
    return etag


# --- shared composed systems (specific composition, the Compose action) ----------------------


def composed_systems(simulator: RunningSimulator) -> dict[str, dict[str, object]]:
    composed: dict[str, dict[str, object]] = simulator.switches.state()["composed"]
    return composed


@only(*WHOLE_SYSTEM)
async def test_two_machines_share_a_composed_system(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    ada, bob = (
        await devices_of(fabric, "r1-a100-1", "r1-nvme-1"),
        await devices_of(fabric, "r1-t4-1"),
    )
    first = await fabric.compose("host-01-block", ada, ADA, ignore)
    second = await fabric.compose("host-01-block", bob, BOB, ignore)
    assert second == first  # one system, both machines on it
    assert await fabric.compose("host-01-block", bob, BOB, ignore) == first  # a retry: found
    system = composed_systems(simulator)[first]
    assert system["blocks"] == ["host-01-block", "r1-a100-1", "r1-nvme-1", "r1-t4-1"]
    assert machines_on(simulator, first) == [ADA.machine, BOB.machine]
    host = (await fabric.inventory()).host("host-01-block")
    assert host is not None
    assert (host.mark, host.cpus, host.memory_gib) == (HostMark("hub-test", (ADA, BOB)), 64, 512)
    # The service said its composed systems' blocks may change: a shareable host.
    assert host.shareable is True

    # Ada's release takes her blocks out; the system stays with Bob's.
    assert await fabric.decompose("host-01-block", ["r1-a100-1", "r1-nvme-1"], ADA) is True
    assert composed_systems(simulator)[first]["blocks"] == ["host-01-block", "r1-t4-1"]
    assert machines_on(simulator, first) == [BOB.machine]
    assert await fabric.decompose("host-01-block", ["r1-a100-1", "r1-nvme-1"], ADA) is False
    inventory = await fabric.inventory()
    assert inventory.device("r1-a100-1").state == "free"  # type: ignore[union-attr]
    # The last machine's release deletes the system.
    assert await fabric.decompose("host-01-block", ["r1-t4-1"], BOB) is True
    assert composed_systems(simulator) == {}
    assert await fabric.host_mark("host-01-block") == (None, ("host-01-block",))


@only(*WHOLE_SYSTEM)
async def test_machines_composing_on_one_host_at_once_all_keep_their_blocks(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    # Four machines, two clients: one creates the system, the others join it; each
    # join or POST that loses to another reads the system again.
    gpus = ["r2-t4-1", "r2-t4-2", "r2-a100-1", "r2-a100-2"]
    devices = await devices_of(fabric, *gpus)
    tags = [CompositionTag("hub-test", f"m-5{n}", f"user{n}/") for n in range(4)]
    other = simulator.client(simulator.tls.ca_bundle)
    clients = [fabric, other]
    try:
        systems = await asyncio.gather(
            *(
                clients[n % 2].compose("host-05-block", [device], tag, ignore)
                for n, (device, tag) in enumerate(zip(devices, tags, strict=True))
            )
        )
        assert len(set(systems)) == 1
        (system_id,) = set(systems)
        composed = composed_systems(simulator)
        assert list(composed) == [system_id]
        assert sorted(composed[system_id]["blocks"]) == sorted(["host-05-block", *gpus])  # type: ignore[arg-type]
        assert sorted(machines_on(simulator, system_id)) == sorted(t.machine for t in tags)
        # Releasing three at once leaves the fourth with its own block, on the mark.
        await asyncio.gather(
            *(clients[n % 2].decompose("host-05-block", [gpus[n]], tags[n]) for n in range(3))
        )
        composed = composed_systems(simulator)
        assert composed[system_id]["blocks"] == ["host-05-block", gpus[3]]
        assert machines_on(simulator, system_id) == [tags[3].machine]
    finally:
        await other.close()


@only(*WHOLE_SYSTEM)
async def test_a_shared_system_whose_etags_stay_stale_is_left_as_it_was(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    ada, bob = await devices_of(fabric, "r1-l40s-1"), await devices_of(fabric, "r1-l40s-2")
    first = await fabric.compose("host-02-block", ada, ADA, ignore)
    before = composed_systems(simulator)
    simulator.switches.faults(stale_etags=True)
    with pytest.raises(StaleETag):
        await fabric.compose("host-02-block", bob, BOB, ignore)  # the join: PATCH
    with pytest.raises(StaleETag):
        await fabric.decompose("host-02-block", ["r1-l40s-1"], ADA)  # the last: DELETE
    simulator.switches.clear_faults()
    assert composed_systems(simulator) == before
    assert machines_on(simulator, first) == [ADA.machine]


@only(*WHOLE_SYSTEM)
async def test_joining_with_a_device_another_system_holds_is_refused_whole(
    simulator: RunningSimulator, fabric: RedfishFabric
) -> None:
    first = await fabric.compose(
        "host-03-block", await devices_of(fabric, "r1-nvme-2"), ADA, ignore
    )
    eve = CompositionTag("hub-test", "m-39", "eve/")
    await fabric.compose("host-04-block", await devices_of(fabric, "r1-t4-3"), eve, ignore)
    before = composed_systems(simulator)
    taken = await devices_of(fabric, "r1-a100-2", "r1-t4-3")  # the T4 is Eve's now
    with pytest.raises(DeviceInUse):
        await fabric.compose("host-03-block", taken, BOB, ignore)
    assert composed_systems(simulator) == before  # one write, refused: nothing of it done
    assert machines_on(simulator, first) == [ADA.machine]


# --- TLS ---------------------------------------------------------------------------------


async def test_a_certificate_from_an_unknown_ca_is_refused_at_once(
    simulator: RunningSimulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The system's CAs, and a CA bundle of another CA: neither signed the simulator's
    # certificate. RETRY allows 10 tries: a certificate error must use none of them.
    caplog.set_level(logging.DEBUG, logger="composespawner.fabric.redfish")
    stranger = make_tls_files(tmp_path).ca_bundle
    for ca_bundle in (None, stranger):
        client = simulator.client(ca_bundle)
        try:
            with pytest.raises(FabricCertificateError) as refused:
                await client.inventory()
        finally:
            await client.close()
        message = str(refused.value)
        assert simulator.url in message
        assert "certificate verify failed" in message
        assert "CA bundle" in message
        assert isinstance(refused.value, FabricUnreachable)  # unknown, never "free"
    assert "trying again" not in caplog.text


async def test_the_ca_bundle_knob_makes_it_trusted(simulator: RunningSimulator) -> None:
    simulator.switches.reset()
    client = simulator.client(simulator.tls.ca_bundle)
    try:
        inventory = await client.inventory()
    finally:
        await client.close()
    assert len(inventory.hosts) == 8


def test_an_unusable_ca_bundle_is_refused_when_configured(tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    for path in (tmp_path / "missing.pem", not_pem):
        with pytest.raises(ValueError, match="as a CA bundle"):
            RedfishFabric(
                "https://127.0.0.1:1", username=USER, password=PASSWORD, ca_bundle=str(path)
            )


async def test_the_spawner_passes_its_ca_bundle_to_the_client(
    simulator: RunningSimulator, tmp_path: Path
) -> None:
    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade_ledger(ledger_url)
    spawner = ComposeSpawner(
        fabric_url=simulator.url,
        fabric_ca_bundle=str(simulator.tls.ca_bundle),
        fabric_username=USER,
        fabric_password=PASSWORD,
        ledger_url=ledger_url,
        catalog_file=str(CATALOG_FILE),
        hub_id="tls-test",
    )
    composer = build_composer(spawner, spawner.log)  # this test's own, not the hub's shared one
    try:
        inventory = await composer.fabric.inventory()
    finally:
        await composer.close()
    assert len(inventory.hosts) == 8


@pytest.mark.parametrize("with_bundle", [True, False], ids=["ca-bundle", "system-cas"])
def test_the_reconciler_reads_the_ca_bundle_from_the_hubs_config(
    simulator: RunningSimulator, tmp_path: Path, with_bundle: bool
) -> None:
    config = tmp_path / "jupyterhub_config.py"
    settings = {
        "fabric_url": simulator.url,
        "catalog_file": str(CATALOG_FILE),
        "ledger_url": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        "hub_id": "tls-test",
        "fabric_ca_bundle": str(simulator.tls.ca_bundle) if with_bundle else "",
    }
    config.write_text("".join(f"c.ComposeSpawner.{k} = {v!r}\n" for k, v in settings.items()))
    upgrade_ledger(settings["ledger_url"])
    command = [
        sys.executable, "-c",
        "import sys; from composespawner.commands.cli import main; sys.exit(main())",
        "reconcile", "--once", "-f", str(config),
    ]  # fmt: skip
    environment = {
        **os.environ, "COMPOSE_FABRIC_USERNAME": USER, "COMPOSE_FABRIC_PASSWORD": PASSWORD
    }  # fmt: skip
    for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN"):
        environment.pop(name, None)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fabric_reachable"] is with_bundle
    if not with_bundle:
        assert "certificate" in done.stderr
