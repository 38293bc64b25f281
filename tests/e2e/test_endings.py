"""Every way a server ends gives its devices back: idle culling and a launch that fails."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for

pytestmark = pytest.mark.e2e
WRAPPER = Path(__file__).with_name("notebook_or_fail.py")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    env = {
        "COMPOSE_CULL_TIMEOUT": "6",
        "COMPOSE_CULL_EVERY": "2",
        "COMPOSE_NOTEBOOK_CMD": f"{sys.executable} {WRAPPER}",
    }
    # A notebook that died at launch is noticed when the hub gives up waiting for it.
    config = "c.Spawner.http_timeout = 15\n"
    with running_hub(tmp_path_factory.mktemp("hub"), config, **env) as hub:
        yield hub


@pytest.mark.timeout(180)
def test_the_idle_culler_gives_the_devices_back(hub: Hub, ledger: Ledger) -> None:
    response = hub.spawn("student1", {"gpu_model": "a100", "gpu_count": 2})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    env = process_env(notebook_pid(hub, "student1"))
    assert len(hub.attached(env["COMPOSE_HOST"])) == 2
    # Nobody uses the server; the culler (6 s timeout) must stop it.
    hub.wait_gone("student1", timeout=90)
    wait_for(lambda: hub.attached(env["COMPOSE_HOST"]) == [], 30, "the devices to be detached")
    machine = ledger.machine(env["COMPOSE_MACHINE_ID"])
    assert machine is not None
    assert machine.state == "released"
    assert "idle-culler" in hub.log_path.read_text()


@pytest.mark.timeout(180)
def test_a_launch_that_fails_gives_the_devices_back(hub: Hub, ledger: Ledger) -> None:
    response = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1}, name="fail-now")
    assert response.status_code in (201, 202, 500), response.text
    hub.wait_gone("student2", "fail-now", timeout=90)
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")
    # The machine was composed before the launch failed; nothing of it is held now.
    assert re.search(
        r"Composed machine \w+ for student2/fail-now on host-", hub.log_path.read_text()
    )
    assert ledger.live_machines("student2") == []
    assert ledger.holders() == {}
