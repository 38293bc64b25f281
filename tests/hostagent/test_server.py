"""The agent's server (``composespawner-host-server``): the real forced command hands its
channel to it, the request runs in the server's child on that channel as it would in the
forced command's own process, and without a server the forced command runs it alone.

Starts processes, accounts and cgroups (root).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator

import pytest

from composespawner.hostagent.handoff import (
    DEFAULT_SOCKET,
    MAX_PASSED,
    HandoffError,
    decode,
    encode,
    parse_arguments,
)
from composespawner.hostagent.server import receive
from harness.hub import alive
from harness.sshhosts import SERVER, start_agent_server, stop_agent_server
from tests.hostagent.hosts import AGENT, Host, start_request, started, status_of

pytestmark = pytest.mark.timeout(120)
SYSTEM_PYTHON = "/usr/bin/python3"
POLL = {"v": 1, "op": "poll", "machine": "m1"}


class Served:
    """A host's agent's server, started and stopped by the test."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.socket = host.socket
        self.log = host.root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start_agent_server(self.socket, self.log)

    def stop(self) -> int:
        process, self.process = self.process, None
        assert process is not None
        return stop_agent_server(process)


@pytest.fixture
def served(host: Host) -> Iterator[Served]:
    server = Served(host)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            assert server.stop() == 0, server.log.read_text()
        assert not host.socket.exists(), "the server left its socket"


def asked_by(
    host: Host, request: dict[str, object], console_script: bool = False
) -> tuple[int, list[int], int]:
    """The forced command's pid, the pids the host's log names for ``request``, and its
    exit status; with ``console_script``, run as ``composespawner-host``."""
    before = _log(host)
    command = [str(AGENT), *host.command[3:]] if console_script else host.command
    client = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": os.defpath},
    )
    client.communicate(json.dumps(request).encode(), timeout=60)
    logged = _log(host)[len(before) :]
    pids = [int(p) for p in re.findall(r"composespawner-host\[(\d+)\]", logged)]
    return client.pid, pids, client.returncode


def _log(host: Host) -> str:
    path = host.root / "agent.log"
    return path.read_text() if path.exists() else ""


def test_a_start_poll_and_stop_run_in_the_servers_children(host: Host, served: Served) -> None:
    host.reconfigure(log_file=str(host.root / "agent.log"))
    user = host.new_user()
    reply = started(host, start_request(user, "m1"))
    assert alive(reply["pid"])
    assert pwd.getpwuid(int(status_of(reply["pid"])["Uid"].split()[0])).pw_name == user
    lines, status, _ = host.ask(POLL)
    assert (status, lines[-1]["running"]) == (0, True)
    # A request the agent logs: the lines come from another process than the command's.
    client, pids, status = asked_by(host, {"v": 1, "op": "poll", "machine": "../m1"})
    assert status == 1
    assert pids
    assert client not in pids
    lines, status, _ = host.ask({"v": 1, "op": "stop", "machine": "m1"})
    assert (status, lines[-1]["ok"]) == (0, True)
    assert not alive(reply["pid"])
    assert "no agent's server" not in _log(host)


def test_the_commands_variables_reach_the_request(host: Host, served: Served) -> None:
    lines, status, _ = host.ask(POLL, {"SSH_ORIGINAL_COMMAND": "cat /etc/shadow"})
    assert status == 1
    assert "composespawner-host only" in lines[-1]["refused"]
    lines, status, _ = host.ask(POLL, {"SSH_ORIGINAL_COMMAND": "composespawner-host"})
    assert (status, lines[-1]["running"]) == (0, False)


def test_a_watch_through_the_server_ends_when_the_hub_closes_it(host: Host, served: Served) -> None:
    reply = started(host, start_request(host.new_user(), "m1"))
    watch = host.watch()
    try:
        assert watch.stdout is not None
        os.kill(reply["pid"], signal.SIGKILL)
        assert json.loads(watch.stdout.readline()) == {"exited": "m1", "status": None}
        watch.stdout.close()  # the hub closes the channel: the server's child sees it
        assert watch.wait(timeout=10) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def test_without_its_server_a_host_answers_alone_and_its_notebooks_run_on(
    host: Host, served: Served
) -> None:
    host.reconfigure(log_file=str(host.root / "agent.log"))
    reply = started(host, start_request(host.new_user(), "m1"))
    assert served.stop() == 0  # as systemd's KillMode=process: the server alone
    assert alive(reply["pid"])
    client, pids, status = asked_by(host, POLL, console_script=True)
    assert status == 0
    assert pids
    assert set(pids) == {client}
    assert "no agent's server took the channel" in _log(host)
    served.start()
    lines, status, _ = host.ask({"v": 1, "op": "stop", "machine": "m1"})
    assert (status, lines[-1]["ok"]) == (0, True)


