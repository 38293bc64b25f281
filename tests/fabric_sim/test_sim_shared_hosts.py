"""Hosts shared by several machines, over HTTP (issue 29).

The v1_1_0 mark (a hub and its machines), a system's whole
``Links.ResourceBlocks`` changed by one PATCH under ``If-Match`` in every
composition mode, the ``--composed-blocks-read-only`` quirk that refuses it,
and DELETE under ``If-Match``. Each host's capacity: ``test_sim_capacity.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fabricsim.__main__ import main
from harness.simulator import INVENTORY

from .harness import (
    BLOCKS,
    SYSTEMS,
    RedfishClient,
    Response,
    SimulatorProcess,
    StartSimulator,
    poll_monitor,
)

COMPOSE = "/redfish/v1/CompositionService/Actions/CompositionService.Compose"
SHARED = {
    "Hub": "hub-s",
    "Machines": [
        {"Machine": "m-1", "Owner": "ada/thesis"},
        {"Machine": "m-2", "Owner": "bob/"},
    ],
}
SHARED_TYPE = "#ComposeSpawner.v1_1_0.Mark"


def refs(*block_ids: str) -> list[dict[str, str]]:
    return [{"@odata.id": f"{BLOCKS}/{b}"} for b in block_ids]


def links(*block_ids: str) -> dict[str, Any]:
    return {"Links": {"ResourceBlocks": refs(*block_ids)}}


def blocks_of(system: dict[str, Any]) -> list[str]:
    return [r["@odata.id"].rsplit("/", 1)[-1] for r in system["Links"]["ResourceBlocks"]]


def holder(client: RedfishClient, block_id: str) -> tuple[str, list[str]]:
    block = client.get(f"{BLOCKS}/{block_id}").json
    systems = [r["@odata.id"].rsplit("/", 1)[-1] for r in block["Links"]["ComputerSystems"]]
    return block["CompositionStatus"]["CompositionState"], systems


def etag_count(etag: str) -> int:
    """The write counter in the simulator's ETags (``"<epoch>-<n>"``)."""
    return int(etag.strip('"').rsplit("-", 1)[1])


def patch(client: RedfishClient, uri: str, body: Any, if_match: str | None = "*") -> Response:
    headers = {} if if_match is None else {"If-Match": if_match}
    return client.patch(uri, body, headers=headers)


# --- composing a system in each mode ------------------------------------------------------------


def _expandable(client: RedfishClient, *devices: str) -> str:
    for block_id in devices:
        assert client.attach("host-01", block_id).status == 204
    return f"{SYSTEMS}/host-01"


def _specific(client: RedfishClient, *devices: str) -> str:
    body = {"Name": "shared", **links("host-01-block", *devices)}
    created = client.post(SYSTEMS, body)
    assert created.status == 201, created.body
    return str(created.headers["Location"])


def _action(client: RedfishClient, *devices: str) -> str:
    request = {"Name": "shared", **links("host-01-block", *devices)}
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": "1", "Request": request}
    body = {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}
    applied = client.post(COMPOSE, body)
    assert applied.status == 200, applied.body
    return str(applied.json["Manifest"]["Stanzas"][0]["Response"]["@odata.id"])


COMPOSERS: dict[str, Callable[..., str]] = {
    "expandable": _expandable,
    "specific": _specific,
    "action": _action,
}


@pytest.fixture(params=list(COMPOSERS))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sim(start_simulator: StartSimulator, tmp_path: Path, mode: str) -> SimulatorProcess:
    state = tmp_path / "state.json"
    return start_simulator("--composition", mode, "--faults-api", "--state-file", str(state))


def compose(sim: SimulatorProcess, mode: str, *devices: str) -> str:
    """A system on host-01 holding ``devices``: its URI."""
    return COMPOSERS[mode](sim.client, *devices)


# --- the v1_1_0 mark ---------------------------------------------------------------------------


