"""The reconciler over a real SQLite ledger, the strict in-process fabric and a fake hub.

The hub's API is the boundary faked here: a strict stand-in that serves the
servers a test sets and records every stop. Composes go through the real
Composer, so ledger rows, fabric marks and attachments are the real thing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import CompositionTag, HostMark, Inventory
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import FabricUnreachable
from composespawner.ledger import Ledger
from composespawner.services.composer import Composer
from composespawner.services.hub_api import HubClient, HubUnavailable
from composespawner.services.reconcile import (
    Reconciler,
    ServersFromHub,
    ServerView,
    plan_reconcile,
)
from harness.paths import HUB_CONFIG
from tests.support.fake_hub_api import TOKEN, FakeHubAPI, FakeHubAPIServer, Reply
from tests.support.inprocess import InProcessFabric

HUB_ID = "hub-a"
ONE_T4 = MachineRequest(gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0)


class FakeHub:
    """The hub's servers as a test sets them; strict about what is asked of it."""

    def __init__(self) -> None:
        self.views: list[ServerView] = []
        self.reachable = True
        self.refuses_stops = False
        self.stopped: list[tuple[str, str]] = []

    async def servers(self) -> list[ServerView]:
        if not self.reachable:
            raise HubUnavailable("test: the hub is down")
        return list(self.views)

    async def stop_server(self, user: str, server: str) -> None:
        if not any((v.user, v.server) == (user, server) for v in self.views):
            raise AssertionError(f"stop of {user}/{server}, which the hub never reported")
        if self.refuses_stops:
            raise HubUnavailable("test: the stop timed out")
        self.stopped.append((user, server))


class UnreachableFabric(InProcessFabric):
    async def inventory(self) -> Inventory:
        raise FabricUnreachable("test: the fabric is down")


class World:
    def __init__(self, tmp: Path) -> None:
        self.ledger = Ledger(f"sqlite:///{tmp / 'ledger.sqlite'}")
        self.ledger.upgrade()
        self.fabric = InProcessFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml")
        self.composer = Composer(
            ledger=self.ledger,
            fabric=self.fabric,
            catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
            hub_id=HUB_ID,
        )
        self.hub = FakeHub()
        self.reconciler = Reconciler(self.composer, self.hub, grace=0.0)

    async def compose(self, user: str, server: str = "") -> ComposedMachine:
        return await self.composer.compose(
            user=user,
            groups=frozenset(),
            server=server,
            request=ONE_T4,
            progress=lambda message: None,
        )

    def serve(self, user: str, machine: ComposedMachine | None, pending: str | None = None) -> None:
        machine_id = machine.machine_id if machine else None
        self.hub.views.append(ServerView(user, "", pending, machine_id))

    def attached(self) -> dict[str, tuple[str, ...]]:
        hosts = self.fabric.state.inventory.hosts
        return {h.id: a for h in hosts if (a := self.fabric.state.attached(h.id))}


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    world = World(tmp_path)
    yield world
    await world.composer.close()


async def test_a_machine_no_server_uses_is_released(world: World) -> None:
    orphan = await world.compose("u1")  # its hub died before the server was recorded

    report = await world.reconciler.run_once()

    assert report.done == {"release-orphan": 1}
    assert world.attached() == {}
    assert world.ledger.holders() == {}
    machine = world.ledger.machine(orphan.machine_id)
    assert machine is not None
    assert machine.state == "failed"
    assert "reconciler" in " ".join(e.message for e in world.ledger.events(orphan.machine_id))
    assert world.reconciler.totals["release-orphan"] == 1
    assert world.ledger.reconcile_action_counts() == {("release-orphan", "done"): 1}


async def test_a_running_server_with_its_devices_is_left_alone(world: World) -> None:
    machine = await world.compose("u1")
    world.serve("u1", machine)
    before = world.attached()

    report = await world.reconciler.run_once()

    assert report.actions == []
    assert world.attached() == before
    assert set(world.ledger.holders().values()) == {machine.machine_id}


async def test_a_spawn_in_flight_is_never_taken_for_debris(world: World) -> None:
    machine = await world.compose("u1")
    world.serve("u1", None, pending="spawn")

    assert (await world.reconciler.run_once()).actions == []
    assert machine.host in world.attached()


async def test_the_grace_period_protects_fresh_machines(world: World) -> None:
    machine = await world.compose("u1")
    patient = Reconciler(world.composer, world.hub, grace=3600.0)

    assert (await patient.run_once()).actions == []
    assert machine.host in world.attached()


