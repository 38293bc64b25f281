"""The switches that make the simulator an older or looser Redfish service (fabricsim/quirks.py).

Each is checked here for what the service then answers; how the client copes
with each is ``tests/fabric_client/test_older_services.py``.
"""

from __future__ import annotations

import json

import pytest

from fabricsim import errors
from fabricsim.__main__ import main
from fabricsim.inventory import InventoryError, load_inventory
from fabricsim.state import FabricState
from harness.simulator import INVENTORY

from .harness import BLOCKS, SYSTEMS, RedfishClient, Response, StartSimulator, poll_monitor

ZONES = "/redfish/v1/CompositionService/ResourceZones"
CAPABILITIES = f"{SYSTEMS}/Capabilities"
TAG = {"Hub": "hub-q", "Machine": "m-5", "Owner": "ada/thesis"}


def refs(*block_ids: str) -> list[dict[str, str]]:
    return [{"@odata.id": f"{BLOCKS}/{b}"} for b in block_ids]


def compose(client: RedfishClient, *block_ids: str) -> int:
    body = {"Name": "theirs", "Links": {"ResourceBlocks": refs(*block_ids)}}
    return client.post(SYSTEMS, body).status


# --- --zone-capabilities -----------------------------------------------------------------------


def test_zone_capabilities_advertise_composition_on_each_zone_only(
    start_simulator: StartSimulator,
) -> None:
    client = start_simulator("--composition", "specific", "--zone-capabilities").client
    assert "@Redfish.CollectionCapabilities" not in client.get(SYSTEMS).json
    zone_uris = [m["@odata.id"] for m in client.get(ZONES).json["Members"]]
    assert len(zone_uris) == 2
    for uri in zone_uris:
        linked = client.get(uri).json["Links"]["CapabilitiesObjects"]
        assert linked == [{"@odata.id": CAPABILITIES}]
    capabilities = client.get(CAPABILITIES)
    assert capabilities.status == 200
    assert capabilities.json["@odata.type"].startswith("#ComputerSystem.")
    assert compose(client, "host-01-block", "r1-t4-1") == 201  # POST works as ever


def test_zones_link_no_capabilities_by_default(start_simulator: StartSimulator) -> None:
    client = start_simulator("--composition", "specific").client
    assert "@Redfish.CollectionCapabilities" in client.get(SYSTEMS).json
    assert "CapabilitiesObjects" not in client.get(f"{ZONES}/rack-1").json["Links"]


def test_zone_capabilities_need_specific_composition() -> None:
    argv = ["--inventory", str(INVENTORY), "--port", "1", "--zone-capabilities"]
    assert main(argv) == 2
    assert main([*argv, "--composition", "action"]) == 2


# --- --not-expandable --------------------------------------------------------------------------


def test_a_host_that_is_not_expandable_takes_no_blocks_but_its_oem(
    start_simulator: StartSimulator,
) -> None:
    client = start_simulator("--faults-api", "--not-expandable", "host-08").client
    system = client.get(f"{SYSTEMS}/host-08")
    assert "Composition" not in system.json
    assert "Actions" not in system.json
    assert "ExpandableSystem" in json.dumps(client.get(f"{SYSTEMS}/host-07").json)

    refused = client.attach("host-08", "r2-t4-1")
    assert refused.status == 400
    assert refused.message_ids == ["Base.1.22.1.ActionNotSupported"]
    etag = system.headers["ETag"]
    patched = client.patch(
        f"{SYSTEMS}/host-08", {"Oem": {"ComposeSpawner": TAG}}, headers={"If-Match": etag}
    )
    assert patched.status == 200  # a fixed server's Oem is as writable as any
    assert client.sim_state()["hosts"]["host-08"] == {"attached": [], "tag": TAG}
    assert client.attach("host-07", "r2-t4-1").status == 204


def test_not_expandable_hosts_are_known_hosts_of_expandable_composition() -> None:
    inventory = load_inventory(INVENTORY)
    with pytest.raises(InventoryError, match="host-99"):
        FabricState(inventory, epoch="e", not_expandable=["host-99"])
    with pytest.raises(InventoryError, match="expandable composition"):
        FabricState(inventory, epoch="e", composition="specific", not_expandable=["host-01"])
    argv = ["--inventory", str(INVENTORY), "--port", "1", "--not-expandable", "host-99"]
    assert main(argv) == 2


