"""Composing over HTTP: attach, detach, idempotency, refusals, ETags, the OEM tag."""

from __future__ import annotations

from typing import Any

import pytest

from harness.hub import wait_for

from .harness import BLOCKS, SYSTEMS, RedfishClient, SimulatorProcess, action, block_ref
from .sim_cases import ADD, REFUSALS, RefusalCase

TAG = {"Hub": "hub-a", "Machine": "m-17", "Owner": "alice/thesis"}


def composition(client: RedfishClient, block_id: str) -> tuple[str, list[Any]]:
    block = client.get(f"{BLOCKS}/{block_id}").json
    return block["CompositionStatus"]["CompositionState"], block["Links"]["ComputerSystems"]


def system_blocks(client: RedfishClient, system_id: str) -> list[str]:
    links = client.get(f"{SYSTEMS}/{system_id}").json["Links"]["ResourceBlocks"]
    return [link["@odata.id"].rsplit("/", 1)[-1] for link in links]


def test_attach_then_detach(client: RedfishClient) -> None:
    assert client.attach("host-01", "r1-a100-1").status == 204
    assert client.attach("host-01", "x1-rtx6000-1").status == 204
    assert composition(client, "r1-a100-1") == ("Composed", [{"@odata.id": f"{SYSTEMS}/host-01"}])
    assert composition(client, "host-01-block")[0] == "Composed"
    assert system_blocks(client, "host-01") == ["host-01-block", "r1-a100-1", "x1-rtx6000-1"]
    assert client.sim_state()["hosts"]["host-01"]["attached"] == ["r1-a100-1", "x1-rtx6000-1"]
    assert client.detach("host-01", "r1-a100-1").status == 204
    assert client.detach("host-01", "x1-rtx6000-1").status == 204
    assert composition(client, "r1-a100-1") == ("Unused", [])
    assert composition(client, "host-01-block") == ("Unused", [])
    assert system_blocks(client, "host-01") == ["host-01-block"]


def test_expansion_devices_compose_with_either_rack(client: RedfishClient) -> None:
    assert client.attach("host-05", "x1-rtx6000-2").status == 204
    assert system_blocks(client, "host-05") == ["host-05-block", "x1-rtx6000-2"]


def test_attach_and_detach_are_idempotent(client: RedfishClient) -> None:
    assert client.attach("host-02", "r1-l40s-1").status == 204
    etag = client.get(f"{SYSTEMS}/host-02").headers["ETag"]
    # A retry of the same attach, even with the ETag from before the first one.
    assert client.attach("host-02", "r1-l40s-1", ComputerSystemETag="stale").status == 204
    assert client.get(f"{SYSTEMS}/host-02").headers["ETag"] == etag
    assert client.detach("host-02", "r1-l40s-1").status == 204
    assert client.detach("host-02", "r1-l40s-1").status == 204
    assert client.detach("host-03", "r1-l40s-2").status == 204  # never attached
    assert client.sim_state()["hosts"]["host-02"]["attached"] == []


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.name)
def test_refusals(client: RedfishClient, case: RefusalCase) -> None:
    for system_id, block_id in case.attached_first:
        assert client.attach(system_id, block_id).status == 204
    if case.disabled:
        client.faults(disabled_blocks=list(case.disabled))
    before = client.sim_state()["hosts"]
    send = client.attach if case.action == ADD else client.detach
    answer = send(case.system_id, case.block_id)
    assert answer.status == case.status
    assert answer.message_ids == [case.message_id]
    assert answer.json["error"]["code"] == case.message_id
    assert client.sim_state()["hosts"] == before


def test_disabled_block_reports_its_state(client: RedfishClient) -> None:
    client.faults(disabled_blocks=["r1-t4-2"])
    assert client.get(f"{BLOCKS}/r1-t4-2").json["Status"]["State"] == "Disabled"
    client.delete("/sim/faults", auth=False)
    assert client.get(f"{BLOCKS}/r1-t4-2").json["Status"]["State"] == "Enabled"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "ActionParameterMissing"),
        ({"ResourceBlock": "r1-a100-1"}, "ActionParameterValueTypeError"),
        ({"ResourceBlock": {"@odata.id": 7}}, "ActionParameterValueTypeError"),
        ({**block_ref("r1-a100-1"), "Force": True}, "ActionParameterUnknown"),
        ({**block_ref("r1-a100-1"), "ResourceBlockETag": 3}, "ActionParameterValueTypeError"),
    ],
)
def test_malformed_action_bodies(client: RedfishClient, body: Any, message: str) -> None:
    answer = client.post(action("host-01", "AddResourceBlock"), body)
    assert answer.status == 400
    assert answer.message_ids == [f"Base.1.22.1.{message}"]


def test_malformed_json_and_unknown_actions(client: RedfishClient) -> None:
    broken = client.post(action("host-01", "AddResourceBlock"), b"{not json")
    assert (broken.status, broken.message_ids) == (400, ["Base.1.22.1.MalformedJSON"])
    reset = client.post(f"{SYSTEMS}/host-01/Actions/ComputerSystem.Reset", {})
    assert reset.status == 404
    not_a_block = {"ResourceBlock": {"@odata.id": f"{SYSTEMS}/host-02"}}
    answer = client.post(action("host-01", "AddResourceBlock"), not_a_block)
    assert answer.message_ids == ["Composition.1.1.3.ResourceBlockNotFound"]