async def test_a_release_that_never_finished_is_finished(world: World) -> None:
    machine = await world.compose("u1")
    world.ledger.transition(machine.machine_id, "stopping", "the hub died mid-stop")
    world.hub.reachable = False  # finishing a release needs no word from the hub

    report = await world.reconciler.run_once()

    assert report.done == {"finish-release": 1}
    assert not report.hub_reachable
    assert world.attached() == {}
    ended = world.ledger.machine(machine.machine_id)
    assert ended is not None
    assert ended.state == "released"


async def test_with_the_hub_down_orphans_are_left_alone(world: World) -> None:
    machine = await world.compose("u1")
    world.hub.reachable = False

    report = await world.reconciler.run_once()

    assert report.actions == []
    assert machine.host in world.attached()


async def test_with_the_fabric_down_nothing_is_freed(world: World) -> None:
    machine = await world.compose("u1")
    world.ledger.transition(machine.machine_id, "stopping", "stop")
    blind = Composer(
        ledger=world.ledger,
        fabric=UnreachableFabric(world.fabric.state),
        catalog=world.composer.catalog,
        hub_id=HUB_ID,
    )

    report = await Reconciler(blind, world.hub, grace=0.0).run_once()

    assert not report.fabric_reachable
    assert report.actions == []
    assert set(world.ledger.holders().values()) == {machine.machine_id}
    assert machine.host in world.attached()


async def test_a_host_we_marked_for_an_ended_machine_is_cleared(world: World) -> None:
    machine = await world.compose("u1")
    # The ledger ended the machine but the hub died before the fabric heard of it.
    world.ledger.transition(machine.machine_id, "stopping", "stop")
    world.ledger.release(machine.machine_id, message="freed in the ledger only")

    report = await world.reconciler.run_once()

    assert report.done == {"detach-untracked": 1}
    assert world.attached() == {}
    assert world.fabric.mark(machine.host) is None


async def test_compositions_of_others_are_never_touched(world: World) -> None:
    other_tag = CompositionTag(hub="hub-b", machine="theirs", owner="x/y")
    await world.fabric.join_host("host-02", other_tag)
    world.fabric.state.add_resource_block("host-02", "r1-t4-3")
    world.fabric.state.add_resource_block("host-03", "r1-t4-4")  # unmarked: someone by hand

    for _ in range(2):
        assert (await world.reconciler.run_once()).actions == []

    assert world.attached() == {"host-02": ("r1-t4-3",), "host-03": ("r1-t4-4",)}
    assert world.fabric.mark("host-02") == HostMark.of(other_tag)


async def test_a_device_the_fabric_lost_is_attached_again(world: World) -> None:
    machine = await world.compose("u1")
    world.serve("u1", machine)
    [gpu] = machine.gpus
    world.fabric.state.remove_resource_block(machine.host, gpu.block_id)  # by hand

    report = await world.reconciler.run_once()

    assert report.done == {"reattach": 1}
    assert gpu.block_id in world.attached()[machine.host]


async def test_a_server_whose_machine_ended_is_stopped(world: World) -> None:
    machine = await world.compose("u1")
    world.serve("u1", machine)
    await world.composer.release(machine.machine_id, reason="released behind the hub's back")

    report = await world.reconciler.run_once()

    assert report.done == {"stop-server": 1}
    assert world.hub.stopped == [("u1", "")]


async def test_an_action_that_fails_is_recorded_and_tried_again(world: World) -> None:
    machine = await world.compose("u1")
    world.serve("u1", machine)
    await world.composer.release(machine.machine_id, reason="released behind the hub's back")
    world.hub.refuses_stops = True

    first = await world.reconciler.run_once()
    world.hub.refuses_stops = False
    second = await world.reconciler.run_once()

    assert (first.errors, second.done) == ({"stop-server": 1}, {"stop-server": 1})
    counts = world.ledger.reconcile_action_counts()
    assert counts == {("stop-server", "error"): 1, ("stop-server", "done"): 1}


def test_plan_leaves_machines_unknown_to_the_ledger_running() -> None:
    # A server naming a machine the ledger never heard of: unknown, not ended.
    actions = plan_reconcile(
        machines={},
        inventory=Inventory(),
        servers=[ServerView("u1", "", None, "not-in-this-ledger")],
        hub_id=HUB_ID,
        now=datetime.now(UTC),
        grace=timedelta(0),
    )
    assert actions == []


