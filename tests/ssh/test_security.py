"""The hub's key on a compute host, tried as an attacker would: real OpenSSH sshds
(harness/sshhosts.py) with the agent as the key's forced command.

Anything but the agent's one request is refused, and logged; a host whose key is
not the pinned one is never connected to, and the launcher says why.
Run under ``flock /tmp/heavy.lock``: it starts sshd processes.
"""

from __future__ import annotations

import json
import logging
import pwd
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest
from jupyterhub.user import User

from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.ssh import SSHLauncher
from harness.sshhosts import SSHHosts, ssh_hosts
from tests.ssh.spawners import ssh_launcher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

NOBODY_USERS = ("ssh-sec-user",)  # an account a refused start must never create


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    with ssh_hosts(
        tmp_path_factory.mktemp("ssh"), ["host-1", "host-2", "host-3"], users=NOBODY_USERS
    ) as hosts:
        yield hosts


@pytest.fixture
async def conn(hosts: SSHHosts) -> AsyncIterator[asyncssh.SSHClientConnection]:
    """The hub's own connection to host-1, as an attacker holding the hub's key has it."""
    host = hosts.hosts["host-1"]
    async with asyncssh.connect(
        host.address,
        host.port,
        username="root",
        client_keys=[str(hosts.client_key)],
        known_hosts=str(hosts.known_hosts),
        config=None,
        agent_path=None,
    ) as conn:
        yield conn


@pytest.fixture
async def links() -> AsyncIterator[None]:
    yield
    await SSHLauncher.links.close()
    SSHLauncher._running.clear()


async def test_the_hubs_key_runs_no_other_command(
    conn: asyncssh.SSHClientConnection, tmp_path: Path
) -> None:
    witness = tmp_path / "ran"
    for command in ("id", f"touch {witness}", "composespawner-host; id", "/bin/sh"):
        result = await conn.run(command, input="", timeout=10)
        assert result.exit_status != 0, command
        assert json.loads(str(result.stdout)) == {
            "ok": False,
            "refused": "this key runs composespawner-host only; the command asked for was refused",
        }
        assert "uid=" not in str(result.stdout)
        assert f"refused command={command!r}" in str(result.stderr)  # the agent's log
    assert not witness.exists()


async def test_no_shell_no_pty_and_no_port_forwarding(
    conn: asyncssh.SSHClientConnection, hosts: SSHHosts
) -> None:
    host = hosts.hosts["host-2"]
    with pytest.raises(asyncssh.ChannelOpenError) as forward:
        await conn.open_connection(host.address, host.port)  # what -L does per connection
    assert forward.value.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
    log = hosts.hosts["host-1"].sshd_log.read_text()
    assert f"refused local port forward: originator  port 0, target {host.address}" in log
    with pytest.raises(asyncssh.ChannelListenError):
        await conn.forward_remote_port("127.0.0.1", 0, host.address, host.port)  # -R
    with pytest.raises(asyncssh.ChannelOpenError, match="PTY request failed"):
        await conn.run(term_type="xterm", input="id\n", timeout=10)  # an interactive login
    result = await conn.run(input="id\n", timeout=10)  # a shell: the agent reads one request
    assert "uid=" not in str(result.stdout)
    assert json.loads(str(result.stdout)) == {
        "ok": False,
        "refused": "the request is not one JSON object",
    }


@pytest.mark.parametrize(
    ("request_body", "why"),
    [
        ({"user": "../root"}, "cannot be an account's name"),
        ({"user": "ada;id"}, "cannot be an account's name"),
        ({"user": "root"}, "uid"),  # a system account: never
        ({"user": "ssh-sec-user", "env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD"),
        ({"user": "ssh-sec-user", "args": ["/bin/sh"]}, "not an option"),
        ({"user": "ssh-sec-user", "home": "/root"}, "does not know: home"),
    ],
)
async def test_a_start_the_agent_must_not_do_is_refused(
    conn: asyncssh.SSHClientConnection, request_body: dict[str, object], why: str
) -> None:
    body = {"v": 1, "op": "start", "server": "", "machine": "m-sec", "gpus": []}
    body |= {"cores": None, "memory_gib": None, **request_body}
    result = await conn.run("composespawner-host", input=json.dumps(body), timeout=30)
    answer = json.loads(str(result.stdout).splitlines()[-1])
    assert answer["ok"] is False
    assert why in answer["refused"]
    with pytest.raises(KeyError):
        pwd.getpwnam("ssh-sec-user")  # nothing was done: no account made


async def test_a_changed_host_key_is_refused_and_said_so(
    hosts: SSHHosts, users: list[User], links: None, caplog: pytest.LogCaptureFixture
) -> None:
    hosts.new_host_key("host-3")
    spawner = ssh_launcher(
        users[0],
        {h: host.where for h, host in hosts.hosts.items()},
        hosts.client_key,
        hosts.known_hosts,
        host="host-3",
    )
    with caplog.at_level(logging.ERROR), pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 503
    assert "could not verify the host's identity" in refused.value.jupyterhub_message
    assert "showed another host key than the one in known_hosts" in caplog.text
    assert not hosts.records("host-3")


async def test_a_host_missing_from_known_hosts_is_never_connected_to(
    hosts: SSHHosts, users: list[User], links: None, caplog: pytest.LogCaptureFixture
) -> None:
    host = hosts.hosts["host-2"]
    lines = hosts.known_hosts.read_text().splitlines(keepends=True)
    partial = hosts.known_hosts.with_name("known_hosts_without_host_2")
    partial.write_text("".join(line for line in lines if f"[{host.address}]" not in line))
    spawner = ssh_launcher(
        users[1], {"host-2": host.where}, hosts.client_key, partial, host="host-2"
    )
    with caplog.at_level(logging.ERROR), pytest.raises(SpawnRefused, match="identity"):
        await spawner.start()
    assert "is not in known_hosts" in caplog.text
