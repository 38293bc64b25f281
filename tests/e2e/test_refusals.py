"""Refusals on a real hub: the user reads why, and nothing is claimed, stored or left behind."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for

pytestmark = pytest.mark.e2e
USERS = ("student1", "student2", "researcher1")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as hub:
        yield hub


@pytest.fixture(autouse=True)
def nothing_left_composed(hub: Hub) -> Iterator[None]:
    assert hub.composed_hosts() == {}
    yield
    for user in USERS:
        for name in hub.user(user).get("servers", {}):
            hub.stop(user, name)
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")


def server_records(hub: Hub, user: str) -> set[str]:
    """Every server the hub keeps for ``user``, stopped ones included."""
    response = hub.request("GET", f"/users/{user}", params={"include_stopped_servers": "1"})
    response.raise_for_status()
    return set(response.json()["servers"])


def hub_database_bytes(hub: Hub) -> int:
    return sum(p.stat().st_size for p in hub.state.glob("jupyterhub.sqlite*"))


def gpu_models_of(hub: Hub, user: str, name: str = "") -> str:
    return process_env(notebook_pid(hub, user, name))["COMPOSE_GPU_MODELS"]


@pytest.mark.timeout(120)
def test_an_oversized_options_body_is_refused_and_never_stored(hub: Hub, ledger: Ledger) -> None:
    before = hub_database_bytes(hub)
    huge = {"gpu_model": "t4", "gpu_count": 1, "notes": "x" * 10_000_000}

    response = hub.spawn("student2", huge)

    assert response.status_code == 413, response.text[:500]
    assert "at most 4,096 bytes" in response.json()["message"]
    wait_for(lambda: hub.server("student2") is None, 30, "the refused server to be cleared")

    session = hub.login("student2")
    form = {"gpu_model": "t4", "gpu_count": "1", "notes": "x" * 10_000_000}
    form["_xsrf"] = session.cookies.get("_xsrf")
    page = session.post(f"{hub.url}/hub/spawn", data=form, timeout=60)
    assert page.status_code == 413
    assert "at most 4,096 bytes" in page.text

    assert hub_database_bytes(hub) < before + 1_000_000
    assert ledger.live_machines("student2") == []
    assert ledger.holders() == {}


@pytest.mark.timeout(240)
def test_refused_options_are_forgotten_and_an_empty_request_reuses_the_last_accepted(
    hub: Hub,
) -> None:
    assert hub.spawn("student1", {"gpu_model": "l40s", "gpu_count": 1}).status_code in (201, 202)
    hub.wait_ready("student1")
    hub.stop("student1")

    bad = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "colour": "red"})
    assert bad.status_code == 400, bad.text
    assert "Unknown option 'colour'" in bad.json()["message"]
    wait_for(lambda: hub.server("student1") is None, 30, "the refused server to be cleared")

    form = hub.login("student1").get(f"{hub.url}/hub/spawn", timeout=30).text
    assert 'value="l40s"\n             checked' in form

    # No body at all: the hub passes the options it stored; then an explicit empty set.
    for body in (None, {"user_options": {}}):
        again = hub.request("POST", "/users/student1/server", json=body)
        assert again.status_code in (201, 202), again.text
        hub.wait_ready("student1")
        assert gpu_models_of(hub, "student1") == "NVIDIA L40S"
        hub.stop("student1")


@pytest.mark.timeout(240)
def test_refused_spawns_of_new_named_servers_leave_no_record(hub: Hub) -> None:
    # The demo allows 3 named servers; refusals must not use them up.
    assert hub.spawn("researcher1", {"gpu_model": "t4", "gpu_count": 2}).status_code in (201, 202)
    hub.wait_ready("researcher1")
    refusals = [
        ("n1", {"gpu_model": "t4", "gpu_count": -1}, 400, "from 0 (CPU only) to 4"),
        ("n2", {"gpu_model": "v100", "gpu_count": 1}, 400, "Unknown GPU model 'v100'"),
        ("n3", {"gpu_model": "t4", "gpu_count": 3}, 403, "limit is 4 GPUs"),
    ]
    for name, options, status, words in refusals:
        response = hub.spawn("researcher1", options, name=name)
        assert response.status_code == status, response.text
        assert words in response.json()["message"]
        wait_for(lambda n=name: n not in server_records(hub, "researcher1"), 30, f"{name} gone")

    session = hub.login("researcher1")
    bad_form = {"gpu_model": "t4", "gpu_count": "-1", "_xsrf": session.cookies.get("_xsrf")}
    page = session.post(f"{hub.url}/hub/spawn/researcher1/n4", data=bad_form, timeout=30)
    assert page.status_code == 400
    wait_for(lambda: "n4" not in server_records(hub, "researcher1"), 30, "n4 gone")

    ok = hub.spawn("researcher1", {"gpu_model": "t4", "gpu_count": 1}, name="n5")
    assert ok.status_code in (201, 202), ok.text
    hub.wait_ready("researcher1", "n5")
    assert server_records(hub, "researcher1") == {"", "n5"}


@pytest.mark.timeout(120)
def test_devices_reserved_to_a_group_underneath_are_a_403_with_the_reason(
    hub: Hub, ledger: Ledger
) -> None:
    # The spawn form's read syncs the fabric's devices into the ledger.
    assert hub.login("student2").get(f"{hub.url}/hub/spawn", timeout=30).status_code == 200
    t4s = [d for d in ledger.devices() if d.model == "NVIDIA T4"]
    assert t4s
    # Another hub sharing this ledger, with a newer catalog, gave the T4 chassis to
    # vision-lab: this hub's placement (older catalog) still offers them.
    ledger.sync_devices([dataclasses.replace(d, owner_group="vision-lab") for d in t4s])
    try:
        response = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1})
        assert response.status_code == 403, response.text
        assert "reserved to another group" in response.json()["message"]
        wait_for(lambda: hub.server("student2") is None, 30, "the refused server to be cleared")
        assert ledger.live_machines("student2") == []
        assert ledger.holders() == {}
    finally:
        ledger.sync_devices(t4s)
