"""The fabric misbehaves during spawn, stop and poll: users are told, hardware is never lost.

A real hub runs the simulated fabric with its fault switches (``/sim/faults``,
through harness/simulator.py).
Each test switches one fault on and checks docs/architecture.md's invariants from
the outside:

* compose is all-or-nothing (4): a spawn the fabric breaks fails with a message
  the user can act on, leaves nothing attached and nothing held, and the user
  can spawn again once the fabric is well;
* uncertainty never frees hardware (6): while the fabric cannot be reached,
  devices stay held in the ledger (and attached), ``poll`` keeps a server
  running, and releases are retried with backoff until the fabric confirms.

The fabric's own view is read through ``/sim/state``, which no fault touches,
so a test can see what is attached even while Redfish is unreachable.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from composespawner.ledger import Ledger, Machine
from harness.hub import FABRIC_AUTH, Hub, notebook_pid, process_env, running_hub, wait_for
from harness.simulator import SimulatorSwitches

pytestmark = pytest.mark.e2e
TWO_T4 = {"gpu_model": "t4", "gpu_count": 2}
# Four devices, attached one after another: a fault switched on when the first
# is attached still meets the compose, however late the test is by a second or two.
FOUR_DEVICES = {"gpu_model": "t4", "gpu_count": 2, "network": "25g", "scratch_gb": 1920}
UNREACHABLE = "The GPU fabric stopped answering while your machine was being put together."
# Long enough to make the composer give up and to look several times; the
# background release then needs a few more seconds of backoff to notice it is over.
OUTAGE_S = 8.0
RELEASE_BOUND_S = 40.0  # backoff after an outage of this kind stays well below it


@dataclass(frozen=True)
class HubFabric(SimulatorSwitches):
    """The hub's fabric simulator: its fault switches and own view, and the hub's ledger."""

    hub: Hub = field(kw_only=True)
    ledger: Ledger = field(kw_only=True)

    def answers(self) -> bool:
        """Whether the fabric's Redfish service answers at all."""
        try:
            url = f"{self.hub.fabric_url}/redfish/v1/Systems"
            return requests.get(url, auth=FABRIC_AUTH, timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def assert_clean(self) -> None:
        assert self.hub.composed_hosts() == {}
        assert self.tagged() == {}
        assert self.ledger.holders() == {}
        assert self.ledger.holds().split == {}
        assert self.ledger.live_machines() == []


@contextmanager
def faulty_fabric(hub: Hub) -> Iterator[HubFabric]:
    """A test's view of ``hub``'s fabric: no faults and nothing composed before and after."""
    fabric = HubFabric(hub.fabric_url, hub=hub, ledger=Ledger(hub.ledger_url()))
    try:
        fabric.clear_faults()
        fabric.assert_clean()
        yield fabric
        fabric.clear_faults()
        for user in ("student1", "student2", "researcher1"):
            for name in hub.user(user).get("servers", {}):
                hub.stop(user, name)
        wait_for(lambda: fabric.ledger.holders() == {}, RELEASE_BOUND_S, "every device freed")
        fabric.assert_clean()
    finally:
        fabric.clear_faults()
        fabric.ledger.close()


def ledger_ready(hub: Hub) -> Hub:
    """The hub once its ledger exists: made by the first use of the spawner, the form here."""
    page = hub.login("student1").get(f"{hub.url}/hub/spawn", timeout=30)
    assert page.status_code == 200, page.text[-2000:]
    ledger = Ledger(hub.ledger_url())
    try:
        wait_for(ledger.schema_revision, 30, "the ledger's schema")
    finally:
        ledger.close()
    return hub


@contextmanager
def hub_with_faults(tmp: Path, extra_config: str = "", fabric_args: str = "") -> Iterator[Hub]:
    """A hub whose fabric serves its fault switches, once its ledger exists."""
    # The reconciler is tested elsewhere; here the composer alone must release.
    with running_hub(
        tmp,
        extra_config,
        COMPOSE_FABRIC_ARGS=f"--faults-api {fabric_args}".strip(),
        COMPOSE_RECONCILE_EVERY="3600",
    ) as hub:
        yield ledger_ready(hub)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with hub_with_faults(tmp_path_factory.mktemp("hub")) as hub:
        yield hub


@pytest.fixture(scope="module")
def async_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A hub whose fabric answers attach and detach with 202 + a task monitor."""
    with hub_with_faults(tmp_path_factory.mktemp("async-hub"), fabric_args="--async-tasks") as hub:
        yield hub


@pytest.fixture
def fabric(hub: Hub) -> Iterator[HubFabric]:
    with faulty_fabric(hub) as fabric:
        yield fabric


@pytest.fixture
def async_fabric(async_hub: Hub) -> Iterator[HubFabric]:
    with faulty_fabric(async_hub) as fabric:
        yield fabric


# -- helpers -----------------------------------------------------------------------------


def assert_refused_spawn(
    response: requests.Response, events: list[dict[str, Any]], *words: str
) -> str:
    """The spawn failed with a message saying ``words``, in the answer and on the progress page."""
    assert response.status_code == 503, response.text
    message = str(response.json()["message"])
    for word in words:
        assert word in message, message
    assert "try again" in message.lower(), message
    assert "Traceback" not in message, message
    assert "Error(" not in message, message
    assert "/redfish" not in message, "Redfish details belong in the log"
    final = events[-1]
    assert final.get("failed") is True, events
    assert final["message"] == f"Spawn failed: {message}", events
    return message


def assert_nothing_kept(fabric: HubFabric, user: str) -> None:
    """After a failed spawn: no server, nothing attached or marked, nothing held, no machine."""
    fabric.hub.wait_gone(user)
    assert fabric.attached() == {}
    assert fabric.tagged() == {}
    assert fabric.ledger.holders() == {}
    assert fabric.ledger.live_machine(user, "") is None


def spawns_fine(hub: Hub, user: str, options: dict[str, Any], devices: int) -> None:
    """A spawn that composes ``devices`` devices, runs the notebook, and gives them back."""
    response = hub.spawn(user, options)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user)
    env = process_env(notebook_pid(hub, user))
    assert len(hub.attached(env["COMPOSE_HOST"])) == devices
    hub.stop(user)
    hub.wait_released(env["COMPOSE_MACHINE_ID"])
    assert hub.composed_hosts() == {}


def spawn_then_fault(
    fabric: HubFabric, user: str, options: dict[str, Any], moment: str, **settings: Any
) -> tuple[requests.Response, list[dict[str, Any]], float]:
    """Spawn on a slow fabric; switch to ``settings`` at ``moment`` of the compose.

    ``moment`` is "claimed" (the ledger holds the devices, the fabric was not
    written yet) or "attached" (the first device is on the host). Returns the
    spawn's answer, its progress events and when the fault was switched on.
    """
    reached = {
        "claimed": lambda: fabric.ledger.holders(),
        "attached": lambda: fabric.attached(),
    }[moment]
    # Every Redfish request takes 0.5 s: the test sees the moment and switches
    # the fault on well before the composer's next request.
    fabric.faults(latency_s=0.5)
    with ThreadPoolExecutor(1) as pool:
        spawning = pool.submit(fabric.hub.spawn_watching, user, options)
        wait_for(reached, 30, f"the spawn to have {moment}", every=0.05)
        fabric.faults(**settings)
        switched_at = time.monotonic()
        response, events = spawning.result(timeout=90)
    return response, events, switched_at


def machine_devices(machine: Machine) -> list[str]:
    """The devices a machine holds, its host's own block left out."""
    return sorted(b for b in machine.block_ids if b != f"{machine.host_id}-block")


def held_while_unreachable(fabric: HubFabric, machine: Machine, attached: Any) -> None:
    """One look during an outage: everything the machine had is still held and attached."""
    now = fabric.ledger.machine(machine.id)
    assert now is not None
    assert now.state == "stopping", now
    assert now.block_ids == machine.block_ids
    assert fabric.ledger.holders() == dict.fromkeys(machine.block_ids, machine.id)
    assert fabric.attached() == attached


def release_retries(hub: Hub, machine_id: str) -> list[float]:
    """The backoff delays of the background release of ``machine_id``, from the hub's log."""
    pattern = rf"Release of {machine_id} not confirmed \(.*\); retry in ([0-9.]+)s"
    return [float(d) for d in re.findall(pattern, hub.log_path.read_text())]


# -- compose-time faults: the fabric answers, but no ---------------------------------------

REFUSALS = [
    pytest.param(
        {"fail_after_attachments": 1},
        "attaching GPU 2/2",  # the first GPU was attached: the undo must detach it
        ("The GPU fabric refused to compose your machine", "HTTP 500"),
        id="fail-after-one-attachment",
    ),
    pytest.param(
        {"error_rate": 1.0, "seed": 7},
        "claiming 2 × NVIDIA T4",
        ("The GPU fabric refused", "HTTP 503"),
        id="every-write-fails",
    ),
    pytest.param(
        {"stale_etags": True},
        "claiming 2 × NVIDIA T4",
        ("The GPU fabric refused", "HTTP 412"),
        id="stale-etags",
    ),
]


@pytest.mark.parametrize(("fault", "reached", "words"), REFUSALS)
def test_a_refusing_fabric_fails_the_spawn_and_keeps_nothing(
    hub: Hub,
    fabric: HubFabric,
    fault: dict[str, Any],
    reached: str,
    words: tuple[str, ...],
) -> None:
    # A little latency makes the spawn last long enough to watch its progress.
    fabric.faults(**fault, latency_s=0.2)
    response, events = hub.spawn_watching("student1", TWO_T4)
    assert_refused_spawn(response, events, *words)
    assert any(e["message"].startswith(reached) for e in events), events
    assert_nothing_kept(fabric, "student1")

    fabric.clear_faults()
    spawns_fine(hub, "student1", TWO_T4, devices=2)


def test_a_failed_fabric_task_fails_the_spawn_and_keeps_nothing(
    async_hub: Hub, async_fabric: HubFabric
) -> None:
    async_fabric.faults(task_failure=True)
    response, events = async_hub.spawn_watching("student1", TWO_T4)
    assert_refused_spawn(response, events, "The GPU fabric failed while attaching a device")
    assert any(e["message"].startswith("attaching GPU 1/2") for e in events), events
    assert_nothing_kept(async_fabric, "student1")

    async_fabric.clear_faults()
    spawns_fine(async_hub, "student1", TWO_T4, devices=2)


# -- compose-time faults: the fabric goes away ---------------------------------------------


def test_dropped_connections_mid_compose_keep_devices_held_until_the_fabric_confirms(
    hub: Hub, fabric: HubFabric
) -> None:
    response, events, _ = spawn_then_fault(
        fabric, "student2", FOUR_DEVICES, "attached", drop_connections=True
    )
    assert_refused_spawn(response, events, UNREACHABLE, "try again in a few minutes")
    hub.wait_gone("student2")

    # The undo could not be confirmed: unknown is not dead, so nothing is freed.
    attached = fabric.attached()
    machine = fabric.ledger.live_machine("student2", "")
    assert machine is not None
    assert list(attached) == [machine.host_id], attached
    assert set(attached[str(machine.host_id)]) <= set(machine_devices(machine))
    looks = 0

    def still_held_and_retrying() -> bool:
        nonlocal looks
        assert not fabric.answers()
        held_while_unreachable(fabric, machine, attached)
        looks += 1
        return len(release_retries(hub, machine.id)) >= 2

    wait_for(still_held_and_retrying, 30, "the release to be retried twice", every=0.5)
    assert looks >= 3

    fabric.clear_faults()
    wait_for(lambda: fabric.ledger.holders() == {}, RELEASE_BOUND_S, "the devices to be freed")
    assert fabric.attached() == {}
    assert fabric.tagged() == {}
    ended = fabric.ledger.machine(machine.id)
    assert ended is not None
    assert ended.state == "failed"
    assert ended.failure is not None
    assert ended.failure.startswith(UNREACHABLE)
    assert fabric.ledger.live_machine("student2", "") is None
    spawns_fine(hub, "student2", TWO_T4, devices=2)


def test_an_outage_after_the_claim_fails_the_spawn_and_frees_the_claim_once_over(
    hub: Hub, fabric: HubFabric
) -> None:
    response, events, outage_from = spawn_then_fault(
        fabric, "researcher1", TWO_T4, "claimed", unreachable_for_s=OUTAGE_S
    )
    assert_refused_spawn(response, events, UNREACHABLE)
    hub.wait_gone("researcher1")

    machine = fabric.ledger.live_machine("researcher1", "")
    assert machine is not None
    assert len(machine_devices(machine)) == 2  # both GPUs were claimed before the outage
    attached = fabric.attached()
    looks = 0
    # Look until shortly before the outage ends on its own.
    while time.monotonic() - outage_from < OUTAGE_S - 1.5:
        assert not fabric.answers()
        held_while_unreachable(fabric, machine, attached)
        looks += 1
        time.sleep(0.5)  # the outage lasts a known time; look while it does
    assert looks >= 2

    wait_for(lambda: fabric.ledger.holders() == {}, RELEASE_BOUND_S, "the claim to be freed")
    assert fabric.attached() == {}
    assert fabric.tagged() == {}
    assert hub.composed_hosts() == {}
    assert fabric.ledger.live_machine("researcher1", "") is None
    assert release_retries(hub, machine.id), "the release was not retried in the background"
    spawns_fine(hub, "researcher1", TWO_T4, devices=2)


# -- stop and poll while the fabric is away ------------------------------------------------


def test_a_stop_during_an_outage_keeps_devices_held_and_retries_the_release(
    hub: Hub, fabric: HubFabric
) -> None:
    assert hub.spawn("student1", TWO_T4).status_code in (201, 202)
    hub.wait_ready("student1")
    machine = fabric.ledger.live_machine("student1", "")
    assert machine is not None
    attached = fabric.attached()
    assert {h: sorted(a) for h, a in attached.items()} == {
        machine.host_id: machine_devices(machine)
    }

    fabric.faults(drop_connections=True)
    response = hub.request("DELETE", "/users/student1/server")
    assert response.status_code in (202, 204), response.text
    hub.wait_gone("student1")  # the server stops in the hub, the hardware does not go
    # The stop waited a few seconds for the fabric and then left the release to
    # the background: watch it retry twice more, the devices held all along.
    retried = len(release_retries(hub, machine.id))
    looks = 0

    def still_held_and_retrying() -> bool:
        nonlocal looks
        assert not fabric.answers()
        held_while_unreachable(fabric, machine, attached)
        looks += 1
        return len(release_retries(hub, machine.id)) >= retried + 2

    wait_for(still_held_and_retrying, 60, "the release to be retried twice more", every=0.5)
    assert looks >= 3

    fabric.clear_faults()
    wait_for(lambda: fabric.ledger.holders() == {}, RELEASE_BOUND_S, "the devices to be freed")
    assert fabric.attached() == {}
    assert hub.composed_hosts() == {}
    released = fabric.ledger.machine(machine.id)
    assert released is not None
    assert released.state == "released"
    delays = release_retries(hub, machine.id)
    assert delays == sorted(delays), delays  # backing off...
    assert delays[-1] > delays[0], delays  # ...not hammering
    assert f"Released machine {machine.id} (released)" in hub.log_path.read_text()


def test_the_last_share_holder_stopped_in_an_outage_keeps_the_gpu_until_it_is_detached(
    hub: Hub, fabric: HubFabric
) -> None:
    quarter = {"gpu_model": "t4", "gpu_count": 1, "gpu_share": 4}
    for user in ("student1", "student2"):
        assert hub.spawn(user, quarter).status_code in (201, 202)
    machines = []
    for user in ("student1", "student2"):
        hub.wait_ready(user)
        machine = fabric.ledger.live_machine(user, "")
        assert machine is not None
        machines.append(machine)
    [[gpu]] = {m.shared for m in machines}  # both hold a share of one GPU

    hub.stop("student1")  # not the last holder: the GPU stays for student2
    hub.wait_released(machines[0].id)
    assert gpu in fabric.attached()[machines[1].host_id]

    fabric.faults(drop_connections=True)
    assert hub.request("DELETE", "/users/student2/server").status_code in (202, 204)
    hub.wait_gone("student2")
    retried = len(release_retries(hub, machines[1].id))

    def closing_and_retrying() -> bool:
        split = fabric.ledger.holds().split
        assert split[gpu].closing, split  # nobody may join it
        assert split[gpu].holders == 0, split
        assert gpu in fabric.attached()[machines[1].host_id]
        return len(release_retries(hub, machines[1].id)) >= retried + 1

    wait_for(closing_and_retrying, 60, "the last holder's release to be retried", every=0.5)
    fabric.clear_faults()
    wait_for(
        lambda: fabric.ledger.holds().split == {}, RELEASE_BOUND_S, "the shared GPU to be freed"
    )
    assert fabric.attached() == {}
    released = fabric.ledger.machine(machines[1].id)
    assert released is not None
    assert released.state == "released"


def test_poll_during_an_outage_keeps_the_server_running(hub: Hub, fabric: HubFabric) -> None:
    assert hub.spawn("student2", TWO_T4).status_code in (201, 202)
    hub.wait_ready("student2")
    machine = fabric.ledger.live_machine("student2", "")
    assert machine is not None
    attached = fabric.attached()
    assert attached

    # Several poll intervals (2 s here) pass while the fabric cannot be reached.
    fabric.faults(unreachable_for_s=OUTAGE_S)
    outage_from = time.monotonic()
    looks = 0
    while time.monotonic() - outage_from < OUTAGE_S - 0.5:
        assert not fabric.answers()
        server = hub.server("student2")
        assert server is not None
        assert server["ready"], server
        assert fabric.ledger.holders() == dict.fromkeys(machine.block_ids, machine.id)
        assert fabric.attached() == attached
        looks += 1
        time.sleep(0.5)  # the outage lasts a known time; look while it does
    assert looks >= 5

    wait_for(fabric.answers, 10, "the fabric to answer again")
    server = hub.server("student2")
    assert server is not None
    assert server["ready"], server
    still = fabric.ledger.machine(machine.id)
    assert still is not None
    assert still.state == "running"
    assert fabric.attached() == attached
    assert f"Released machine {machine.id}" not in hub.log_path.read_text()


# -- a slow fabric ---------------------------------------------------------------------------


def test_a_slow_fabric_still_composes(hub: Hub, fabric: HubFabric) -> None:
    fabric.faults(latency_s=0.3)
    started = time.monotonic()
    assert fabric.answers()
    assert time.monotonic() - started >= 0.3  # the fabric really is slow

    response, events = hub.spawn_watching("student1", TWO_T4)
    assert response.status_code in (201, 202), response.text
    assert any(e["message"].startswith("attaching GPU 2/2") for e in events), events
    hub.wait_ready("student1")
    machine = fabric.ledger.live_machine("student1", "")
    assert machine is not None
    assert machine.state == "running"
    attached = fabric.attached()
    assert {h: sorted(a) for h, a in attached.items()} == {
        machine.host_id: machine_devices(machine)
    }
    assert len(hub.composed_hosts()[str(machine.host_id)]) == 2

    hub.stop("student1")  # the release is slow too, and must still finish
    hub.wait_released(machine.id)
    assert fabric.attached() == {}
    assert fabric.ledger.holders() == {}
