"""Discovery against DMTF's public-composability mockup, served read-only.

The expected values below are facts of that third-party data set, read from
its files (``shared/redfish/mockups/public-composability``).

The mockup's SessionService cannot create sessions (the server is static, so
POST answers 405): the client must fall back to HTTP Basic auth, which the
mock server here demands on every resource but the service root.
"""

from __future__ import annotations

import logging
import re

import pytest

from composespawner.domain.hardware import Device, Host
from composespawner.fabric.base import Fabric, FabricAuthError, FabricRefused
from composespawner.fabric.redfish import RedfishFabric
from composespawner.fabric.redfish import discovery as redfish_discovery
from tests.support.mockserver import MockupServer

from .conftest import COMPOSABILITY_MOCKUP, FAST_RETRY, FAST_TIMEOUTS, MOCKUP_CREDENTIALS

ZONES_12 = frozenset({"1", "2"})
# The mockup's Systems collection advertises ComputerSystemComposition (POST of
# whole systems), so besides its expandable systems its compute blocks are hosts,
# and a device in a composed system is attached to that system's compute block.

EXPECTED_DEVICES = (
    Device("DriveBlock3", "nvme", "NVMe Drive Slot 0", ZONES_12, "ComposableModule3", "attached",
           attached_to="ComputeBlock1", capacity_gb=274),
    Device("DriveBlock4", "nvme", "NVMe Drive Slot 1", ZONES_12, "ComposableModule3", "attached",
           attached_to="ComputeBlock1", capacity_gb=274),
    Device("DriveBlock5", "nvme", "NVMe Drive Slot 2", ZONES_12, "ComposableModule3", "free",
           capacity_gb=274),
    Device("DriveBlock6", "nvme", "NVMe Drive Slot 3", ZONES_12, "ComposableModule3", "free",
           capacity_gb=274),
    Device("NetworkBlock8", "nic", "Network Block 8", frozenset({"2"}), "ComposableModule5",
           "attached", attached_to="ComputeBlock2", speed_gbps=0),
    Device("OffloadBlock9", "gpu", "Contoso Workstation VID2000", frozenset({"2"}),
           "ComposableModule6", "free"),
    Device("DriveBlock10", "nvme", "NVMe Drive Slot 4", frozenset({"3"}), "ComposableModule7",
           "attached", attached_to="SystemAfterAddResourceAction", capacity_gb=274),
)  # fmt: skip

EXPECTED_HOSTS = (
    Host("SystemAfterResourceBlock", "SystemBlock11", frozenset({"3"}), 0, 0, "enabled"),
    Host("SystemAfterAddResourceAction", "SystemBlock12", frozenset({"3"}), 0, 0, "enabled",
         attached=("DriveBlock10",)),
    # Composed by someone else (no mark of ours): not available. Each block's own CPUs
    # (2 of 8 cores) and DIMMs (4 of 8 GiB) give its capacity; its systems do not say
    # whether their blocks may change, so no machines share them.
    Host("ComputeBlock1", "ComputeBlock1", frozenset({"1"}), 16, 32, "unavailable",
         attached=("DriveBlock3", "DriveBlock4"), shareable=False),
    Host("ComputeBlock2", "ComputeBlock2", frozenset({"2"}), 16, 32, "unavailable",
         attached=("DriveBlock3", "NetworkBlock8"), shareable=False),
)  # fmt: skip


def client_for(server: MockupServer, password: str = MOCKUP_CREDENTIALS[1]) -> RedfishFabric:
    return RedfishFabric(
        server.url,
        username=MOCKUP_CREDENTIALS[0],
        password=password,
        timeouts=FAST_TIMEOUTS,
        retry=FAST_RETRY,
    )


@pytest.mark.parametrize("expand", [True, False], ids=["expanded", "member-by-member"])
async def test_inventory_of_the_dmtf_composability_mockup(
    mockup_server: MockupServer, expand: bool
) -> None:
    mockup_server.expand = expand
    fabric = client_for(mockup_server)
    try:
        inventory = await fabric.inventory()
    finally:
        await fabric.close()

    assert inventory.zones == ("1", "2", "3")
    assert inventory.devices == EXPECTED_DEVICES
    assert inventory.hosts == EXPECTED_HOSTS
    gpu = inventory.device("OffloadBlock9")
    assert gpu is not None
    assert (gpu.kind, gpu.model, gpu.state, gpu.zones) == (
        "gpu", "Contoso Workstation VID2000", "free", frozenset({"2"})
    )  # fmt: skip


async def test_compute_and_sas_blocks_are_not_devices(mockup_server: MockupServer) -> None:
    fabric = client_for(mockup_server)
    try:
        inventory = await fabric.inventory()
    finally:
        await fabric.close()
    ids = {d.block_id for d in inventory.devices}
    # ComputeBlock1 carries an onboard NIC but is CPUs + memory; DriveBlock7 is a SAS tray.
    assert not ids & {"ComputeBlock1", "ComputeBlock2", "DriveBlock7", "SystemBlock11"}
    assert sorted(d.kind for d in inventory.devices) == ["gpu", "nic", *["nvme"] * 5]


