"""The hub dies at each step of a spawn and a stop; after a restart, nothing is lost.

The fabric runs on its own here (as it does in production), so it outlives the
hub; notebook servers outlive it too, as pods do. The hub is SIGKILLed with its
proxy and services at a chosen step, started again on the same state, and the
reconciler (a hub-managed service, here with a short grace period) must leave:

* no device held by a machine nobody uses, in the ledger or on the fabric;
* no device with two holders;
* every server either running with all its devices attached, or stopped with none.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from composespawner.ledger import Ledger, Machine
from harness.hub import Hub, running_hub, wait_for
from harness.simulator import SimulatorProcess, SimulatorSwitches

pytestmark = pytest.mark.e2e
SLOW_NOTEBOOK = Path(__file__).with_name("slow_notebook.py")
TWO_T4 = {"gpu_model": "t4", "gpu_count": 2, "network": "25g", "scratch_gb": 0}
# A launch slow to begin (a boundary fake): holds a spawn between compose and launch.
# Its notebooks are told where the launch gate is (slow_notebook.py waits for it).
SLOW_LAUNCHER = """
import asyncio
import os
from composespawner.spawners.spawner import ComposeSpawner

class SlowLaunchComposeSpawner(ComposeSpawner):
    async def prepare_launch(self):
        await asyncio.sleep(4)  # the step under test lasts this long
        await super().prepare_launch()

c.JupyterHub.spawner_class = SlowLaunchComposeSpawner
c.Spawner.environment = {"COMPOSE_TEST_LAUNCH_GATE": os.environ["COMPOSE_TEST_LAUNCH_GATE"]}
"""


class LaunchGate:
    """Notebooks (slow_notebook.py) start answering only while the gate is open.

    A file in a folder of its own, which the account notebooks run as can reach
    (pytest's tmp_path is private to the test's account).
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="composespawner-gate-"))
        self.folder.chmod(0o755)
        self.path = self.folder / "open"
        self.open()

    def open(self) -> None:
        self.path.touch()

    def shut(self) -> None:
        self.path.unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.folder)


@pytest.fixture
def launch_gate() -> Iterator[LaunchGate]:
    gate = LaunchGate()
    try:
        yield gate
    finally:
        gate.remove()


@pytest.fixture
def hub(
    tmp_path: Path, external_fabric: SimulatorProcess, launch_gate: LaunchGate
) -> Iterator[Hub]:
    env = {
        "COMPOSE_NOTEBOOK_CMD": f"{sys.executable} {SLOW_NOTEBOOK}",
        "COMPOSE_TEST_LAUNCH_GATE": str(launch_gate.path),
        "COMPOSE_RECONCILE_EVERY": "1",
        "COMPOSE_RECONCILE_GRACE": "2",
    }
    with running_hub(tmp_path, SLOW_LAUNCHER, fabric_port=external_fabric.port, **env) as hub:
        yield hub


def fabric(hub: Hub) -> SimulatorSwitches:
    """The switches of the hub's fabric, and its own view (no added latency)."""
    return SimulatorSwitches(hub.fabric_url)


def machine_of(hub: Hub, user: str) -> Machine | None:
    ledger = Ledger(hub.ledger_url())
    try:
        return ledger.live_machine(user, "")
    except sa.exc.OperationalError:
        return None  # the hub has not created the ledger yet
    finally:
        ledger.close()


def wait_machine(hub: Hub, user: str, check: Callable[[Machine], bool], what: str) -> Machine:
    def found() -> Machine | None:
        machine = machine_of(hub, user)
        return machine if machine is not None and check(machine) else None

    return wait_for(found, 60, what, every=0.05)


def hub_saved_launch(hub: Hub, user: str) -> bool:
    """Whether the hub's own database holds the server's state after start().

    JupyterHub stores it only once start() has returned; a crash before that
    leaves the hub knowing of no server (and the reconciler releases the machine).
    """
    engine = sa.create_engine(f"sqlite:///{hub.state / 'jupyterhub.sqlite'}")
    query = sa.text(
        "SELECT spawners.state FROM spawners JOIN users ON users.id = spawners.user_id"
        " WHERE users.name = :user AND spawners.name = ''"
    )
    try:
        with engine.connect() as db:
            state = db.execute(query, {"user": user}).scalar()
    except sa.exc.OperationalError:
        return False  # the hub is writing it
    finally:
        engine.dispose()
    return state is not None and "run_manifest" in json.loads(state)