def test_a_saved_attachment_to_a_host_no_longer_expandable_is_dropped() -> None:
    inventory = load_inventory(INVENTORY)
    before = FabricState(inventory, epoch="e")
    before.add_resource_block("host-08", "r2-t4-1")
    after = FabricState(inventory, epoch="e", not_expandable=["host-08"])
    problems = after.restore(before.to_json())
    assert problems == ["dropped attachment of 'r2-t4-1' to host-08: it is not expandable"]
    assert after.attached("host-08") == ()
    with pytest.raises(errors.ActionNotSupported):
        after.add_resource_block("host-08", "r2-t4-1")


# --- --stale-block-status ----------------------------------------------------------------------


@pytest.mark.parametrize("composition", ["expandable", "specific"])
def test_stale_block_status_keeps_composed_blocks_reading_unused(
    start_simulator: StartSimulator, composition: str
) -> None:
    client = start_simulator("--composition", composition, "--stale-block-status").client
    if composition == "expandable":
        assert client.attach("host-01", "r1-a100-1").status == 204
        system = client.get(f"{SYSTEMS}/host-01").json
    else:
        assert compose(client, "host-01-block", "r1-a100-1") == 201
        system = client.get(f"{SYSTEMS}/composed-1").json
    assert {"@odata.id": f"{BLOCKS}/r1-a100-1"} in system["Links"]["ResourceBlocks"]
    for block_id in ("r1-a100-1", "host-01-block"):
        block = client.get(f"{BLOCKS}/{block_id}").json
        assert block["CompositionStatus"]["CompositionState"] == "Unused"
        assert block["CompositionStatus"]["NumberOfCompositions"] == 0
        assert block["Links"]["ComputerSystems"] == []
    # The block is taken all the same.
    if composition == "expandable":
        refused = client.attach("host-02", "r1-a100-1")
    else:
        body = {"Name": "second", "Links": {"ResourceBlocks": refs("host-02-block", "r1-a100-1")}}
        refused = client.post(SYSTEMS, body)
    assert refused.status == 409
    assert refused.message_ids == ["Composition.1.1.3.ResourceBlockInUse"]


# --- --error-bodies ----------------------------------------------------------------------------

CONTENT_TYPES = {
    "text": "text/plain; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "json": "application/problem+json",
}


@pytest.mark.parametrize("shape", ["text", "html", "json"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async-tasks"])
def test_error_bodies_that_are_no_redfish_error(
    start_simulator: StartSimulator, shape: str, asynchronous: bool
) -> None:
    args = ["--error-bodies", shape, *(["--async-tasks"] if asynchronous else [])]
    client = start_simulator(*args).client
    missing = client.get(f"{SYSTEMS}/host-99")  # refused by the handler
    assert missing.status == 404
    assert missing.headers["Content-Type"] == CONTENT_TYPES[shape]
    assert f"{SYSTEMS}/host-99" in missing.body.decode()
    assert b"@Message.ExtendedInfo" not in missing.body

    assert finished(client, client.attach("host-01", "r1-t4-1")).status == 204
    in_use = finished(client, client.attach("host-02", "r1-t4-1"))  # refused by the state
    assert in_use.status == 409
    assert in_use.headers["Content-Type"] == CONTENT_TYPES[shape]
    text = in_use.body.decode()
    assert "cannot be part of any new compositions" in text
    assert "@Message.ExtendedInfo" not in text
    if shape == "json":
        problem = json.loads(text)
        assert (problem["status"], problem["title"]) == (409, "Conflict")
        assert "error" not in problem


def finished(client: RedfishClient, answer: Response) -> Response:
    """The final answer of a write: ``answer``, or its task monitor's last word."""
    if answer.status != 202:
        return answer
    return poll_monitor(client, answer.headers["Location"])


def test_redfish_error_bodies_by_default(start_simulator: StartSimulator) -> None:
    client = start_simulator().client
    missing = client.get(f"{SYSTEMS}/host-99")
    assert missing.headers["Content-Type"] == "application/json; charset=utf-8"
    assert missing.message_ids == ["Base.1.22.1.ResourceMissingAtURI"]
    assert client.attach("host-01", "r1-t4-1").status == 204
    refused = client.attach("host-02", "r1-t4-1")
    assert refused.message_ids == ["Composition.1.1.3.ResourceBlockInUse"]