def test_etags_change_on_writes_and_stale_ones_are_refused(client: RedfishClient) -> None:
    block_etag = client.get(f"{BLOCKS}/r1-t4-3").headers["ETag"]
    system_etag = client.get(f"{SYSTEMS}/host-03").headers["ETag"]
    stale = client.attach("host-03", "r1-t4-3", ResourceBlockETag='"old"')
    assert (stale.status, stale.message_ids) == (412, ["Base.1.22.1.PreconditionFailed"])
    stale = client.attach("host-03", "r1-t4-3", ComputerSystemETag='"old"')
    assert stale.status == 412
    fresh = client.attach(
        "host-03", "r1-t4-3", ResourceBlockETag=block_etag, ComputerSystemETag=system_etag
    )
    assert fresh.status == 204
    assert client.get(f"{BLOCKS}/r1-t4-3").headers["ETag"] != block_etag
    assert client.get(f"{SYSTEMS}/host-03").headers["ETag"] != system_etag
    assert client.detach("host-03", "r1-t4-3", ResourceBlockETag=block_etag).status == 412


def test_patch_writes_and_clears_the_tag(client: RedfishClient) -> None:
    uri = f"{SYSTEMS}/host-04"
    etag = client.get(uri).headers["ETag"]
    answer = client.patch(uri, {"Oem": {"ComposeSpawner": TAG}}, headers={"If-Match": etag})
    assert answer.status == 200
    assert answer.json["Oem"]["ComposeSpawner"] == {
        "@odata.type": "#ComposeSpawner.v1_0_0.ComposeSpawner",
        **TAG,
    }
    new_etag = answer.headers["ETag"]
    assert new_etag != etag
    assert client.get(uri).json["Oem"]["ComposeSpawner"]["Machine"] == "m-17"
    assert client.sim_state()["hosts"]["host-04"]["tag"] == TAG
    cleared = client.patch(uri, {"Oem": {"ComposeSpawner": None}}, headers={"If-Match": new_etag})
    assert cleared.status == 200
    assert cleared.json["Oem"] == {}


def test_patch_needs_a_current_if_match(client: RedfishClient) -> None:
    uri = f"{SYSTEMS}/host-04"
    body = {"Oem": {"ComposeSpawner": TAG}}
    missing = client.patch(uri, body)
    assert (missing.status, missing.message_ids) == (428, ["Base.1.22.1.PreconditionRequired"])
    stale = client.patch(uri, body, headers={"If-Match": '"stale-1"'})
    assert (stale.status, stale.message_ids) == (412, ["Base.1.22.1.PreconditionFailed"])
    assert client.patch(uri, body, headers={"If-Match": "*"}).status == 200
    assert client.patch(f"{SYSTEMS}/host-99", body, headers={"If-Match": "*"}).status == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"Name": "renamed"}, "PropertyNotWritable"),
        ({"Links": {"Chassis": []}}, "PropertyNotWritable"),
        ({"Links": {"ResourceBlocks": []}}, "PropertyValueError"),  # its own block gone
        ({"Colour": "blue"}, "PropertyUnknown"),
        ({"Oem": {"Vendor": {}}}, "PropertyUnknown"),
        ({"Oem": {"ComposeSpawner": {"Hub": "h", "Machine": "m"}}}, "PropertyMissing"),
        ({"Oem": {"ComposeSpawner": {**TAG, "Owner": 5}}}, "PropertyValueTypeError"),
        ({"Oem": {"ComposeSpawner": {**TAG, "Extra": "x"}}}, "PropertyUnknown"),
        ({"Oem": {"ComposeSpawner": "tag"}}, "PropertyValueTypeError"),
    ],
)
def test_patch_refuses_everything_but_the_tag_and_the_blocks(
    client: RedfishClient, body: Any, message: str
) -> None:
    answer = client.patch(f"{SYSTEMS}/host-04", body, headers={"If-Match": "*"})
    assert answer.status == 400
    assert answer.message_ids == [f"Base.1.22.1.{message}"]
    assert client.sim_state()["hosts"]["host-04"]["tag"] is None


def test_the_access_log_shows_writes_and_refusals_not_reads(
    simulator: SimulatorProcess,
) -> None:
    client = simulator.client
    assert client.get(f"{SYSTEMS}/host-02").status == 200
    assert client.attach("host-02", "r1-t4-1").status == 204
    assert client.get(f"{BLOCKS}/no-such-block").status == 404
    refusal = f"404 GET {BLOCKS}/no-such-block "
    # The simulator writes a request's log line after answering it: wait for the last.
    log = wait_for(
        lambda: text if refusal in (text := simulator.log()) else None, 10, "the 404 logged"
    )
    assert f"GET {SYSTEMS}/host-02 " not in log
    assert f"204 POST {action('host-02', 'AddResourceBlock')} " in log
    assert refusal in log
