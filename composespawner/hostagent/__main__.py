"""``composespawner-host``: the forced command of the hub's key on a compute host.

It hands its SSH channel to the agent's server (``server``: one long-lived process
that has imported the agent and forks a child per channel, ``handoff`` says how) and
exits with the request's status. Where no server takes the channel (``server_socket``
is "", or nothing listens there), it runs the request itself (``channel``): the same
answers, a Python start and the agent's imports slower, and a warning in the log
unless no server was configured.

Nothing but the standard library and ``handoff`` is imported before the handoff:
this starts for every channel.
"""

from __future__ import annotations

import os
import sys
import tomllib

from composespawner.hostagent.handoff import (
    DEFAULT_SERVER_SOCKET,
    HandoffError,
    Untaken,
    config_argument,
    exit_status,
    hand_over,
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    server = server_socket_of(args)
    unserved = None
    if server is not None:
        try:
            conn = hand_over(server, args, os.environ)
        except Untaken:
            # A late child could still take it: this process must not run it as well.
            return _untaken(server)
        except (OSError, HandoffError) as e:
            unserved = f"no agent's server took the channel at {server} ({e})"
        else:
            return exit_status(conn)
    from composespawner.hostagent.channel import run_channel

    return run_channel(args, unserved)


def server_socket_of(args: list[str]) -> str | None:
    """The server's socket the config names, or None (none configured, or a config
    this cannot read: the request, run here, reports what is wrong with it)."""
    try:
        path = config_argument(args)
        table: dict[str, object] = {}
        if path is not None:
            with open(path, "rb") as file:
                table = tomllib.load(file)
    except (ValueError, OSError):  # TOMLDecodeError is a ValueError
        return None
    value = table.get("server_socket", DEFAULT_SERVER_SOCKET)
    return value if isinstance(value, str) and value else None


def _untaken(server: str) -> int:
    from composespawner.launchers.agent_protocol import reply

    why = f"the host agent's server at {server} did not take the request in time; try again"
    sys.stdout.buffer.write(reply(ok=False, error=why))
    return 1


if __name__ == "__main__":
    sys.exit(main())