# ---------------------------------------------------------------------------
# Over the hub's REST API: the real client against a strict in-process hub API
# ---------------------------------------------------------------------------


@pytest.fixture
async def hub_api() -> AsyncIterator[FakeHubAPIServer]:
    served = FakeHubAPIServer(FakeHubAPI())
    served.start()
    yield served
    await served.stop()


@pytest.fixture
async def over_http(world: World, hub_api: FakeHubAPIServer) -> AsyncIterator[Reconciler]:
    client = HubClient(hub_api.url, TOKEN)
    yield Reconciler(world.composer, ServersFromHub(client), grace=0.0)
    await client.close()


async def test_servers_are_read_from_the_hubs_api_with_their_machines(
    hub_api: FakeHubAPIServer,
) -> None:
    hub_api.api.add_user("u1")
    hub_api.api.run("u1", "", machine_id="m-1")
    hub_api.api.run("u1", "thesis")  # a server whose spawner state names no machine
    hub_api.api.add_user("u2")  # no server: not asked for
    client = HubClient(hub_api.url, TOKEN)
    try:
        views = await ServersFromHub(client).servers()
    finally:
        await client.close()

    assert views == [ServerView("u1", "", None, "m-1"), ServerView("u1", "thesis", None, None)]
    assert [path for _, path, _ in hub_api.api.requests] == [
        "/users?state=active&offset=0&limit=200"
    ]


async def test_a_server_whose_machine_ended_is_stopped_through_the_api(
    world: World, hub_api: FakeHubAPIServer, over_http: Reconciler
) -> None:
    machine = await world.compose("u1")
    hub_api.api.add_user("u1")
    hub_api.api.run("u1", "", machine_id=machine.machine_id)
    await world.composer.release(machine.machine_id, reason="released behind the hub's back")

    report = await over_http.run_once()

    assert report.done == {"stop-server": 1}
    assert hub_api.api.users["u1"].servers == {}
    assert ("DELETE", "/users/u1/server") in [(m, p) for m, p, _ in hub_api.api.requests]


async def test_a_stop_of_a_server_the_hub_no_longer_has_is_done(
    world: World, hub_api: FakeHubAPIServer, over_http: Reconciler, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = await world.compose("u1")
    hub_api.api.add_user("u1")
    hub_api.api.run("u1", "thesis", machine_id=machine.machine_id)
    await world.composer.release(machine.machine_id, reason="released behind the hub's back")
    # Between the read and the stop, the user removes the server: the stop is a 404.
    handle = hub_api.api.handle

    def gone_before_the_stop(
        method: str, parts: list[str], query: dict[str, str], accept: str
    ) -> Reply:
        if method == "DELETE":
            hub_api.api.users["u1"].named.clear()
        return handle(method, parts, query, accept)

    monkeypatch.setattr(hub_api.api, "handle", gone_before_the_stop)

    report = await over_http.run_once()

    assert (report.done, report.errors) == ({"stop-server": 1}, {})


async def test_a_stop_the_hub_refuses_now_is_an_error_tried_again_next_pass(
    world: World, hub_api: FakeHubAPIServer, over_http: Reconciler, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = await world.compose("u1")
    hub_api.api.add_user("u1")
    hub_api.api.run("u1", "thesis", machine_id=machine.machine_id)
    await world.composer.release(machine.machine_id, reason="released behind the hub's back")
    handle = hub_api.api.handle

    def not_now(method: str, parts: list[str], query: dict[str, str], accept: str) -> Reply:
        if method == "DELETE":
            return Reply(400, '{"status": 400, "message": "Server is being renamed"}')
        return handle(method, parts, query, accept)

    monkeypatch.setattr(hub_api.api, "handle", not_now)

    report = await over_http.run_once()

    assert (report.done, report.errors) == ({}, {"stop-server": 1})
    assert "thesis" in hub_api.api.users["u1"].named


async def test_a_hub_answering_5xx_is_unknown_and_orphans_are_left_alone(
    world: World, hub_api: FakeHubAPIServer, over_http: Reconciler
) -> None:
    await world.compose("u1")
    hub_api.api.answer_all = Reply(502, "<html>Bad Gateway</html>", "text/html")

    report = await over_http.run_once()

    assert not report.hub_reachable
    assert report.actions == []
    assert world.ledger.holders() != {}
