"""A spawn whose *first* fabric read meets an outage: an actionable 503, nothing claimed.

The spawner reads the inventory to validate the request before the composer
claims anything (``ComposeMixin._visible_model_ids`` → ``Composer.offer``); an
outage there must read like one met later during compose (see test_faults.py),
never as a 500 or as Redfish internals ("GET /redfish/v1/...: Stream closed").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.hub import Hub
from tests.e2e.test_faults import (
    TWO_T4,
    HubFabric,
    assert_nothing_kept,
    faulty_fabric,
    hub_with_faults,
    spawns_fine,
)

pytestmark = pytest.mark.e2e
# Every spawn reads the fabric afresh, as a REST spawn does whenever nobody
# opened the spawn form in the last few seconds (the cache lasts 3 s).
NO_INVENTORY_CACHE = "c.ComposeSpawner.inventory_cache_seconds = 0\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with hub_with_faults(tmp_path_factory.mktemp("hub"), NO_INVENTORY_CACHE) as hub:
        yield hub


@pytest.fixture
def fabric(hub: Hub) -> Iterator[HubFabric]:
    with faulty_fabric(hub) as fabric:
        yield fabric


def assert_actionable(message: str) -> None:
    """Says the fabric is the trouble and what to do, without the client's internals."""
    assert "GPU fabric" in message, message
    assert "try again" in message.lower(), message
    assert "Stream closed" not in message, message
    assert "/redfish/" not in message, message


def test_a_rest_spawn_meeting_an_unreachable_fabric_is_told_so(hub: Hub, fabric: HubFabric) -> None:
    fabric.faults(drop_connections=True, latency_s=0.2)  # latency: time to watch progress
    response, events = hub.spawn_watching("student1", TWO_T4)
    assert response.status_code == 503, response.text
    message = str(response.json()["message"])
    assert_actionable(message)
    final = events[-1]
    assert final.get("failed") is True, events
    assert_actionable(final["message"])
    assert_nothing_kept(fabric, "student1")

    fabric.clear_faults()
    spawns_fine(hub, "student1", TWO_T4, devices=2)


def test_the_form_submitted_during_an_outage_says_the_fabric_is_down(
    hub: Hub, fabric: HubFabric
) -> None:
    session = hub.login("student2")
    assert "NVIDIA T4 16GB" in session.get(f"{hub.url}/hub/spawn", timeout=30).text
    fabric.faults(drop_connections=True)  # between showing the form and submitting it
    form = {"gpu_model": "t4", "gpu_count": "1", "_xsrf": session.cookies.get("_xsrf")}
    page = session.post(f"{hub.url}/hub/spawn", data=form, timeout=60)
    assert page.status_code in (200, 503), page.text[-2000:]
    assert "GPU fabric" in page.text
    assert "Stream closed" not in page.text, "the form shows the Redfish client's error"
    assert_nothing_kept(fabric, "student2")
