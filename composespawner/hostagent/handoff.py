"""What the forced command hands the agent's server: the SSH channel itself.

The forced command (``__main__``) connects to the server's Unix socket and sends one
message: a JSON header (its arguments and the two variables sshd set that the agent
reads) with the channel's stdin, stdout and stderr as file descriptors (SCM_RIGHTS).
The server forks; the child answers :data:`TAKEN` at once, runs the request on those
descriptors exactly as the forced command would have, and sends its exit status as one
byte. The forced command exits with it. The child holds sshd's very pipes, so it sees
the request's EOF and the hub closing the channel as an agent run by sshd does.

Standard library only, and nothing imported at the top but what a forced command
needs: every channel starts this.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_SERVER_SOCKET = "/run/composespawner-host/agent.sock"
# The variables sshd sets that the agent reads: the command the client asked for (refused
# unless it is the agent's) and the connection (the address the hub reached).
PASSED_VARIABLES = ("SSH_ORIGINAL_COMMAND", "SSH_CONNECTION")
CHANNEL_FDS = 3  # stdin, stdout, stderr
MAX_PASSED = 4096  # characters of each: a longer command is refused all the same
MAX_HEADER = 64 * 1024
TAKEN = b"+"  # the request's process has started: from here it owns the channel
CONNECT_TIMEOUT = 5.0  # a server that does not accept within this is not there
TAKE_TIMEOUT = 10.0  # nor one that does not fork within this


class HandoffError(OSError):
    """A handoff's message was not what the other side sends."""


class Untaken(Exception):
    """The channel was sent and not taken in time: a late child may still take it."""


@dataclass(frozen=True, slots=True)
class Channel:
    """One SSH channel, as the server receives it."""

    args: tuple[str, ...]
    environ: dict[str, str]
    fds: tuple[int, ...]  # stdin, stdout, stderr: the receiver's to close


def config_argument(args: Sequence[str]) -> str | None:
    """``--config PATH`` or ``--config=PATH``'s path, None for no arguments; ValueError
    for anything else (the one usage of ``composespawner-host`` and its server)."""
    if not args:
        return None
    if len(args) == 2 and args[0] == "--config":
        return args[1]
    if len(args) == 1 and args[0].startswith("--config="):
        return args[0].removeprefix("--config=")
    raise ValueError(f"usage: composespawner-host [--config PATH] (got {' '.join(args)!r})")


def header(args: Sequence[str], environ: Mapping[str, str]) -> bytes:
    """The message's JSON: ``args`` and the passed variables of ``environ`` that are set."""
    passed = {name: environ[name][:MAX_PASSED] for name in PASSED_VARIABLES if name in environ}
    return json.dumps({"args": list(args), "environ": passed}).encode()


def hand_over(path: str, args: Sequence[str], environ: Mapping[str, str]) -> socket.socket:
    """Connect to the server at ``path`` and hand it this process's channel; the
    connection, once the server's child has taken it. OSError where no server took it:
    nothing of the channel has been read then; Untaken where it may yet be."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        conn.connect(path)
        socket.send_fds(conn, [header(args, environ)], [0, 1, 2])
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(TAKE_TIMEOUT)
        try:
            taken = conn.recv(1)
        except TimeoutError:
            raise Untaken(f"the agent's server at {path} did not take the channel") from None
        if taken != TAKEN:
            raise HandoffError(f"the agent's server at {path} did not take the channel")
        conn.settimeout(None)  # a watch lasts as long as the hub keeps it
    except BaseException:
        conn.close()
        raise
    return conn


def exit_status(conn: socket.socket) -> int:
    """The request's exit status, once it is done (1 where its process died unheard)."""
    with conn:
        status = conn.recv(1)
    return status[0] if status else 1


def receive(conn: socket.socket) -> Channel | None:
    """The channel a forced command handed over on ``conn``, None where nothing was sent
    (a look at whether a server answers); HandoffError (any descriptors sent closed) for
    anything but one header and three descriptors."""
    data, fds, _flags, _address = socket.recv_fds(conn, MAX_HEADER, CHANNEL_FDS + 1)
    if not data and not fds:
        return None
    try:
        if len(fds) != CHANNEL_FDS:
            raise HandoffError(f"{len(fds)} descriptors sent, not {CHANNEL_FDS}")
        try:
            body = json.loads(data)
            args, environ = body["args"], body["environ"]
        except (ValueError, TypeError, KeyError) as e:
            raise HandoffError(f"not a handoff's header: {e}") from None
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            raise HandoffError("args is not a list of strings")
        if not (
            isinstance(environ, dict)
            and set(environ) <= set(PASSED_VARIABLES)
            and all(isinstance(v, str) for v in environ.values())
        ):
            raise HandoffError(f"environ holds other than {', '.join(PASSED_VARIABLES)}")
    except HandoffError:
        for fd in fds:
            os.close(fd)
        raise
    return Channel(tuple(args), dict(environ), tuple(fds))
