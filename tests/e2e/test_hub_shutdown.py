"""A hub stopped by an admin closes what it opened on the fabric."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hub import Hub, running_hub, wait_for
from harness.simulator import SimulatorProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def hub(tmp_path: Path, external_fabric: SimulatorProcess) -> Iterator[Hub]:
    with running_hub(
        tmp_path, fabric_port=external_fabric.port, COMPOSE_RECONCILE_EVERY="1"
    ) as hub:
        yield hub


def fabric_sessions(hub: Hub) -> int:
    return int(hub.redfish("/redfish/v1/SessionService/Sessions")["Members@odata.count"])


@pytest.mark.timeout(120)
def test_a_stopped_hub_logs_its_spawners_and_reconciler_out_of_the_fabric(hub: Hub) -> None:
    form = hub.login("student1").get(f"{hub.url}/hub/spawn", timeout=30)
    assert "gpu_model" in form.text  # the form read the fabric: the hub's client logged in
    wait_for(lambda: fabric_sessions(hub) >= 2, 30, "the hub and the reconciler to log in")

    hub.proc.send_signal(signal.SIGTERM)
    hub.proc.wait(timeout=60)

    assert fabric_sessions(hub) == 0
