"""The hub's REST API client against a strict in-process hub API, at the HTTP boundary.

The fake answers as JupyterHub 6.1 does (pagination only when asked for, limits
clamped, 404s for what it does not have); the client must read every page, quote
names as single path segments, take an already-gone server as stopped, and call
anything else it cannot read HubUnavailable.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from composespawner.services.hub_api import PAGINATED, HubClient, HubUnavailable, Stop
from harness.ports import free_ports
from tests.support.fake_hub_api import TOKEN, FakeHubAPI, FakeHubAPIServer, Reply

CRASH_PAGE = Reply(500, "<html><title>500: Internal Server Error</title></html>", "text/html")


@pytest.fixture
async def served() -> AsyncIterator[FakeHubAPIServer]:
    server = FakeHubAPIServer(FakeHubAPI())
    server.start()
    yield server
    await server.stop()


@pytest.fixture
async def hub(served: FakeHubAPIServer) -> AsyncIterator[HubClient]:
    client = HubClient(served.url, TOKEN, timeout=5.0)
    yield client
    await client.close()


async def test_every_page_of_active_users_is_read(served: FakeHubAPIServer, hub: HubClient) -> None:
    for i in range(600):
        served.api.add_user(f"u{i:03}")
        if i % 2 == 0:
            served.api.run(f"u{i:03}", machine_id=f"m{i}")

    users = await hub.users(state="active")

    assert [u["name"] for u in users] == [f"u{i:03}" for i in range(0, 600, 2)]
    assert users[0]["servers"][""]["state"] == {"compose": {"machine_id": "m0"}}
    asked = [(path, accept) for _, path, accept in served.api.requests]
    assert asked == [
        ("/users?state=active&offset=0&limit=200", PAGINATED),
        ("/users?state=active&offset=200&limit=200", PAGINATED),
    ]


async def test_the_next_link_is_followed_when_the_hub_pages_smaller(
    served: FakeHubAPIServer, hub: HubClient
) -> None:
    served.api.max_limit = 50  # a hub configured with a smaller api_page_max_limit
    for i in range(120):
        served.api.add_user(f"u{i:03}", f"cohort{i:03}")

    assert len(await hub.users()) == 120
    assert (await hub.group_members())["cohort119"] == ["u119"]
    offsets = [path.split("offset=")[1] for _, path, _ in served.api.requests]
    assert offsets == ["0&limit=200", "50&limit=50", "100&limit=50"] * 2


async def test_a_hub_that_ignores_the_pagination_header_is_not_read_as_complete(
    served: FakeHubAPIServer, hub: HubClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bare list stops at the page limit: the users past it would read as serverless.
    monkeypatch.setattr(served.api, "page", lambda query, accept, items: Reply(200, items[:200]))
    served.api.add_user("u1")

    with pytest.raises(HubUnavailable, match="not a page"):
        await hub.users(state="active")


async def test_names_are_single_path_segments(served: FakeHubAPIServer, hub: HubClient) -> None:
    served.api.add_user("ada/lovelace+1@uni", "a/b")
    served.api.run("ada/lovelace+1@uni", "x/y z", machine_id="m1")

    assert await hub.user_groups("ada/lovelace+1@uni") == ["a/b"]
    assert await hub.group_exists("a/b")
    assert await hub.stop_server("ada/lovelace+1@uni", "x/y z") is Stop.STOPPING
    assert served.api.users["ada/lovelace+1@uni"].servers == {}


async def test_the_default_server_has_its_own_path(
    served: FakeHubAPIServer, hub: HubClient
) -> None:
    served.api.add_user("ada")

    assert await hub.start_server("ada", "", {"gpu_count": 1}) == (201, "")
    assert await hub.stop_server("ada", "") is Stop.STOPPING
    assert [(m, p) for m, p, _ in served.api.requests] == [
        ("POST", "/users/ada/server"),
        ("DELETE", "/users/ada/server"),
    ]


async def test_a_server_already_gone_is_stopped(served: FakeHubAPIServer, hub: HubClient) -> None:
    served.api.add_user("ada")

    assert await hub.stop_server("ada", "") is Stop.STOPPING  # not running: 204
    assert await hub.stop_server("ada", "thesis") is Stop.GONE  # no such named server: 404
    assert await hub.stop_server("nobody", "") is Stop.GONE  # no such user: 404


async def test_a_hub_with_named_servers_off_stops_none(
    served: FakeHubAPIServer, hub: HubClient
) -> None:
    served.api.named_servers = False
    served.api.add_user("ada")

    assert await hub.stop_server("ada", "thesis") is Stop.REFUSED  # 400: there can be none


async def test_a_missing_user_or_group_reads_as_none(hub: HubClient) -> None:
    assert await hub.user_groups("nobody") is None
    assert not await hub.group_exists("nobody")


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_hub_in_trouble_is_unavailable_for_every_call(
    served: FakeHubAPIServer, hub: HubClient, status: int
) -> None:
    served.api.answer_all = Reply(status, CRASH_PAGE.body, "text/html")

    for call in (
        hub.users(state="active"),
        hub.user_groups("ada"),
        hub.group_exists("physics"),
        hub.group_members(),
        hub.stop_server("ada", ""),
    ):
        with pytest.raises(HubUnavailable, match=str(status)):
            await call


async def test_a_token_the_hub_refuses_is_unavailable(served: FakeHubAPIServer) -> None:
    client = HubClient(served.url, "not-the-token")
    try:
        with pytest.raises(HubUnavailable, match="403"):
            await client.users()
        with pytest.raises(HubUnavailable, match="403"):
            await client.stop_server("ada", "")
    finally:
        await client.close()


async def test_an_answer_that_is_not_json_is_unavailable(
    served: FakeHubAPIServer, hub: HubClient
) -> None:
    served.api.answer_all = Reply(200, "<html>a login page</html>", "text/html")

    with pytest.raises(HubUnavailable):
        await hub.user_groups("ada")


async def test_each_call_gives_up_after_its_own_timeout(served: FakeHubAPIServer) -> None:
    served.api.hang = True
    client = HubClient(served.url, TOKEN, timeout=0.2)
    try:
        for call in (
            client.users(),
            client.stop_server("ada", ""),
            client.start_server("ada", "", {}),
        ):
            started = time.monotonic()
            with pytest.raises(HubUnavailable):
                await call
            assert time.monotonic() - started < 2.0
    finally:
        await client.close()


async def test_a_hub_that_is_not_listening_is_unavailable() -> None:
    port = free_ports("hub")["hub"]
    client = HubClient(f"http://127.0.0.1:{port}/hub/api", TOKEN)
    try:
        with pytest.raises(HubUnavailable):
            await client.users(state="active")
        with pytest.raises(HubUnavailable):
            await client.start_server("ada", "", {})
    finally:
        await client.close()


async def test_a_spawners_refusal_is_the_hubs_answer_not_unavailability(
    served: FakeHubAPIServer, hub: HubClient
) -> None:
    served.api.add_user("ada")
    served.api.refusals[("ada", "")] = Reply(
        503, {"status": 503, "message": "The fabric did not answer; try again in a minute."}
    )

    assert await hub.start_server("ada", "", {}) == (
        503,
        "The fabric did not answer; try again in a minute.",
    )
    served.api.run("ada", "")
    status, message = await hub.start_server("ada", "", {})
    assert (status, message) == (400, "ada: is already running")


async def test_rosters_are_read_again_only_when_old(served: FakeHubAPIServer) -> None:
    served.api.add_user("ada", "physics")
    client = HubClient(served.url, TOKEN, members_max_age=3600)
    try:
        assert await client.group_members() == {"physics": ["ada"]}
        served.api.add_user("bob", "physics")
        assert await client.group_members() == {"physics": ["ada"]}  # kept
        client.members_max_age = 0
        assert await client.group_members() == {"physics": ["ada", "bob"]}
    finally:
        await client.close()
