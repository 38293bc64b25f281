"""Specific composition over HTTP: POST to Systems, the Compose action, DELETE to decompose.

Under ``--composition specific`` and ``--composition action`` hosts are free
compute blocks and a system exists only while composed, as in DMTF's
composability mockup; each mode advertises only the way it composes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .harness import (
    BLOCKS,
    SYSTEMS,
    RedfishClient,
    SimulatorProcess,
    StartSimulator,
    action,
    block_ref,
    poll_monitor,
)

COMPOSITION_SERVICE = "/redfish/v1/CompositionService"
COMPOSE = f"{COMPOSITION_SERVICE}/Actions/CompositionService.Compose"
TAG = {"Hub": "hub-s", "Machine": "m-3", "Owner": "ada/thesis"}


def refs(*block_ids: str) -> list[dict[str, str]]:
    return [{"@odata.id": f"{BLOCKS}/{b}"} for b in block_ids]


def create_body(*block_ids: str, tag: dict[str, str] | None = TAG) -> dict[str, Any]:
    body: dict[str, Any] = {"Name": "ada-thesis", "Links": {"ResourceBlocks": refs(*block_ids)}}
    if tag is not None:
        body["Oem"] = {"ComposeSpawner": tag}
    return body


def manifest(*block_ids: str) -> dict[str, Any]:
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": "m-3", "Request": create_body(*block_ids)}
    return {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}


def state_of(client: RedfishClient, block_id: str) -> tuple[str, list[str]]:
    block = client.get(f"{BLOCKS}/{block_id}").json
    holders = [link["@odata.id"] for link in block["Links"]["ComputerSystems"]]
    return block["CompositionStatus"]["CompositionState"], holders


def members(client: RedfishClient) -> list[str]:
    return [m["@odata.id"] for m in client.get(SYSTEMS).json["Members"]]


@pytest.fixture
def specific(start_simulator: StartSimulator, tmp_path: Path) -> SimulatorProcess:
    state = tmp_path / "state.json"
    return start_simulator("--composition", "specific", "--faults-api", "--state-file", str(state))


@pytest.fixture
def with_action(start_simulator: StartSimulator) -> SimulatorProcess:
    return start_simulator("--composition", "action", "--faults-api")


def test_specific_mode_shows_free_compute_blocks_and_no_systems(
    specific: SimulatorProcess,
) -> None:
    client = specific.client
    assert members(client) == []
    block = client.get(f"{BLOCKS}/host-01-block").json
    assert block["ResourceBlockType"] == ["Compute"]
    assert block["CompositionStatus"]["CompositionState"] == "Unused"
    capabilities = client.get(SYSTEMS).json["@Redfish.CollectionCapabilities"]["Capabilities"]
    assert [c["UseCase"] for c in capabilities] == ["ComputerSystemComposition"]
    assert client.get(capabilities[0]["CapabilitiesObject"]["@odata.id"]).status == 200
    assert "Actions" not in client.get(COMPOSITION_SERVICE).json
    assert "POST" in client.get(SYSTEMS).headers["Allow"]


def test_post_composes_and_delete_decomposes(specific: SimulatorProcess) -> None:
    client = specific.client
    created = client.post(SYSTEMS, create_body("host-01-block", "r1-a100-1", "r1-nvme-1"))
    assert created.status == 201
    location = created.headers["Location"]
    assert members(client) == [location]
    system = client.get(location).json
    assert system["Oem"]["ComposeSpawner"]["Machine"] == "m-3"
    assert [r["@odata.id"] for r in system["Links"]["ResourceBlocks"]] == [
        r["@odata.id"] for r in refs("host-01-block", "r1-a100-1", "r1-nvme-1")
    ]
    assert "Actions" not in system
    assert "Composition" not in system
    assert state_of(client, "r1-a100-1") == ("Composed", [location])
    assert state_of(client, "host-01-block") == ("Composed", [location])

    assert client.delete(location).status == 204
    assert members(client) == []
    assert state_of(client, "r1-a100-1") == ("Unused", [])
    assert state_of(client, "host-01-block") == ("Unused", [])
    assert client.delete(location).status == 404


def test_composition_is_all_or_nothing(specific: SimulatorProcess) -> None:
    client = specific.client
    assert client.post(SYSTEMS, create_body("host-01-block", "r1-a100-1")).status == 201
    in_use = client.post(SYSTEMS, create_body("host-02-block", "r1-a100-2", "r1-a100-1"))
    assert in_use.status == 409
    assert in_use.message_ids[0].endswith("ResourceBlockInUse")
    two_zones = client.post(SYSTEMS, create_body("host-02-block", "r1-a100-2", "r2-h100-1"))
    assert two_zones.status == 400
    assert two_zones.message_ids[0].endswith("IncompatibleZone")
    no_compute = client.post(SYSTEMS, create_body("r1-a100-2"))
    assert no_compute.status == 400
    assert no_compute.message_ids[0].endswith("PropertyValueError")
    # Nothing of the refused requests was taken.
    assert state_of(client, "r1-a100-2") == ("Unused", [])
    assert state_of(client, "host-02-block") == ("Unused", [])
    assert len(members(client)) == 1


def test_specific_mode_offers_no_expansion(specific: SimulatorProcess) -> None:
    client = specific.client
    location = client.post(SYSTEMS, create_body("host-01-block")).headers["Location"]
    system_id = location.rsplit("/", 1)[-1]
    added = client.post(action(system_id, "AddResourceBlock"), block_ref("r1-a100-1"))
    assert added.status == 404
    assert client.get(f"{SYSTEMS}/host-01").status == 404


def test_composed_systems_survive_a_restart(specific: SimulatorProcess) -> None:
    client = specific.client
    location = client.post(SYSTEMS, create_body("host-03-block", "r1-t4-1")).headers["Location"]
    specific.restart()
    client = specific.client
    assert members(client) == [location]
    assert client.get(location).json["Oem"]["ComposeSpawner"] == {
        "@odata.type": "#ComposeSpawner.v1_0_0.ComposeSpawner",
        **TAG,
    }
    second = client.post(SYSTEMS, create_body("host-04-block")).headers["Location"]
    assert second != location  # ids are not reused after a restart


def test_asynchronous_post_and_delete(start_simulator: StartSimulator) -> None:
    simulator = start_simulator(
        "--composition", "specific", "--async-tasks", "--task-duration", "0.05"
    )
    client = simulator.client
    accepted = client.post(SYSTEMS, create_body("host-01-block", "r1-a100-1"))
    assert accepted.status == 202
    done = poll_monitor(client, accepted.headers["Location"])
    assert done.status == 201
    location = done.headers["Location"]
    assert done.json["@odata.id"] == location
    deleting = client.delete(location)
    assert deleting.status == 202
    assert poll_monitor(client, deleting.headers["Location"]).status == 204
    assert members(client) == []


def test_action_mode_advertises_compose_only(with_action: SimulatorProcess) -> None:
    client = with_action.client
    compose = client.get(COMPOSITION_SERVICE).json["Actions"]["#CompositionService.Compose"]
    assert compose["target"] == COMPOSE
    info = client.get(compose["@Redfish.ActionInfo"]).json
    allowed = {p["Name"]: p.get("AllowableValues") for p in info["Parameters"]}
    assert allowed["RequestType"] == ["Apply"]
    assert "@Redfish.CollectionCapabilities" not in client.get(SYSTEMS).json
    assert client.post(SYSTEMS, create_body("host-01-block")).status == 405


def test_compose_action_applies_a_manifest(with_action: SimulatorProcess) -> None:
    client = with_action.client
    applied = client.post(COMPOSE, manifest("host-02-block", "r1-l40s-1"))
    assert applied.status == 200
    stanza = applied.json["Manifest"]["Stanzas"][0]
    assert (stanza["StanzaType"], stanza["StanzaId"]) == ("ComposeSystem", "m-3")
    location = stanza["Response"]["@odata.id"]
    assert members(client) == [location]
    assert state_of(client, "r1-l40s-1") == ("Composed", [location])

    refused = client.post(COMPOSE, manifest("host-03-block", "r1-l40s-1"))
    assert refused.status == 409
    assert state_of(client, "host-03-block") == ("Unused", [])
    preview = {**manifest("host-03-block"), "RequestType": "Preview"}
    assert client.post(COMPOSE, preview).message_ids[0].endswith("ValueNotInList")

    decompose = {
        "RequestFormat": "Manifest",
        "RequestType": "Apply",
        "Manifest": {
            "Stanzas": [{"StanzaType": "DecomposeSystem", "Request": {"@odata.id": location}}]
        },
    }
    assert client.post(COMPOSE, decompose).status == 200
    assert members(client) == []
    assert state_of(client, "r1-l40s-1") == ("Unused", [])


def test_a_failing_stanza_undoes_the_manifest(with_action: SimulatorProcess) -> None:
    client = with_action.client
    body = manifest("host-01-block", "r1-a100-1")
    second = {"StanzaType": "ComposeSystem", "Request": create_body("host-02-block", "r2-h100-1")}
    body["Manifest"]["Stanzas"].append(second)
    assert client.post(COMPOSE, body).status == 400
    assert members(client) == []
    assert state_of(client, "r1-a100-1") == ("Unused", [])


def test_fail_after_attachments_counts_composed_devices(specific: SimulatorProcess) -> None:
    client = specific.client
    assert client.faults(fail_after_attachments=1).status == 200
    failed = client.post(SYSTEMS, create_body("host-01-block", "r1-a100-1", "r1-a100-2"))
    assert failed.status == 500
    assert members(client) == []
