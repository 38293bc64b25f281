"""The spine on a fabric that composes whole systems, as DMTF's specific composition does.

tests/e2e/test_spawn.py walks it on expandable hosts (AddResourceBlock per
device); here the simulator offers only ``POST /redfish/v1/Systems`` (specific)
or only the ``CompositionService.Compose`` action, and the client must pick
what the service advertises: one composed system per machine, deleted on stop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from harness.hub import PORTAL, Hub, notebook_pid, process_env, running_hub

pytestmark = pytest.mark.e2e
TWO_T4 = {"gpu_model": "t4", "gpu_count": 2, "network": "25g", "scratch_gb": 0}


@pytest.fixture(scope="module", params=["specific", "action"])
def hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    mode = f"--composition {request.param}"
    with running_hub(tmp_path_factory.mktemp("hub"), COMPOSE_FABRIC_ARGS=mode) as hub:
        yield hub


def composed_systems(hub: Hub) -> list[str]:
    return [m["@odata.id"] for m in hub.redfish("/redfish/v1/Systems")["Members"]]


@pytest.mark.timeout(180)
def test_a_machine_is_one_composed_system_made_on_start_and_deleted_on_stop(hub: Hub) -> None:
    assert composed_systems(hub) == []
    response, events = hub.spawn_watching("student1", TWO_T4)
    assert response.status_code in (201, 202), response.text
    server = hub.wait_ready("student1")  # JupyterLab answered the hub
    machine = server["state"]["compose"]
    blocks = [d["block_id"] for d in (*machine["gpus"], machine["nic"])]

    messages = [event["message"] for event in events]
    assert any(m.startswith("composing 2 GPUs") for m in messages), messages
    assert len(composed_systems(hub)) == 1
    assert {hub.block_state(b) for b in blocks} <= {"Composed", "ComposedAndAvailable"}

    hub.stop("student1")
    hub.wait_released(machine["machine_id"])

    assert composed_systems(hub) == []
    assert {hub.block_state(b) for b in blocks} == {"Unused"}


@pytest.mark.timeout(180)
def test_a_whole_system_is_not_grown_in_place_and_is_left_as_it_was(hub: Hub) -> None:
    hub.spawn("student1", TWO_T4).raise_for_status()
    server = hub.wait_ready("student1")
    try:
        systems = composed_systems(hub)
        token = process_env(notebook_pid(hub, "student1"))["JUPYTERHUB_API_TOKEN"]
        response = requests.post(
            f"{hub.url}{PORTAL}api/me/server/gpus",
            json={"count": 1},
            headers={"Authorization": f"token {token}"},
            timeout=60,
        )
        assert response.status_code == 503, response.text
        assert "cannot add devices to a running machine" in response.json()["message"]
        assert composed_systems(hub) == systems
        mine = requests.get(
            f"{hub.url}{PORTAL}api/me/server/gpus",
            headers={"Authorization": f"token {token}"},
            timeout=60,
        ).json()
        assert len(mine["gpus"]) == 2  # the claim was given back: the ledger holds two
        assert [g["id"] for g in mine["gpus"]] == [
            d["block_id"] for d in server["state"]["compose"]["gpus"]
        ]
    finally:
        hub.stop("student1")