def test_the_shared_mark_round_trips_and_survives_a_restart(
    sim: SimulatorProcess, mode: str
) -> None:
    client = sim.client
    uri = compose(sim, mode, "r1-t4-1")
    written = patch(client, uri, {"Oem": {"ComposeSpawner": SHARED}})
    assert written.status == 200, written.body
    assert written.json["Oem"]["ComposeSpawner"] == {"@odata.type": SHARED_TYPE, **SHARED}
    sim.restart()
    client = sim.client
    assert client.get(uri).json["Oem"]["ComposeSpawner"] == {"@odata.type": SHARED_TYPE, **SHARED}
    one = {"Hub": "hub-s", "Machines": SHARED["Machines"][:1]}
    assert patch(client, uri, {"Oem": {"ComposeSpawner": one}}).json["Oem"]["ComposeSpawner"][
        "Machines"
    ] == [{"Machine": "m-1", "Owner": "ada/thesis"}]
    removed = patch(client, uri, {"Oem": {"ComposeSpawner": None}})
    assert (removed.status, removed.json["Oem"]) == (200, {})


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        ({"Hub": "h", "Machines": []}, "PropertyValueError"),
        ({"Hub": "h", "Machines": [{"Machine": "m", "Owner": "o"}] * 2}, "PropertyValueError"),
        ({"Hub": "h", "Machines": [{"Machine": "m"}]}, "PropertyMissing"),
        ({"Hub": "h", "Machines": [{"Machine": "m", "Owner": "o", "Size": 4}]}, "PropertyUnknown"),
        ({"Hub": "h", "Machines": ["m"]}, "PropertyValueTypeError"),
        ({"Hub": "h", "Machines": "m"}, "PropertyValueTypeError"),
        ({"Hub": "h", "Machine": "m", "Owner": "o", "Machines": []}, "PropertyUnknown"),
        ({"@odata.type": SHARED_TYPE, "Hub": "h"}, "PropertyMissing"),
        ({"@odata.type": "#ComposeSpawner.v9_0_0.Mark", **SHARED}, "PropertyValueError"),
    ],
)
def test_malformed_shared_marks_are_refused(
    client: RedfishClient, mark: dict[str, Any], message: str
) -> None:
    answer = patch(client, f"{SYSTEMS}/host-02", {"Oem": {"ComposeSpawner": mark}})
    assert (answer.status, answer.message_ids) == (400, [f"Base.1.22.1.{message}"])
    assert client.sim_state()["hosts"]["host-02"]["tag"] is None


def test_either_version_may_be_written_with_its_type(client: RedfishClient) -> None:
    typed = {"@odata.type": SHARED_TYPE, **SHARED}
    assert patch(client, f"{SYSTEMS}/host-02", {"Oem": {"ComposeSpawner": typed}}).status == 200
    tag = {"Hub": "h", "Machine": "m", "Owner": "o"}
    old = {"@odata.type": "#ComposeSpawner.v1_0_0.ComposeSpawner", **tag}
    answer = patch(client, f"{SYSTEMS}/host-02", {"Oem": {"ComposeSpawner": old}})
    assert answer.json["Oem"]["ComposeSpawner"] == old
    assert client.sim_state()["hosts"]["host-02"]["tag"] == tag


# --- PATCH of Links.ResourceBlocks --------------------------------------------------------------


def test_patch_adds_and_removes_blocks_with_its_mark_in_one_write(
    sim: SimulatorProcess, mode: str
) -> None:
    client = sim.client
    uri = compose(sim, mode, "r1-t4-1", "r1-t4-2")
    before = client.get(uri)
    assert before.json["Links"]["@Redfish.WriteableProperties"] == ["ResourceBlocks"]
    body = {**links("host-01-block", "r1-t4-2", "r1-a100-1", "r1-nvme-1"),
            "Oem": {"ComposeSpawner": SHARED}}  # fmt: skip
    answer = patch(client, uri, body, if_match=before.headers["ETag"])
    assert answer.status == 200, answer.body
    assert blocks_of(answer.json) == ["host-01-block", "r1-t4-2", "r1-a100-1", "r1-nvme-1"]
    assert answer.json["Oem"]["ComposeSpawner"]["Machines"] == SHARED["Machines"]
    etag = answer.headers["ETag"]
    assert etag_count(etag) == etag_count(before.headers["ETag"]) + 1  # one write, one change
    assert client.get(uri).headers["ETag"] == etag
    system_id = uri.rsplit("/", 1)[-1]
    assert holder(client, "r1-a100-1") == ("Composed", [system_id])
    assert holder(client, "r1-nvme-1") == ("Composed", [system_id])
    assert holder(client, "r1-t4-1") == ("Unused", [])
    assert holder(client, "r1-t4-2") == ("Composed", [system_id])
    # The freed device can be taken by another host at once.
    assert taken_by_host_02(client, mode, "r1-t4-1")


