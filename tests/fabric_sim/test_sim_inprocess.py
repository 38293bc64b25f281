"""InProcessFabric: the Fabric protocol over the state model, refusing what HTTP refuses."""

from __future__ import annotations

import pytest

from composespawner.domain.hardware import CompositionTag, HostMark
from composespawner.fabric.base import DeviceNotFound, Fabric, FabricUnreachable
from harness.simulator import INVENTORY
from tests.support.inprocess import InProcessFabric

from .sim_cases import ADD, REFUSALS, RefusalCase

TAG = CompositionTag(hub="hub-a", machine="m-9", owner="dave/gpu")


@pytest.fixture
def fabric() -> InProcessFabric:
    return InProcessFabric.from_inventory(INVENTORY)


def test_it_is_a_fabric(fabric: InProcessFabric) -> None:
    assert isinstance(fabric, Fabric)


async def test_inventory_snapshot(fabric: InProcessFabric) -> None:
    await fabric.attach("host-01", "r1-a100-2")
    fabric.state.set_disabled(["r1-nvme-1", "host-08-block"])
    inventory = await fabric.inventory()
    assert inventory.zones == ("rack-1", "rack-2")
    assert len(inventory.hosts) == 8
    assert len(inventory.devices) == 50
    host = inventory.host("host-01")
    assert host is not None
    assert (host.block_id, host.zones, host.attached) == (
        "host-01-block",
        frozenset({"rack-1"}),
        ("r1-a100-2",),
    )
    assert inventory.host("host-08").state == "unavailable"  # type: ignore[union-attr]
    gpu = inventory.device("r1-a100-2")
    assert gpu is not None
    assert (gpu.state, gpu.attached_to, gpu.memory_gib) == ("attached", "host-01", 80)
    assert inventory.device("r1-nvme-1").state == "unavailable"  # type: ignore[union-attr]
    nic = inventory.device("r2-nic25-1")
    assert nic is not None
    assert (nic.state, nic.speed_gbps, nic.model) == ("free", 25, "BCM57414 25GbE")
    drive = inventory.device("r1-nvme-2")
    assert drive is not None
    assert drive.capacity_gb == 1920


async def test_attach_detach_idempotent(fabric: InProcessFabric) -> None:
    await fabric.attach("host-02", "r1-t4-1")
    await fabric.attach("host-02", "r1-t4-1")
    assert fabric.state.attached("host-02") == ("r1-t4-1",)
    await fabric.detach("host-02", "r1-t4-1")
    await fabric.detach("host-02", "r1-t4-1")
    assert fabric.state.attached("host-02") == ()


async def test_join_and_leave_host(fabric: InProcessFabric) -> None:
    other = CompositionTag(hub="hub-a", machine="m-10", owner="erin/")
    await fabric.join_host("host-03", TAG)
    await fabric.join_host("host-03", TAG)  # a retry changes nothing
    await fabric.join_host("host-03", other)
    host = (await fabric.inventory()).host("host-03")
    assert host is not None
    assert host.mark == HostMark("hub-a", (TAG, other))
    await fabric.leave_host("host-03", TAG)
    assert fabric.mark("host-03") == HostMark.of(other)
    await fabric.leave_host("host-03", other)
    assert fabric.state.tag("host-03") is None  # the last machine gone: no mark
    with pytest.raises(DeviceNotFound):
        await fabric.join_host("host-99", TAG)


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.name)
async def test_refusals_match_the_simulator(fabric: InProcessFabric, case: RefusalCase) -> None:
    for system_id, block_id in case.attached_first:
        await fabric.attach(system_id, block_id)
    fabric.state.set_disabled(case.disabled)
    before = {h.id: fabric.state.attached(h.id) for h in fabric.state.inventory.hosts}
    call = fabric.attach if case.action == ADD else fabric.detach
    with pytest.raises(case.fabric_error) as raised:
        await call(case.system_id, case.block_id)
    assert type(raised.value) is case.fabric_error
    assert (raised.value.status, raised.value.message_ids) == (case.status, (case.message_id,))
    after = {h.id: fabric.state.attached(h.id) for h in fabric.state.inventory.hosts}
    assert after == before


async def test_use_after_close_is_caught(fabric: InProcessFabric) -> None:
    await fabric.close()
    with pytest.raises(FabricUnreachable):
        await fabric.inventory()
    with pytest.raises(FabricUnreachable):
        await fabric.attach("host-01", "r1-t4-1")
