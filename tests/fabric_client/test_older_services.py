"""The Redfish client against services older or looser than DMTF's current mockups.

Issue 27, item 6: what the client met in services built before (or more
loosely than) the mockups it was written against, DMTF's Redfish Interface
Emulator among them. Each test starts the simulator with the switch that makes
it answer that way (``fabricsim/quirks.py``), over plain http: the switches
have nothing to do with TLS, which ``test_against_simulator.py`` covers.

(a) composition by POST to Systems advertised on each ResourceZone's
    ``Links.CapabilitiesObjects`` only (``--zone-capabilities``);
(b) a system that is not expandable (``--not-expandable``): refused before
    any mark is written on it;
(c) blocks that keep reading ``Unused`` while a system holds them
    (``--stale-block-status``): what a system links is in use;
(d) error answers that are no Redfish error object (``--error-bodies``):
    their body, cut short, is the message;
(e) composed systems that keep their blocks until deleted
    (``--composed-blocks-read-only``): one machine per composed system.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from composespawner.domain.hardware import CompositionTag, Device
from composespawner.fabric.base import DeviceInUse, FabricRefused, NotExpandable
from composespawner.fabric.redfish import RedfishFabric, RedfishRetry, RedfishTimeouts
from harness.simulator import SimulatorProcess

USER, PASSWORD = "hub-client", "sim-pass-7"
TIMEOUTS = RedfishTimeouts(connect=2, request=3, operation=15, task_poll_max=0.2)
RETRY = RedfishRetry(attempts=10, backoff_first=0.1, backoff_max=0.3)
TAG = CompositionTag(hub="hub-test", machine="m-31", owner="ada/thesis")
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
RAW_TIMEOUT_S = 10.0
# The most an error message may grow by a body that is no Redfish error.
MESSAGE_BOUND = 400


def switched(*cases: tuple[str, ...]) -> pytest.MarkDecorator:
    """Run a test against simulators started with each of these switch sets."""
    return pytest.mark.parametrize(
        "simulator", cases, indirect=True, ids=[" ".join(c).lstrip("-") for c in cases]
    )


@pytest.fixture
def simulator(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SimulatorProcess]:
    args = ["--faults-api", *request.param]
    process = SimulatorProcess(args, tmp_path / "simulator.log", credentials=(USER, PASSWORD))
    with process:
        yield process


def client_of(simulator: SimulatorProcess) -> RedfishFabric:
    return RedfishFabric(
        simulator.url, username=USER, password=PASSWORD, timeouts=TIMEOUTS, retry=RETRY
    )


@pytest.fixture
async def fabric(simulator: SimulatorProcess) -> AsyncIterator[RedfishFabric]:
    client = client_of(simulator)
    yield client
    await client.close()


def raw(simulator: SimulatorProcess, method: str, path: str, **kwargs: Any) -> requests.Response:
    """One request of another client, past ours: to see what the service itself says."""
    return requests.request(
        method, simulator.url + path, auth=(USER, PASSWORD), timeout=RAW_TIMEOUT_S, **kwargs
    )


async def devices_of(fabric: RedfishFabric, *block_ids: str) -> list[Device]:
    inventory = await fabric.inventory()
    found = [inventory.device(b) for b in block_ids]
    assert all(found), found
    return [d for d in found if d is not None]


def ignore(line: str) -> None:
    """Progress lines, unread here."""


# --- (a) composition advertised on the resource zones -----------------------------------------


@switched(("--composition", "specific", "--zone-capabilities"))
async def test_composition_advertised_on_the_resource_zones_is_found(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    systems = raw(simulator, "GET", "/redfish/v1/Systems").json()
    assert "@Redfish.CollectionCapabilities" not in systems  # the switch is on

    inventory = await fabric.inventory()
    # Free compute blocks are the hosts: the client knows it composes whole systems.
    assert [h.system_id for h in inventory.hosts] == [f"host-0{n}-block" for n in range(1, 9)]
    devices = await devices_of(fabric, "r1-a100-1")
    system_id = await fabric.compose("host-01-block", devices, TAG, ignore)

    composed = simulator.switches.state()["composed"]
    assert list(composed) == [system_id]
    assert composed[system_id]["blocks"] == ["host-01-block", "r1-a100-1"]
    assert await fabric.decompose("host-01-block", ["r1-a100-1"], TAG) is True
    assert simulator.switches.state()["composed"] == {}


# --- (b) a system that is not expandable ---------------------------------------------------------


@switched(("--not-expandable", "host-08"))
async def test_a_host_that_is_not_expandable_is_refused_before_it_is_marked(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    inventory = await fabric.inventory()
    assert "host-08" not in {h.system_id for h in inventory.hosts}  # never offered
    devices = await devices_of(fabric, "r2-t4-1")
    lines: list[str] = []

    with pytest.raises(FabricRefused) as refused:
        await fabric.compose("host-08", devices, TAG, lines.append)
    # Nothing was written on it: no mark, no device, not a line of progress.
    assert simulator.switches.state()["hosts"]["host-08"] == {"attached": [], "tag": None}
    assert not raw(simulator, "GET", "/redfish/v1/Systems/host-08").json().get("Oem")
    assert isinstance(refused.value, NotExpandable)
    assert "host-08" in str(refused.value)
    with pytest.raises(NotExpandable, match="host-08"):
        await fabric.join_host("host-08", TAG)
    with pytest.raises(NotExpandable, match="host-08"):
        await fabric.attach("host-08", "r2-t4-1")
    assert simulator.switches.state()["hosts"]["host-08"] == {"attached": [], "tag": None}
    assert lines == []
    await fabric.leave_host("host-08", TAG)  # leaving a mark one is not on is never refused
    # The hosts beside it compose as before.
    assert await fabric.compose("host-07", devices, TAG, lines.append) == "host-07"
    assert simulator.switches.state()["hosts"]["host-07"]["attached"] == ["r2-t4-1"]


# --- (c) blocks whose status stays Unused -------------------------------------------------------


@switched(("--stale-block-status",), ("--composition", "specific", "--stale-block-status"))
async def test_a_device_in_a_composed_system_is_in_use_whatever_its_block_says(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    specific = "specific" in simulator.command
    host = "host-01-block" if specific else "host-01"
    devices = await devices_of(fabric, "r1-a100-1", "r1-nvme-1")
    await fabric.compose(host, devices, TAG, ignore)
    block = raw(simulator, "GET", f"{BLOCKS}/r1-a100-1").json()
    assert block["CompositionStatus"]["CompositionState"] == "Unused"  # the switch is on
    assert block["Links"]["ComputerSystems"] == []

    other = client_of(simulator)  # a fresh client: nothing remembered of the compose
    try:
        inventory = await other.inventory()
    finally:
        await other.close()
    for device in devices:
        found = inventory.device(device.block_id)
        assert found is not None
        assert (found.state, found.attached_to) == ("attached", host)
    assert inventory.device("r1-a100-2").state == "free"  # type: ignore[union-attr]


@switched(("--composition", "specific", "--stale-block-status"))
async def test_a_compute_block_in_someone_elses_system_is_unavailable_whatever_it_says(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    blocks = [{"@odata.id": f"{BLOCKS}/{b}"} for b in ("host-02-block", "r1-l40s-1")]
    created = raw(
        simulator,
        "POST",
        "/redfish/v1/Systems",
        json={"Name": "theirs", "Links": {"ResourceBlocks": blocks}},
    )
    assert created.status_code == 201, created.text

    inventory = await fabric.inventory()
    host = inventory.host("host-02-block")
    assert host is not None
    assert (host.state, host.mark, host.attached) == ("unavailable", None, ("r1-l40s-1",))
    device = inventory.device("r1-l40s-1")
    assert device is not None
    assert (device.state, device.attached_to) == ("attached", "host-02-block")


# --- (d) error answers that are no Redfish error ------------------------------------------------


@switched(*(("--error-bodies", shape) for shape in ("text", "html", "json")))
async def test_an_error_body_that_is_no_redfish_error_is_shown_cut_short(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    answer = raw(
        simulator, "POST", "/redfish/v1/Systems/host-01/Actions/ComputerSystem.AddResourceBlock",
        json={"ResourceBlock": {"@odata.id": f"{BLOCKS}/r2-h100-1"}},
    )  # fmt: skip
    assert answer.status_code == 400
    assert "@Message.ExtendedInfo" not in answer.text  # the switch is on

    with pytest.raises(FabricRefused) as refused:
        await fabric.attach("host-01", "r2-h100-1")  # a block of another rack

    message = str(refused.value)
    assert refused.value.status == 400
    assert "no details" not in message
    assert "The requested resource blocks span multiple resource zones." in message
    assert len(message) < MESSAGE_BOUND, message


# --- (e) composed systems whose blocks cannot change ---------------------------------------------

ASYNC_ACTION = ("--composition", "action", "--async-tasks", "--task-duration", "0.1")


@switched(
    ("--composition", "specific", "--composed-blocks-read-only"),
    (*ASYNC_ACTION, "--composed-blocks-read-only"),
)
async def test_a_system_whose_blocks_cannot_change_carries_one_machine(
    simulator: SimulatorProcess, fabric: RedfishFabric
) -> None:
    ada, bob = await devices_of(fabric, "r1-a100-1"), await devices_of(fabric, "r1-t4-1")
    system_id = await fabric.compose("host-01-block", ada, TAG, ignore)
    host = (await fabric.inventory()).host("host-01-block")
    assert host is not None
    assert host.shareable is False  # the system said its blocks are not writable
    before = simulator.switches.state()["composed"]

    other = CompositionTag(hub="hub-test", machine="m-32", owner="bob/")
    fresh = client_of(simulator)  # nothing learned of the service yet
    try:
        for client in (fabric, fresh):
            with pytest.raises(DeviceInUse, match="m-31 of ada/thesis") as refused:
                await client.compose("host-01-block", bob, other, ignore)
            assert "one machine" in str(refused.value)
    finally:
        await fresh.close()
    assert simulator.switches.state()["composed"] == before  # nothing written
    assert (await fabric.inventory()).device("r1-t4-1").state == "free"  # type: ignore[union-attr]
    # Its machine's release deletes it, as before.
    assert await fabric.decompose("host-01-block", ["r1-a100-1"], TAG) is True
    assert simulator.switches.state()["composed"] == {}
    assert system_id not in raw(simulator, "GET", "/redfish/v1/Systems").text
