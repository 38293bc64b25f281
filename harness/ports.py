"""Free loopback ports for the processes a test starts."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Collection


def free_port() -> int:
    """One free port (free now: start what binds it soon)."""
    return free_ports("port")["port"]


def free_ports(*names: str, avoid: Collection[int] = ()) -> dict[str, int]:
    """A free port for each name, all different and none in ``avoid``.

    Each is held until all are chosen: picked one at a time, the kernel may hand
    out a port just released again (a hub's API port once came out equal to its
    public port).
    """
    with contextlib.ExitStack() as held:
        ports: dict[str, int] = {}
        for name in names:
            while name not in ports:
                probe = held.enter_context(socket.socket())
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
                if port not in avoid:
                    ports[name] = port
        return ports