def taken_by_host_02(client: RedfishClient, mode: str, block_id: str) -> bool:
    """Whether host-02 could take ``block_id`` into a composition of its own."""
    if mode == "expandable":
        return client.attach("host-02", block_id).status == 204
    request = {"Name": "other", **links("host-02-block", block_id)}
    if mode == "specific":
        return client.post(SYSTEMS, request).status == 201
    stanza = {"StanzaType": "ComposeSystem", "Request": request}
    body = {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}
    return client.post(COMPOSE, body).status == 200


def test_patch_needs_a_current_if_match(sim: SimulatorProcess, mode: str) -> None:
    client = sim.client
    uri = compose(sim, mode, "r1-t4-1")
    before = client.get(uri)
    body = links("host-01-block", "r1-t4-1", "r1-t4-2")
    missing = patch(client, uri, body, if_match=None)
    assert (missing.status, missing.message_ids) == (428, ["Base.1.22.1.PreconditionRequired"])
    stale = patch(client, uri, body, if_match='"stale-1"')
    assert (stale.status, stale.message_ids) == (412, ["Base.1.22.1.PreconditionFailed"])
    after = client.get(uri)
    assert after.headers["ETag"] == before.headers["ETag"]
    assert blocks_of(after.json) == ["host-01-block", "r1-t4-1"]
    assert holder(client, "r1-t4-2") == ("Unused", [])


@pytest.mark.parametrize(
    ("blocks", "status", "message"),
    [
        (("r1-t4-1",), 400, "Base.1.22.1.PropertyValueError"),  # its own block left out
        (("host-01-block", "host-02-block"), 400, "Base.1.22.1.PropertyValueError"),
        (("host-01-block", "r1-t4-1", "r1-t4-1"), 400, "Base.1.22.1.PropertyValueError"),
        (("host-01-block", "r1-t4-1", "r1-a100-9"), 404, "Composition.1.1.3.ResourceBlockNotFound"),
        (("host-01-block", "r1-t4-1", "r2-h100-1"), 400, "Composition.1.1.3.IncompatibleZone"),
        (("host-01-block", "r1-t4-1", "r1-l40s-1"), 409, "Composition.1.1.3.ResourceBlockInUse"),
    ],
)
def test_a_refused_patch_changes_nothing(
    sim: SimulatorProcess, mode: str, blocks: tuple[str, ...], status: int, message: str
) -> None:
    client = sim.client
    assert taken_by_host_02(client, mode, "r1-l40s-1")  # in another composition
    uri = compose(sim, mode, "r1-t4-1")
    before = client.get(uri)
    state = client.sim_state()
    # The mark rides along and is refused with the blocks: one write, all or nothing.
    body = {**links(*blocks), "Oem": {"ComposeSpawner": SHARED}}
    answer = patch(client, uri, body, if_match=before.headers["ETag"])
    assert (answer.status, answer.message_ids) == (status, [message])
    after = client.get(uri)
    assert (after.headers["ETag"], after.json["Oem"]) == (before.headers["ETag"], {})
    assert blocks_of(after.json) == ["host-01-block", "r1-t4-1"]
    assert client.sim_state() == state


def test_a_patch_naming_no_new_device_still_counts_for_the_attachment_fault(
    sim: SimulatorProcess, mode: str
) -> None:
    client = sim.client
    uri = compose(sim, mode, "r1-t4-1")
    client.faults(fail_after_attachments=0)
    kept = patch(client, uri, links("host-01-block", "r1-t4-1"))
    assert kept.status == 200  # nothing attached: the fault does not fire
    failed = patch(client, uri, links("host-01-block", "r1-t4-1", "r1-t4-2"))
    assert failed.status == 500
    assert holder(client, "r1-t4-2") == ("Unused", [])


def test_a_host_that_is_not_expandable_refuses_a_patch_of_its_blocks(
    start_simulator: StartSimulator,
) -> None:
    client = start_simulator("--not-expandable", "host-08").client
    uri = f"{SYSTEMS}/host-08"
    assert client.get(uri).json["Links"]["@Redfish.WriteableProperties"] == []
    refused = patch(client, uri, links("host-08-block", "r2-t4-1"))
    assert (refused.status, refused.message_ids) == (400, ["Base.1.22.1.PropertyNotWritable"])
    assert patch(client, uri, {"Oem": {"ComposeSpawner": SHARED}}).status == 200


# --- the --composed-blocks-read-only quirk -----------------------------------------------------