def agreement(hub: Hub) -> list[str]:
    """Where ledger, fabric and hub disagree (empty when they agree)."""
    problems = []
    ledger = Ledger(hub.ledger_url())
    try:
        live = ledger.live_machines()
        holders = ledger.holders()
    finally:
        ledger.close()
    attached = fabric(hub).attached()
    users = hub.request("GET", "/users", params={"state": "active"}).json()
    servers = {(u["name"], name): s for u in users for name, s in u["servers"].items()}
    on_fabric: dict[str, str] = {}
    for host, blocks in attached.items():
        for block in blocks:
            if block in on_fabric:
                problems.append(f"{block} attached to {on_fabric[block]} and {host}")
            on_fabric[block] = host
    for machine in live:
        server = servers.get((machine.user_name, machine.server_name))
        if server is None or not server.get("ready") or server.get("pending"):
            problems.append(f"machine {machine.id} ({machine.state}) has no running server")
        devices = set(machine.block_ids) - {f"{machine.host_id}-block"}
        if set(attached.get(machine.host_id or "", [])) != devices:
            problems.append(f"machine {machine.id} holds {devices}, fabric has {attached}")
    held = {b for b in holders if not b.endswith("-block")}
    if held != set(on_fabric):
        problems.append(f"ledger holds {sorted(held)} but the fabric has {sorted(on_fabric)}")
    for (user, name), server in servers.items():
        if server.get("ready") and not any(
            m.user_name == user and m.server_name == name for m in live
        ):
            problems.append(f"server {user}/{name} runs without a machine")
    return problems


def spawn_in_background(hub: Hub, pool: ThreadPoolExecutor, user: str) -> None:
    # The answer may never come: the hub dies while it works on it.
    pool.submit(_spawn_quietly, hub, user)


def _spawn_quietly(hub: Hub, user: str) -> Any:
    try:
        return hub.spawn(user, TWO_T4)
    except requests.RequestException:
        return None


def crash_and_restart(hub: Hub) -> None:
    hub.crash()
    fabric(hub).clear_faults()
    hub.restart()


def assert_all_agree(hub: Hub) -> None:
    wait_for(lambda: not agreement(hub), 60, "ledger, fabric and hub to agree", every=0.5)


def assert_can_spawn_again(hub: Hub, user: str) -> None:
    response = hub.spawn(user, TWO_T4)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user)
    machine = machine_of(hub, user)
    assert machine is not None
    assert machine.state == "running"
    assert len(fabric(hub).attached()[machine.host_id or ""]) == 3  # two GPUs and the NIC
    hub.stop(user)
    wait_for(lambda: not fabric(hub).attached(), 30, "the devices to be free")


SPAWN_STEPS: dict[str, Callable[[Hub], None]] = {}


def _step(name: str) -> Callable[[Callable[[Hub], None]], Callable[[Hub], None]]:
    def register(wait: Callable[[Hub], None]) -> Callable[[Hub], None]:
        SPAWN_STEPS[name] = wait
        return wait

    return register


@_step("after-the-claim")
def _claimed(hub: Hub) -> None:
    wait_machine(hub, "student1", lambda m: m.state == "claimed", "the claim")
    assert not fabric(hub).attached(), "the step under test is before any attach"


@_step("mid-compose")
def _mid_compose(hub: Hub) -> None:
    wait_for(lambda: fabric(hub).attached(), 60, "a first device attached", every=0.05)
    machine = machine_of(hub, "student1")
    assert machine is not None
    assert machine.state == "claimed"


@_step("after-compose-before-launch")
def _composed(hub: Hub) -> None:
    wait_machine(hub, "student1", lambda m: m.state == "launching", "compose")


@_step("mid-launch")
def _launching(hub: Hub) -> None:
    # The notebook process runs (its state is saved) but does not answer: the
    # launch gate is shut until the restarted hub has found it.
    wait_machine(hub, "student1", lambda m: m.state == "running", "the launch")
    wait_for(lambda: hub_saved_launch(hub, "student1"), 30, "the hub to store it", every=0.02)
    server = hub.server("student1")
    assert server is not None
    assert server["pending"] == "spawn"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("step", list(SPAWN_STEPS))