async def test_expand_is_used_when_the_service_root_offers_it(
    mockup_server: MockupServer,
) -> None:
    fabric = client_for(mockup_server)
    try:
        await fabric.inventory()
    finally:
        await fabric.close()
    # The mockup allows 6 levels: blocks come with their parts and the drives
    # behind Storage (3 levels), zones and systems with their members (1).
    assert _listings(mockup_server) == [
        "/redfish/v1/CompositionService/ResourceBlocks?$expand=.($levels=3)",
        "/redfish/v1/CompositionService/ResourceZones?$expand=.($levels=1)",
        "/redfish/v1/Systems?$expand=.($levels=1)",
    ]
    gets = [uri for method, uri in mockup_server.requests if method == "GET"]
    # Members and parts came inline: no block, part or system was fetched on its own.
    assert "/redfish/v1/CompositionService/ResourceBlocks/OffloadBlock9" not in gets
    assert "/redfish/v1/Systems/ComposedSystem" not in gets
    assert _part_reads(mockup_server) == []


async def test_member_by_member_when_expand_is_ignored(mockup_server: MockupServer) -> None:
    mockup_server.expand = False
    fabric = client_for(mockup_server)
    try:
        await fabric.inventory()
    finally:
        await fabric.close()
    gets = {uri for method, uri in mockup_server.requests if method == "GET"}
    assert "/redfish/v1/CompositionService/ResourceBlocks/OffloadBlock9" in gets
    assert "/redfish/v1/Systems/SystemAfterAddResourceAction" in gets


async def test_falls_back_to_basic_auth_when_sessions_are_refused(
    mockup_server: MockupServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="composespawner.fabric.redfish")
    fabric = client_for(mockup_server)
    try:
        inventory = await fabric.inventory()
    finally:
        await fabric.close()
    assert inventory.devices
    assert ("POST", "/redfish/v1/SessionService/Sessions") in mockup_server.requests
    assert "HTTP Basic" in caplog.text
    assert MOCKUP_CREDENTIALS[1] not in caplog.text


async def test_wrong_basic_credentials_are_an_auth_error(mockup_server: MockupServer) -> None:
    fabric = client_for(mockup_server, password="wrong")
    try:
        with pytest.raises(FabricAuthError) as refused:
            await fabric.inventory()
    finally:
        await fabric.close()
    assert refused.value.status == 401
    assert "wrong" not in str(refused.value)


async def test_writes_to_the_read_only_mockup_are_refused(mockup_server: MockupServer) -> None:
    fabric = client_for(mockup_server)
    try:
        with pytest.raises(FabricRefused) as refused:
            await fabric.attach("SystemAfterResourceBlock", "OffloadBlock9")
    finally:
        await fabric.close()
    assert type(refused.value) is FabricRefused
    assert refused.value.status == 405
    assert any(m.endswith("OperationNotAllowed") for m in refused.value.message_ids)


def test_the_client_is_a_fabric() -> None:
    fabric = RedfishFabric("http://127.0.0.1:1", username="u", password="p")
    assert isinstance(fabric, Fabric)
    assert COMPOSABILITY_MOCKUP.is_dir()


def _part_reads(server: MockupServer) -> list[str]:
    """GETs of single resources below a block: the device parts."""
    gets = [uri for method, uri in server.requests if method == "GET"]
    return [u for u in gets if re.search(r"/ResourceBlocks/[^/?]+/", u)]


def _listings(server: MockupServer) -> list[str]:
    """The expanded collection GETs, sorted."""
    return sorted(uri for method, uri in server.requests if method == "GET" and "$expand" in uri)


@pytest.mark.parametrize("expand", [True, False], ids=["expanded", "member-by-member"])
async def test_device_parts_are_read_once_then_remembered(
    mockup_server: MockupServer, expand: bool
) -> None:
    mockup_server.expand = expand
    fabric = client_for(mockup_server)
    try:
        first = await fabric.inventory()
        # Expanded, the parts came inline with their blocks; else one GET each.
        assert bool(_part_reads(mockup_server)) != expand
        mockup_server.requests.clear()
        again = await fabric.inventory()
    finally:
        await fabric.close()
    assert again == first
    assert _part_reads(mockup_server) == []
    # The three collections, one level deep: the parts are known.
    assert _listings(mockup_server) == [
        "/redfish/v1/CompositionService/ResourceBlocks?$expand=.($levels=1)",
        "/redfish/v1/CompositionService/ResourceZones?$expand=.($levels=1)",
        "/redfish/v1/Systems?$expand=.($levels=1)",
    ]


@pytest.mark.parametrize("expand", [True, False], ids=["expanded", "member-by-member"])
async def test_remembered_parts_are_read_again_when_old(
    mockup_server: MockupServer, monkeypatch: pytest.MonkeyPatch, expand: bool
) -> None:
    mockup_server.expand = expand
    monkeypatch.setattr(redfish_discovery, "_PART_MAX_AGE_S", 0.0)
    fabric = client_for(mockup_server)
    try:
        await fabric.inventory()
        read_first = (sorted(_part_reads(mockup_server)), _listings(mockup_server))
        mockup_server.requests.clear()
        await fabric.inventory()
    finally:
        await fabric.close()
    assert (sorted(_part_reads(mockup_server)), _listings(mockup_server)) == read_first
    # Expanded: the parts come inline again; else each is fetched again.
    assert bool(read_first[0]) != expand
