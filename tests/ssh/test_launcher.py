"""The SSH launcher against a strict fake agent over real SSH (in process): what it sends,
what it makes of the answers, one connection per host, and exits seen as they happen."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from jupyterhub.user import User
from traitlets import TraitError

from composespawner.domain.catalog import Kit, Stack, StackBuild
from composespawner.launchers.agent_protocol import (
    ListNotebooks,
    PollNotebook,
    StartNotebook,
    StopNotebook,
)
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.ssh import SSHLauncher
from composespawner.launchers.ssh_links import HostLink
from tests.ssh.spawners import GPU, RecordingLauncher, ssh_launcher
from tests.support.fake_agent import FakeAgent

pytestmark = pytest.mark.timeout(30)


def launcher(user: User, agent: FakeAgent, name: str = "", **config: Any) -> RecordingLauncher:
    hosts = config.pop("hosts", {"host-1": agent.where})
    return ssh_launcher(user, hosts, agent.key, agent.known_hosts, name=name, **config)


async def test_a_start_sends_the_machine_and_returns_where_the_notebook_listens(
    users: list[User], agent: FakeAgent
) -> None:
    spawner = launcher(users[0], agent, environment={"LD_PRELOAD": "/tmp/x.so", "FOO": "bar"})
    await spawner.deliver_run_manifest({"user": "ada"})

    assert await spawner.start() == ("127.0.0.1", 40001)

    start = next(r for r in agent.requests if isinstance(r, StartNotebook))
    assert (start.user, start.server, start.machine) == ("ada", "", "m-ada")
    assert start.gpus == (f"GPU-{GPU.uuid}",)
    assert (start.cores, start.memory_gib) == (4, 32)
    env = dict(start.env)
    assert env["FOO"] == "bar"
    assert env["JUPYTERHUB_USER"] == "ada"
    assert "JUPYTERHUB_API_TOKEN" in env
    assert not {"LD_PRELOAD", "PATH", "HOME", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES"} & set(env)
    assert start.manifest == {"user": "ada"}
    assert spawner.progress_seen == ["building the stack's environment"]
    assert agent.commands[0] == "composespawner-host"
    assert spawner.get_state()["ssh_machine"] == "m-ada"


async def test_one_connection_per_host_for_every_start_poll_and_stop(
    users: list[User], agent: FakeAgent
) -> None:
    counters = HostLink.counters
    connections, channels = counters.connections, counters.channels
    spawners = [launcher(users[0], agent), launcher(users[1], agent), launcher(users[2], agent)]
    await asyncio.gather(*(s.start() for s in spawners))
    await agent.until(lambda: agent.watching == 1)
    # The host's watch is open and reports every exit: a poll needs no channel...
    assert [await s.poll() for s in spawners] == [None, None, None]
    # ...until poll_host_every has passed since the host last said so: then it asks.
    spawners[0].poll_host_every = 0
    assert await spawners[0].poll() is None
    for spawner in spawners:
        await spawner.stop()
    assert agent.running == {}
    await agent.until(lambda: any(isinstance(r, ListNotebooks) for r in agent.requests))
    assert agent.connections == 1
    assert agent.ciphers == ["aes128-gcm@openssh.com"]  # asyncssh's cheapest a packet
    assert counters.connections - connections == 1
    # A channel per start and stop, the one poll that asked, the host's watch and its list.
    assert counters.channels - channels == 3 * 2 + 1 + 2
    assert sum(isinstance(r, PollNotebook) for r in agent.requests) == 1
    assert agent.watching == 1


async def test_an_exit_the_host_reports_reaches_its_launcher_at_once(
    users: list[User], agent: FakeAgent
) -> None:
    ada, bob = launcher(users[0], agent), launcher(users[1], agent)
    await ada.start()
    await bob.start()
    await agent.until(lambda: agent.watching > 0)

    agent.exit("m-bob")

    await asyncio.wait_for(bob.exited.wait(), 5)
    assert bob.exits == [None]
    assert ada.exits == []
    assert await bob.poll() == 0  # and the hub's next poll finds it gone
    assert await ada.poll() is None


async def test_a_lost_connection_is_made_again_with_its_watch(
    users: list[User], agent: FakeAgent
) -> None:
    spawner = launcher(users[0], agent)
    await spawner.start()
    await agent.until(lambda: agent.watching > 0)
    agent.drop()

    spawner.poll_host_every = 0  # this poll asks the host: over a connection made again
    assert await spawner.poll() is None
    assert agent.connections == 2
    await agent.until(lambda: agent.watching > 0)
    agent.exit("m-ada")
    await asyncio.wait_for(spawner.exited.wait(), 5)


async def test_an_unreachable_host_is_running_to_poll_and_stopped_anyway(
    users: list[User], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    spawner = launcher(users[0], agent)
    await spawner.start()
    state = spawner.get_state()
    other = launcher(users[0], agent, hosts={"host-1": "127.0.0.1:1"})  # nothing listens
    other.load_state({**state, "ssh_host": "127.0.0.1:1"})

    with caplog.at_level(logging.WARNING):
        assert await other.poll() is None  # unknown is not dead
        await other.stop()
    assert "taken as running" in caplog.text
    assert "is released anyway" in caplog.text


async def test_the_agents_refusal_is_logged_and_the_user_told_what_to_do(
    users: list[User], agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    agent.refuse_next = "GPU-0f3c is held by machine m-9"
    spawner = launcher(users[0], agent)
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 503
    assert "compute host host-1: the host refused it" in refused.value.jupyterhub_message
    assert "m-9" not in refused.value.jupyterhub_message  # another's machine: the log's
    assert "GPU-0f3c is held by machine m-9" in caplog.text
    await spawner.stop()  # as the hub does after a failed start: nothing runs, nothing sent
    assert not any(isinstance(r, StopNotebook) for r in agent.requests)

    agent.fail_next = "useradd failed"
    with pytest.raises(SpawnRefused, match="failed to start there"):
        await spawner.start()


async def test_a_host_missing_from_the_table_is_refused_before_any_connection(
    users: list[User], agent: FakeAgent
) -> None:
    spawner = launcher(users[0], agent, hosts={"host-2": agent.where})
    with pytest.raises(SpawnRefused, match="does not know how to reach the host"):
        await spawner.start()
    assert agent.connections == 0


async def test_a_start_given_up_on_is_stopped_when_it_ends(
    users: list[User], agent: FakeAgent
) -> None:
    agent.hold = asyncio.Event()
    spawner = launcher(users[0], agent)
    start = asyncio.ensure_future(spawner.start())
    await agent.until(lambda: any(isinstance(r, StartNotebook) for r in agent.requests))
    start.cancel()  # the hub's start_timeout
    with pytest.raises(asyncio.CancelledError):
        await start
    await spawner.stop()  # the hub stops it: nothing runs yet
    agent.hold.set()

    await agent.until(lambda: sum(isinstance(r, StopNotebook) for r in agent.requests) == 2)
    assert spawner._late_stop is not None
    await spawner._late_stop
    assert agent.running == {}


async def test_a_restarted_hub_finds_the_notebook_by_its_state_and_watches_it(
    users: list[User], agent: FakeAgent
) -> None:
    first = launcher(users[0], agent)
    await first.start()
    state = first.get_state()
    SSHLauncher._running.clear()  # the hub process is gone

    again = launcher(users[0], agent)
    again.load_state(state)
    assert await again.poll() is None
    assert isinstance(agent.requests[-1], PollNotebook)
    await agent.until(lambda: agent.watching > 0)
    agent.exit("m-ada")
    await asyncio.wait_for(again.exited.wait(), 5)
    again.clear_state()
    assert "ssh_machine" not in again.get_state()


async def test_requests_beyond_the_hosts_max_sessions_wait_their_turn(
    users: list[User], agent: FakeAgent
) -> None:
    agent.hold = asyncio.Event()
    spawners = [launcher(user, agent, max_sessions=3) for user in users]
    starts = [asyncio.ensure_future(s.start()) for s in spawners]
    await agent.until(lambda: agent.open_now == 2)  # the watch holds the third
    agent.hold.set()
    await asyncio.gather(*starts)
    assert agent.most_open == 2


async def test_a_host_that_does_not_answer_costs_one_connect_timeout(
    users: list[User], agent: FakeAgent
) -> None:
    with socket.socket() as silent:  # accepts, then says nothing: no SSH banner
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        where = f"127.0.0.1:{silent.getsockname()[1]}"
        spawners = [launcher(user, agent, connect_timeout=1) for user in users]
        for spawner in spawners:
            spawner.load_state({"ssh_host": where, "ssh_machine": f"m-{spawner.user.name}"})
        began = time.monotonic()
        assert await asyncio.gather(*(s.poll() for s in spawners)) == [None, None, None]
        assert time.monotonic() - began < 2.5  # one attempt shared, not three in line


async def test_a_host_gone_away_with_none_of_the_hubs_notebooks_is_not_watched(
    users: list[User], tmp_path: Path
) -> None:
    (tmp_path / "gone").mkdir()
    async with FakeAgent(tmp_path / "gone") as gone:
        spawner = launcher(users[0], gone)
        await spawner.start()
        await gone.until(lambda: gone.watching > 0)
        await spawner.stop()
        link = spawner._link(gone.where)
    watch = link._watch
    assert watch is not None
    await asyncio.wait_for(watch, 5)  # ended, not retrying every 30 s for ever
    await SSHLauncher.links.close()


async def test_a_stack_goes_with_its_lock_and_a_kit_is_refused(
    users: list[User], agent: FakeAgent, tmp_path: Path
) -> None:
    lock = tmp_path / "cpu.lock"
    lock.write_text("jupyterlab==4.4.0\n")
    sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    spawner = launcher(users[0], agent)
    spawner.stack = Stack("lab", "Lab", cpu=StackBuild(lock, sha), env=(("SEED", "0"),))
    spawner.check_stack(spawner.stack)
    await spawner.prepare_launch()
    await spawner.start()
    start = next(r for r in agent.requests if isinstance(r, StartNotebook))
    assert start.stack is not None
    assert (start.stack.id, start.stack.lock_sha256) == ("lab", sha)
    assert dict(start.env)["COMPOSE_STACK_LOCK_SHA256"] == sha
    assert spawner.extra_start_time(spawner.stack) == spawner.stack_build_timeout

    with pytest.raises(SpawnRefused, match="CPU lock") as refused:
        spawner.check_stack(Stack("gpu-only", "GPU only", gpu=StackBuild(lock, sha)))
    assert refused.value.status_code == 409
    kit = Kit("mnist", "MNIST", "lab", tmp_path, "mnist.ipynb", "mnist")
    with pytest.raises(SpawnRefused, match="starter kit cannot be delivered") as refused:
        spawner.check_kit(kit)
    assert refused.value.status_code == 409


def test_a_host_table_with_a_bad_address_is_refused_at_configuration(
    users: list[User], tmp_path: Path
) -> None:
    with pytest.raises(TraitError, match="'node7:ssh'"):
        ssh_launcher(users[0], {"host-1": "node7:ssh"}, tmp_path / "k", tmp_path / "kh")


def test_a_start_without_a_stack_is_refused_where_hosts_run_images(
    users: list[User], agent: FakeAgent
) -> None:
    launcher(users[0], agent, host_runtime="process").check_without_stack()  # the venv's lab
    spawner = launcher(users[0], agent, host_runtime="containers")
    with pytest.raises(SpawnRefused, match="choose one of the stacks") as refused:
        spawner.check_without_stack()
    assert refused.value.status_code == 400
    assert agent.requests == []  # nothing asked of the host
