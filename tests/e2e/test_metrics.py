"""The hub's /hub/metrics shows the pool: what a spawn holds, how long composing took."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.hub import Hub, running_hub

pytestmark = pytest.mark.e2e
ONE_T4 = {"gpu_model": "t4", "gpu_count": 1, "network": "25g", "scratch_gb": 0}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    with running_hub(tmp_path) as hub:
        yield hub


def scrape(hub: Hub) -> Samples:
    response = hub.api.get(f"{hub.url}/hub/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


@pytest.mark.timeout(180)
def test_metrics_after_a_spawn_and_a_stop(hub: Hub) -> None:
    response = hub.spawn("student1", ONE_T4)
    assert response.status_code in (201, 202), response.text
    server = hub.wait_ready("student1")
    running = scrape(hub)
    hub.stop("student1")  # the release goes on in the background
    hub.wait_released(server["state"]["compose"]["machine_id"])
    released = scrape(hub)

    t4 = {"kind": "gpu", "model": "NVIDIA T4"}
    timed = "composespawner_fabric_request_duration_seconds_count"
    assert total(running, "composespawner_devices", state="held", **t4) == 1
    assert total(released, "composespawner_devices", state="held", **t4) == 0
    assert total(released, "composespawner_devices", state="free", **t4) > 0
    assert total(running, "composespawner_compose_duration_seconds_count") == 1
    assert total(running, timed, operation="compose") == 1
    assert total(released, timed, operation="decompose") == 1
    assert total(released, "composespawner_releases_pending_retry") == 0
