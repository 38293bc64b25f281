"""The forced command, and what it hands the agent's server: the SSH channel itself.

``python -IS …/handoff.py [--config PATH] [--socket PATH]`` is the forced command of
the hub's key (``composespawner-host`` runs the same :func:`main`). It connects to the
server's Unix socket and sends one message: a header (its arguments and the two
variables sshd set that the agent reads) with the channel's stdin, stdout and stderr as
file descriptors (SCM_RIGHTS). The server forks; the child answers :data:`TAKEN` at
once, runs the request on those descriptors exactly as the forced command would have,
and sends its exit status as one byte. The forced command exits with it. The child
holds sshd's very pipes, so it sees the request's EOF and the hub closing the channel
as an agent run by sshd does.

The header is NUL-separated (no argument or variable can hold a NUL): the number of
arguments, the arguments, then ``NAME=VALUE`` for each passed variable that is set.

Where no server takes the channel, the forced command runs the request itself
(``channel``): the same answers, the agent's imports slower, and a warning in the
agent's log saying why.

Every channel starts the forced command, so it runs by path without ``site`` (``-S``,
as the log sink does: the venv's ``.pth`` files cost more than the rest), imports
nothing at the top but ``os`` and ``sys`` (the socket module alone costs milliseconds:
``_socket`` is built in) and reads no file before the handoff. Only the way without a
server brings in ``site`` and the agent.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's own costs milliseconds to import
if TYPE_CHECKING:
    import _socket
    from collections.abc import Mapping, Sequence

DEFAULT_SOCKET = "/run/composespawner-host/agent.sock"
# The variables sshd sets that the agent reads: the command the client asked for (refused
# unless it is the agent's) and the connection (the address the hub reached).
PASSED_VARIABLES = ("SSH_ORIGINAL_COMMAND", "SSH_CONNECTION")
CHANNEL_FDS = 3  # stdin, stdout, stderr
MAX_PASSED = 4096  # bytes of each variable: a longer command is refused all the same
MAX_HEADER = 64 * 1024
TAKEN = b"+"  # the request's process has started: from here it owns the channel
CONNECT_TIMEOUT = 5.0  # a server that does not accept within this is not there
TAKE_TIMEOUT = 10.0  # nor one that does not fork within this
USAGE = "usage: composespawner-host [--config PATH] [--socket PATH]"


class HandoffError(OSError):
    """A handoff's message was not what the other side sends."""


class Untaken(Exception):
    """The channel was sent and not taken in time: a late child may still take it."""


def parse_arguments(args: Sequence[str]) -> tuple[str | None, str]:
    """The agent's config file (None: every default) and its server's socket from
    ``[--config PATH] [--socket PATH]`` (each also as ``--name=PATH``), the one usage of
    ``composespawner-host`` and its server; ValueError for anything else."""
    found: dict[str, str] = {}
    rest = list(args)
    while rest:
        word = rest.pop(0)
        name, equals, value = word.partition("=")
        if name not in ("--config", "--socket") or name in found:
            raise ValueError(f"{USAGE} (got {' '.join(args)!r})")
        if not equals:
            if not rest:
                raise ValueError(f"{USAGE} (got {' '.join(args)!r})")
            value = rest.pop(0)
        found[name] = value
    return found.get("--config"), found.get("--socket", DEFAULT_SOCKET)


def read_arguments(args: Sequence[str]) -> tuple[str | None, str | None, str | None]:
    """:func:`parse_arguments`'s config and socket and None, or, for arguments that are
    not the command's, None, None and what is wrong (the request answers with it)."""
    try:
        config, socket = parse_arguments(args)
    except ValueError as e:
        return None, None, str(e)
    return config, socket, None


def encode(args: Sequence[str], environ: Mapping[str, str]) -> bytes:
    """The header: ``args`` and those of the passed variables ``environ`` sets."""
    passed = [
        os.fsencode(f"{name}={environ[name]}")[: len(name) + 1 + MAX_PASSED]
        for name in PASSED_VARIABLES
        if name in environ
    ]
    return b"\0".join([str(len(args)).encode(), *map(os.fsencode, args), *passed])


def decode(data: bytes) -> tuple[list[str], dict[str, str]]:
    """``args`` and the passed variables of a header; HandoffError for anything else."""
    fields = [os.fsdecode(field) for field in data.split(b"\0")]
    if not fields[0].isdigit() or int(fields[0]) > len(fields) - 1:
        raise HandoffError("not a handoff's header")
    count = int(fields[0])
    environ = dict(field.partition("=")[::2] for field in fields[1 + count :])
    if not set(environ) <= set(PASSED_VARIABLES):
        raise HandoffError(f"the header passes other than {', '.join(PASSED_VARIABLES)}")
    return fields[1 : 1 + count], environ


def hand_over(path: str, args: Sequence[str], environ: Mapping[str, str]) -> _socket.socket:
    """Connect to the server at ``path`` and hand it this process's channel; the
    connection, once the server's child has taken it. OSError where no server took it:
    nothing of the channel has been read then; Untaken where it may yet be."""
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT)
        conn.connect(path)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in range(CHANNEL_FDS))
        conn.sendmsg([encode(args, environ)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        conn.shutdown(_socket.SHUT_WR)
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


def main(argv: list[str] | None = None) -> int:
    """The forced command: the channel handed over, or the request run here."""
    args = sys.argv[1:] if argv is None else argv
    config, server, usage = read_arguments(args)
    unserved = None
    if server is not None:
        try:
            conn = hand_over(server, args, os.environ)
        except Untaken:
            # A late child could still take it: this process must not run it as well.
            return _untaken(server)
        except OSError as e:
            unserved = f"no agent's server took the channel at {server} ({e})"
        else:
            return exit_status(conn)
    _bring_in_the_agent()
    from composespawner.hostagent.channel import run_channel

    return run_channel(config, unserved, usage)


def _untaken(server: str) -> int:
    _bring_in_the_agent()
    from composespawner.launchers.agent_protocol import reply

    why = f"the host agent's server at {server} did not take the request in time; try again"
    sys.stdout.buffer.write(reply(ok=False, error=why))
    return 1


def _bring_in_the_agent() -> None:
    """Run by path with ``-S``: the venv's site-packages (where the agent is) on the path,
    and this file's folder off it (its modules are the package's, not top-level ones)."""
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    if sys.flags.no_site:
        import site

        site.main()


def exit_status(conn: _socket.socket) -> int:
    """The request's exit status, once it is done (1 where its process died unheard)."""
    try:
        status = conn.recv(1)
    finally:
        conn.close()
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main())