def test_the_hub_dies_during_a_spawn(hub: Hub, launch_gate: LaunchGate, step: str) -> None:
    fabric(hub).faults(latency_s=0.6)  # each attach takes a while, so every step lasts long enough
    launch_gate.shut()
    with ThreadPoolExecutor(1) as pool:
        spawn_in_background(hub, pool, "student1")
        SPAWN_STEPS[step](hub)
        launched = machine_of(hub, "student1")
        crash_and_restart(hub)

    if step == "mid-launch":
        # The restarted hub found the notebook launched and waits for it to answer.
        server = hub.server("student1")
        assert server is not None, f"the launched server was dropped:\n{hub.log_tail()}"
        assert server["pending"] == "check"
    launch_gate.open()
    assert_all_agree(hub)
    if step == "mid-launch":
        # Kept, ready, on the machine composed for it (agreement checked its devices).
        hub.wait_ready("student1")
        machine = machine_of(hub, "student1")
        assert launched is not None
        assert machine is not None
        assert (machine.id, machine.state) == (launched.id, "running")
        hub.stop("student1")
        wait_for(lambda: not fabric(hub).attached(), 30, "the devices to be free")
        hub.wait_released(machine.id)
    else:
        assert machine_of(hub, "student1") is None, "the half-made machine was released"
        assert not fabric(hub).attached()
        assert "Reconcile: release-orphan" in hub.log_path.read_text()
    assert_can_spawn_again(hub, "student1")


@pytest.mark.timeout(150)
def test_the_hub_dies_mid_stop(hub: Hub) -> None:
    response = hub.spawn("student1", TWO_T4)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    machine = machine_of(hub, "student1")
    assert machine is not None
    fabric(hub).faults(latency_s=1.0)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: hub.request("DELETE", "/users/student1/server"))
        wait_machine(hub, "student1", lambda m: m.state == "stopping", "the stop to begin")
        wait_for(
            lambda: len(fabric(hub).attached().get(machine.host_id or "", [])) < 3,
            30,
            "a first detach",
            every=0.05,
        )
        crash_and_restart(hub)

    assert_all_agree(hub)
    assert machine_of(hub, "student1") is None
    assert hub.server("student1") is None
    assert_can_spawn_again(hub, "student1")


@pytest.mark.timeout(150)
def test_a_running_server_survives_a_hub_crash_with_its_devices(hub: Hub) -> None:
    response = hub.spawn("student1", TWO_T4)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    before = machine_of(hub, "student1")
    assert before is not None

    crash_and_restart(hub)
    hub.wait_ready("student1")
    # Several reconciler passes (every second) come and go; nothing changes.
    wait_for(lambda: hub.log_path.read_text().count("reconcile]") >= 1, 30, "the reconciler")
    assert_all_agree(hub)
    after = machine_of(hub, "student1")
    assert after is not None
    assert (after.id, after.state, after.block_ids) == (before.id, "running", before.block_ids)
    hub.stop("student1")
    wait_for(lambda: not fabric(hub).attached(), 30, "the devices to be free")


@pytest.mark.timeout(150)
def test_the_hubs_services_end_when_the_hub_is_killed(hub: Hub) -> None:
    def services() -> list[int] | None:
        found = hub.processes(" reconcile ") + hub.processes("jupyterhub_idle_culler")
        return found if len(found) == 2 else None

    reconciler_and_culler = wait_for(services, 30, "the reconciler and the culler to run")
    hub.kill_hub()  # the hub alone: nobody stops its services for it
    wait_for(
        lambda: not set(reconciler_and_culler) & set(hub.processes()),
        5,
        "the reconciler and the culler to end with the hub",
        every=0.1,
    )

    logged_before = hub.log_path.stat().st_size
    hub.restart()  # returns once the hub answers: it has started its services
    reconcilers = wait_for(lambda: hub.processes(" reconcile "), 30, "a reconciler")
    assert len(reconcilers) == 1, [hub.processes("reconcile")]

    # Up, not only started: a hub stopped while its services are still starting (the
    # fixture's teardown, 50 ms after this) has once waited on them past its 30 s.
    def reconciling() -> bool:
        with hub.log_path.open("rb") as log:
            log.seek(logged_before)
            return b"Reconciling for hub" in log.read()

    wait_for(reconciling, 30, "the new reconciler's first pass")
