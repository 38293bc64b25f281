"""What the SSH launcher leaves behind on a host it could not reach: nothing. Notebooks
whose machines the ledger has as ended are stopped when the host's watch is made again;
and a channel the host's sshd refuses fails that request only (against the fake agent)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest
from jupyterhub.user import User

from composespawner.launchers.agent_protocol import ListNotebooks, StartNotebook
from composespawner.launchers.ssh import SSHLauncher
from composespawner.launchers.ssh_requests import orphans
from tests.ssh.spawners import RecordingLauncher, ssh_launcher
from tests.support.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(30)


def launcher(user: User, agent: FakeAgent, **config: Any) -> RecordingLauncher:
    return ssh_launcher(user, {"host-1": agent.where}, agent.key, agent.known_hosts, **config)


async def listing_done(spawner: RecordingLauncher, agent: FakeAgent) -> None:
    """Until the host's list, and the stops it brought, are done."""
    listing = spawner._link(agent.where)._listing
    assert listing is not None
    await asyncio.wait_for(listing, 5)


def test_only_machines_the_ledger_has_as_ended_are_orphans() -> None:
    states = {
        "m-released": "released",
        "m-failed": "failed",
        "m-stopping": "stopping",
        "m-launching": "launching",  # a start under way
        "m-running": "running",
        "m-held": "released",
    }
    listed = [*states, "m-another-hubs"]  # unknown is not dead
    assert orphans(listed, states, held={"m-held"}) == ["m-released", "m-failed", "m-stopping"]


async def test_a_hosts_orphans_are_stopped_when_its_watch_is_made(
    users: list[User], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    spawners = [launcher(user, agent) for user in users]  # m-ada, m-bob, m-cy
    for spawner in spawners:
        await spawner.start()
    other = dataclasses.replace(agent.running["m-ada"], machine="m-another-hubs")
    agent.running["m-another-hubs"] = other
    state = spawners[2].get_state()
    await SSHLauncher.links.close()  # the hub restarts: its stops of ada and bob were lost
    SSHLauncher._running.clear()

    again = launcher(users[2], agent)
    again.ledger = {"m-ada": "released", "m-bob": "stopping", "m-cy": "running"}
    again.load_state(state)
    with caplog.at_level(logging.WARNING):
        assert await again.poll() is None  # its first request to the host: watched, listed
        await agent.until(lambda: set(agent.running) == {"m-cy", "m-another-hubs"})
        await listing_done(again, agent)
    assert "stopped notebook m-ada on" in caplog.text
    assert "the ledger has its machine released" in caplog.text
    assert "stopped notebook m-bob on" in caplog.text


async def test_a_stop_that_could_not_reach_the_host_is_done_once_it_is_back(
    users: list[User], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    spawner = launcher(users[0], agent)
    spawner.ledger = {"m-ada": "running"}
    await spawner.start()
    await agent.until(lambda: agent.watching > 0)
    await agent.go_away()

    with caplog.at_level(logging.WARNING):
        await spawner.stop()  # the host cannot be reached: the notebook is left running
    assert "could not stop notebook m-ada" in caplog.text
    assert set(agent.running) == {"m-ada"}
    spawner.ledger["m-ada"] = "released"  # the composing side released the machine
    lists = sum(isinstance(r, ListNotebooks) for r in agent.requests)

    await agent.come_back()  # the watch, retrying, reaches it again within its backoff
    await agent.until(lambda: agent.running == {}, within=10)
    await listing_done(spawner, agent)
    assert sum(isinstance(r, ListNotebooks) for r in agent.requests) == lists + 1
    assert SSHLauncher._owed == set()


async def test_a_refused_channel_is_asked_for_again_and_nothing_else_is_touched(
    users: list[User], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    agent.hold = asyncio.Event()
    ada, bob, cy = (launcher(user, agent) for user in users)
    starting = asyncio.ensure_future(ada.start())
    await agent.until(lambda: any(isinstance(r, StartNotebook) for r in agent.requests))
    await agent.until(lambda: agent.watching > 0)

    # As sshd refuses channels past MaxSessions while sessions still wind down
    # ("administratively prohibited"): the request asks again, after a backoff.
    agent.prohibit = 2
    bob.load_state({"ssh_host": agent.where, "ssh_machine": "m-bob"})
    with caplog.at_level(logging.INFO):
        assert await bob.poll() == 0  # answered: the host runs no m-bob
    assert caplog.text.count("refused a channel") == 2

    agent.hold.set()
    assert await starting == ("127.0.0.1", 40001)  # the start under way went on
    agent.prohibit = 1
    assert await cy.start() == ("127.0.0.1", 40002)
    assert agent.connections == 1
    assert agent.watching == 1
    agent.exit("m-ada")  # and the watch still tells exits
    await asyncio.wait_for(ada.exited.wait(), 5)
