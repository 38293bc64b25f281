"""``composespawner-host``: the forced command of the hub's key on a compute host.

``composespawner-host [--config PATH] [--socket PATH]`` hands its SSH channel to the
agent's server listening on ``--socket`` (``server``: one long-lived process that has
imported the agent and forks a child per channel; ``handoff`` says how) and exits with
the request's status. Where no server takes the channel, it runs the request itself
(``channel``): the same answers, a Python start's worth of imports slower, and a
warning in the agent's log saying why.

Nothing but ``handoff`` (``os`` and ``sys``) is imported before the handoff: this
starts for every channel.
"""

from __future__ import annotations

import os
import sys

from composespawner.hostagent.handoff import Untaken, exit_status, hand_over, parse_arguments


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        _config, server = parse_arguments(args)
    except ValueError:
        server = None  # the request, run here, says what is wrong with them
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
    from composespawner.hostagent.channel import run_channel

    return run_channel(args, unserved)


def _untaken(server: str) -> int:
    from composespawner.launchers.agent_protocol import reply

    why = f"the host agent's server at {server} did not take the request in time; try again"
    sys.stdout.buffer.write(reply(ok=False, error=why))
    return 1


if __name__ == "__main__":
    sys.exit(main())
