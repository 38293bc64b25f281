"""The spawner in process, on pytest-jupyterhub's MockHub: start, progress, state, poll, stop.

The subprocess hub of tests/e2e shows what a user meets; this one reaches into
the spawner itself. The fabric is the real simulator, as a process of its own
(harness/simulator.py); the notebook is JupyterHub's own mock
single-user server (``MockSpawner``), the launcher the mixin composes around.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyterhub.httpclient import JupyterHubHTTPClient
from jupyterhub.tests.mocking import MockHub, MockSpawner
from jupyterhub.tests.utils import add_user
from jupyterhub.user import User
from sqlalchemy import event

from composespawner.services.settings import upgrade_ledger
from composespawner.spawners.spawner import ComposeMixin
from harness.hub import FABRIC_AUTH
from harness.paths import HUB_CONFIG, ROOT
from harness.simulator import SimulatorProcess

ONE_T4 = {"gpu_model": "t4", "gpu_count": 1, "network": "25g", "scratch_gb": 0}
PROXY = ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
HubApp = Callable[[dict[str, Any]], Awaitable[MockHub]]


class MockComposeSpawner(ComposeMixin, MockSpawner):
    """Compose a machine around JupyterHub's mock notebook."""


@pytest.fixture
def fabric_url(tmp_path: Path) -> Iterator[str]:
    with SimulatorProcess([], tmp_path / "fabric.log", credentials=FABRIC_AUTH) as simulator:
        yield simulator.url


@pytest.fixture
async def proxies() -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    """What hub_app's shutdown leaves: its proxy (signalled, not waited for) and an HTTP client.

    Set up before hub_app, so torn down after it.
    """
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proxy in started:
        proxy.wait(timeout=10)
    if JupyterHubHTTPClient.initialized():  # reopened by the shutdown after closing it
        await JupyterHubHTTPClient.instance().close()


@pytest.fixture
async def student(
    fabric_url: str, proxies: list[subprocess.Popen[bytes]], hub_app: HubApp, tmp_path: Path
) -> User:
    # The fabric is set up before hub_app, so it outlives the hub, whose shutdown
    # logs out of it.
    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade_ledger(ledger_url)
    app = await hub_app(
        {
            "JupyterHub": {"spawner_class": MockComposeSpawner},
            "ConfigurableHTTPProxy": {"command": [str(PROXY)]},
            "MockComposeSpawner": {
                "ledger_url": ledger_url,
                "fabric_url": fabric_url,
                "fabric_username": FABRIC_AUTH[0],
                "fabric_password": FABRIC_AUTH[1],
                "catalog_file": str(HUB_CONFIG / "catalog.toml"),
                "hub_id": "mockhub",
                # One inventory read for the whole test: what a start reads is counted.
                "inventory_cache_seconds": 600,
            },
        }
    )
    proxies.append(app.proxy.proxy_process)
    return add_user(app.db, app, name="student1")


@pytest.mark.timeout(60)
async def test_start_shows_progress_keeps_state_and_stop_gives_everything_back(
    student: User,
) -> None:
    spawner = student.spawner
    assert isinstance(spawner, MockComposeSpawner)

    await student.spawn(options=ONE_T4)

    messages = [event["message"] async for event in spawner.progress()]
    assert messages[0].startswith("claiming 1 × NVIDIA T4 16GB in rack-")
    assert any(m.startswith("starting notebook on host-") for m in messages)
    state = spawner.get_state()["compose"]
    assert state["version"] == 1
    assert len(state["gpus"]) == 1
    machine_id = state["machine_id"]
    assert spawner.composer.ledger.machine(machine_id).state == "running"
    assert await spawner.poll() is None
    assert len(spawner.composer.ledger.holders()) == 2  # the GPU and the NIC: the host is shared
    machine = spawner.composer.ledger.machine(machine_id)
    assert (machine.cores, machine.memory_gib) == (4, 32)  # the size for one GPU

    await student.stop()  # returns once the notebook is down; the release goes on
    assert await spawner.composer.wait_released(machine_id, within=10)

    assert spawner.composer.ledger.machine(machine_id).state == "released"
    assert spawner.composer.ledger.holders() == {}
    assert "compose" not in spawner.get_state()


@pytest.mark.timeout(60)
async def test_a_notebook_found_dead_by_poll_releases_its_machine(student: User) -> None:
    spawner = student.spawner
    await student.spawn(options=ONE_T4)
    machine_id = spawner.get_state()["compose"]["machine_id"]

    spawner.proc.send_signal(signal.SIGKILL)
    spawner.proc.wait(timeout=10)
    status = await spawner.poll()

    assert status is not None
    assert await spawner.composer.wait_released(machine_id, within=10)
    assert spawner.composer.ledger.machine(machine_id).state == "released"
    assert spawner.composer.ledger.holders() == {}


@pytest.mark.timeout(60)
async def test_a_start_reads_the_portals_registrations_once(student: User) -> None:
    """Admission brings them; checking the request against the models the user may
    see reuses them instead of reading the table again (each spawn of a rush did)."""
    spawner = student.spawner
    await spawner.composer.pool.inventory()  # the inventory read reads them too
    engine = spawner.composer.ledger.engine
    reads: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM colocated" in statement:
            reads.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        await student.spawn(options=ONE_T4)
    finally:
        event.remove(engine, "before_cursor_execute", count)

    assert spawner.machine is not None
    assert len(reads) == 1, reads
    machine_id = spawner.machine.machine_id
    await student.stop()
    assert await spawner.composer.wait_released(machine_id, within=10)