def test_the_socket_is_roots_and_another_accounts_channel_is_refused(
    host: Host, served: Served
) -> None:
    mode = served.socket.stat()
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid) == (0o600, 0)
    nobody = pwd.getpwnam("nobody")
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "try:\n"
        "    socket.send_fds(s, [sys.argv[2].encode()], [0, 1, 2])\n"
        "    s.shutdown(socket.SHUT_WR)\n"
        "    print('taken' if s.recv(1) else 'closed')\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print('closed')\n"
    )
    # Debian's Python: this venv's may sit in root's home, closed to nobody.
    as_nobody = [SYSTEM_PYTHON, "-I", "-c", code, str(served.socket), "0"]

    def run_as_nobody() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            as_nobody, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    assert "PermissionError" in run_as_nobody().stderr
    served.socket.chmod(0o666)  # past the file's mode, the server checks who connected
    done = run_as_nobody()
    assert done.stdout.strip() == "closed", done.stderr
    assert "refused a connection: uid" in served.log.read_text()


def test_a_second_server_on_a_live_socket_refuses_and_a_dead_ones_is_replaced(
    host: Host, served: Served
) -> None:
    second = subprocess.run(
        [SERVER, "--socket", str(served.socket)], capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 2
    assert "another server answers" in second.stderr
    assert served.process is not None
    served.process.kill()  # no chance to remove its socket
    served.process.wait(timeout=10)
    served.process = None
    assert served.socket.is_socket()
    served.start()
    lines, status, _ = host.ask(POLL)
    assert (status, lines[-1]["running"]) == (0, False)


@pytest.mark.parametrize(
    ("message", "fds", "says"),
    [
        (encode([], {}), 2, "2 descriptors sent"),
        (b"[1, 2]", 3, "not a handoff's header"),
        (b"5\0--config", 3, "not a handoff's header"),
        (b"0\0LD_PRELOAD=/tmp/x.so", 3, "passes other than"),
    ],
)
def test_a_malformed_handoff_is_refused_and_its_descriptors_closed(
    message: bytes, fds: int, says: str
) -> None:
    sender, receiver = socket.socketpair()
    pipes = [os.pipe() for _ in range(fds)]
    try:
        socket.send_fds(sender, [message], [w for _, w in pipes])
        for _, w in pipes:
            os.close(w)
        with pytest.raises(HandoffError, match=says):
            receive(receiver)
        # Every write end the server received is closed: each pipe reads EOF.
        assert all(os.read(r, 1) == b"" for r, _ in pipes)
    finally:
        for r, _ in pipes:
            os.close(r)
        sender.close()
        receiver.close()


def test_a_look_with_nothing_sent_is_no_channel() -> None:
    sender, receiver = socket.socketpair()
    with sender, receiver:
        sender.shutdown(socket.SHUT_WR)
        assert receive(receiver) is None


def test_a_header_carries_the_arguments_and_only_sshds_variables() -> None:
    args = ["--config", "/etc/a b.toml", ""]
    environ = {
        "SSH_ORIGINAL_COMMAND": "x" * (MAX_PASSED + 10),
        "SSH_CONNECTION": "127.0.0.1 5 127.0.1.11 22",
        "LD_PRELOAD": "/tmp/x.so",
    }
    got_args, got_environ = decode(encode(args, environ))
    assert got_args == args
    assert got_environ == {
        "SSH_ORIGINAL_COMMAND": "x" * MAX_PASSED,  # still not the agent's: still refused
        "SSH_CONNECTION": "127.0.0.1 5 127.0.1.11 22",
    }


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], (None, DEFAULT_SOCKET)),
        (["--config", "/etc/h.toml"], ("/etc/h.toml", DEFAULT_SOCKET)),
        (["--config=/etc/h.toml", "--socket", "/run/s"], ("/etc/h.toml", "/run/s")),
    ],
)
def test_the_commands_arguments(args: list[str], expected: tuple[str | None, str]) -> None:
    assert parse_arguments(args) == expected


@pytest.mark.parametrize(
    "args", [["--config"], ["--config", "a", "--config", "b"], ["id"], ["--socket=/s", "x"]]
)
def test_other_arguments_are_the_usage(args: list[str]) -> None:
    with pytest.raises(ValueError, match="usage: composespawner-host"):
        parse_arguments(args)
