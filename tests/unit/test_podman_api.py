"""Podman's API client (composespawner.launchers.podman_api) against a strict stand-in of
podman's service on a Unix socket: what a 404, a 500, a pull's error in its stream, a
service that does not answer and one too slow become. Real podman is the container
tests' (tests/launchers/test_container_probe.py, tests/e2e/test_containers.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.launchers.local_container import PodmanLauncher
from composespawner.launchers.podman_api import NoSuchContainer, PodmanAPI, PodmanError

pytestmark = pytest.mark.timeout(10)

PREFIX = "/v4.0.0/libpod"


def frame(stream: int, text: str) -> bytes:
    data = text.encode()
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


class StandIn:
    """Answers the calls the launcher makes, as podman 4 does; anything else is a 404
    the test sees in ``unexpected``."""

    def __init__(self) -> None:
        self.created: list[dict[str, object]] = []
        self.unexpected: list[str] = []
        self.slow = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"{PREFIX}/_ping", self.ping)
        app.router.add_post(f"{PREFIX}/containers/create", self.create)
        app.router.add_get(f"{PREFIX}/containers/{{name}}/json", self.inspect)
        app.router.add_post(f"{PREFIX}/containers/{{name}}/wait", self.wait)
        app.router.add_get(f"{PREFIX}/containers/{{name}}/logs", self.logs)
        app.router.add_post(f"{PREFIX}/images/pull", self.pull)
        app.router.add_route("*", "/{tail:.*}", self.other)
        return app

    async def ping(self, _request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["image"].endswith("missing"):
            message = {"cause": "image not known", "message": f"{body['image']}: image not known"}
            return web.json_response(message, status=500)
        self.created.append(body)
        return web.json_response({"Id": "abc", "Warnings": []}, status=201)

    async def inspect(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != "nb1":
            return web.json_response({"message": "no such container"}, status=404)
        return web.json_response({"State": {"Status": "running", "Pid": 4242}})

    async def wait(self, request: web.Request) -> web.Response:
        assert request.query.getall("condition") == ["stopped", "exited"]
        if request.match_info["name"] == "slow":
            await self.slow.wait()
        return web.Response(text="137")

    async def logs(self, request: web.Request) -> web.Response:
        assert request.query["tail"] == "2"
        return web.Response(body=frame(1, "starting\n") + frame(2, "Killed\n"))

    async def pull(self, request: web.Request) -> web.Response:
        said = {"error": "manifest unknown"} if "gone" in request.query["reference"] else {}
        return web.Response(text=json.dumps({"stream": "pulling"}) + "\n" + json.dumps(said))

    async def other(self, request: web.Request) -> web.Response:
        self.unexpected.append(f"{request.method} {request.path}")
        return web.Response(status=404)


@pytest.fixture
async def podman(tmp_path: Path) -> AsyncIterator[tuple[PodmanAPI, StandIn]]:
    stand_in = StandIn()
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    socket = str(tmp_path / "podman.sock")
    await web.UnixSite(runner, socket).start()
    yield PodmanAPI(socket), stand_in
    stand_in.slow.set()
    await PodmanAPI.close_all()
    await runner.cleanup()
    assert stand_in.unexpected == []


async def test_a_container_is_created_inspected_and_its_status_read(
    podman: tuple[PodmanAPI, StandIn],
) -> None:
    api, stand_in = podman
    assert await api.answers()
    await api.create({"name": "nb1", "image": "r/pytorch@sha256:ab"})
    assert stand_in.created == [{"name": "nb1", "image": "r/pytorch@sha256:ab"}]
    found = await api.inspect("nb1")
    assert found is not None
    assert found["State"]["Pid"] == 4242
    assert await api.inspect("gone") is None  # podman's 404: no such container
    assert await api.wait("nb1", 5) == 137
    assert await api.logs_tail("nb1", 2) == "starting\nKilled\n"


async def test_podmans_own_words_come_with_its_errors(podman: tuple[PodmanAPI, StandIn]) -> None:
    api, _ = podman
    with pytest.raises(PodmanError, match="image not known") as refused:
        await api.create({"name": "nb2", "image": "r/missing"})
    assert not isinstance(refused.value, NoSuchContainer)
    with pytest.raises(PodmanError, match="manifest unknown"):
        await api.pull("r/gone@sha256:ab", 5)
    await api.pull("r/there@sha256:ab", 5)  # a stream without an error is a pull done


async def test_a_call_past_its_time_and_a_service_not_there_are_errors(
    podman: tuple[PodmanAPI, StandIn], tmp_path: Path
) -> None:
    api, _ = podman
    with pytest.raises(PodmanError, match="took more than"):
        await api.wait("slow", 0.2)
    nobody = PodmanAPI(str(tmp_path / "nobody.sock"))
    assert not await nobody.answers()
    with pytest.raises(PodmanError, match="did not answer"):
        await nobody.inspect("nb1")


async def test_a_stop_podman_does_not_answer_never_signals_pid_0(tmp_path: Path) -> None:
    """Podman's service is gone and the container named no process: the stop gives up on
    signals (LocalProcessSpawner's would send them to pid 0, the hub's own group) and
    says how to remove the container by hand."""
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add(orm.User(name="ada"))
    db.commit()
    user = User(db.query(orm.User).one(), {})
    spawner: PodmanLauncher = user._new_spawner(
        "",
        spawner_class=PodmanLauncher,
        hub=Hub(),
        podman_service=str(tmp_path / "gone.sock"),
        interrupt_timeout=1,
        term_timeout=1,
        kill_timeout=1,
    )
    spawner.load_state({"container": "composespawner-ada-0123456789ab"})
    assert spawner.pid == 0
    assert await spawner.poll() is None  # podman cannot say: running, not gone
    await spawner.stop()  # no KeyboardInterrupt here: nothing was sent to pid 0
    db.close()