@pytest.mark.parametrize("composed_by", ["specific", "action"])
def test_composed_blocks_read_only_refuses_the_patch_but_not_the_mark(
    start_simulator: StartSimulator, composed_by: str
) -> None:
    sim = start_simulator("--composition", composed_by, "--composed-blocks-read-only")
    client = sim.client
    uri = compose(sim, composed_by, "r1-t4-1")
    before = client.get(uri)
    assert before.json["Links"]["@Redfish.WriteableProperties"] == []
    body = {**links("host-01-block", "r1-t4-1", "r1-t4-2"), "Oem": {"ComposeSpawner": SHARED}}
    refused = patch(client, uri, body)
    assert (refused.status, refused.message_ids) == (400, ["Base.1.22.1.PropertyNotWritable"])
    assert client.get(uri).headers["ETag"] == before.headers["ETag"]
    assert holder(client, "r1-t4-2") == ("Unused", [])
    assert patch(client, uri, {"Oem": {"ComposeSpawner": SHARED}}).status == 200
    assert "composed systems' blocks read-only" in sim.log()


def test_composed_blocks_read_only_needs_composed_systems() -> None:
    argv = ["--inventory", str(INVENTORY), "--port", "1", "--composed-blocks-read-only"]
    assert main(argv) == 2
    assert main([*argv, "--composition", "expandable"]) == 2


# --- DELETE under If-Match ---------------------------------------------------------------------


@pytest.mark.parametrize("composed_by", ["specific", "action"])
def test_delete_honours_if_match(start_simulator: StartSimulator, composed_by: str) -> None:
    sim = start_simulator("--composition", composed_by)
    client = sim.client
    uri = compose(sim, composed_by, "r1-t4-1")
    read = client.get(uri).headers["ETag"]
    assert patch(client, uri, {"Oem": {"ComposeSpawner": SHARED}}).status == 200  # someone wrote
    stale = client.delete(uri, headers={"If-Match": read})
    assert (stale.status, stale.message_ids) == (412, ["Base.1.22.1.PreconditionFailed"])
    assert client.get(uri).status == 200
    assert holder(client, "r1-t4-1")[0] == "Composed"
    current = client.get(uri).headers["ETag"]
    assert client.delete(uri, headers={"If-Match": current}).status == 204
    assert holder(client, "r1-t4-1") == ("Unused", [])
    again = compose(sim, composed_by, "r1-t4-1")
    assert client.delete(again).status == 204  # If-Match stays optional


def test_an_asynchronous_delete_with_a_stale_if_match_is_refused_at_once(
    start_simulator: StartSimulator,
) -> None:
    sim = start_simulator("--composition", "specific", "--async-tasks", "--task-duration", "0.05")
    client = sim.client
    accepted = client.post(SYSTEMS, {"Name": "s", **links("host-01-block")})
    assert accepted.status == 202
    done = poll_monitor(client, accepted.headers["Location"])
    assert done.status == 201
    created = done.headers["Location"]
    refused = client.delete(created, headers={"If-Match": '"stale-0"'})
    assert refused.status == 412  # at once, not by a task
    assert client.get(created).status == 200


# --- --async-tasks -----------------------------------------------------------------------------


@pytest.mark.parametrize("composed_by", ["expandable", "specific"])
def test_an_asynchronous_patch_of_blocks_runs_as_a_task(
    start_simulator: StartSimulator, composed_by: str
) -> None:
    sim = start_simulator("--composition", composed_by, "--async-tasks", "--task-duration", "0.05")
    client = sim.client
    uri = f"{SYSTEMS}/host-01"
    if composed_by == "specific":
        accepted = client.post(SYSTEMS, {"Name": "s", **links("host-01-block")})
        uri = poll_monitor(client, accepted.headers["Location"]).headers["Location"]
    own = "host-01-block"
    refused = patch(client, uri, links(own, "r2-h100-1"))  # refused at once, not by the task
    assert (refused.status, refused.message_ids) == (400, ["Composition.1.1.3.IncompatibleZone"])
    accepted = patch(client, uri, {**links(own, "r1-t4-1"), "Oem": {"ComposeSpawner": SHARED}})
    assert accepted.status == 202
    done = poll_monitor(client, accepted.headers["Location"])
    assert done.status == 200
    assert blocks_of(done.json) == [own, "r1-t4-1"]
    assert done.json["Oem"]["ComposeSpawner"]["Hub"] == "hub-s"
    assert holder(client, "r1-t4-1") == ("Composed", [uri.rsplit("/", 1)[-1]])
    assert patch(client, uri, {"Oem": {"ComposeSpawner": None}}).status == 200  # a mark: at once
