"""Asking a stand-in notebook (tests/launchers/hungry_notebook.py) over HTTP, as the hub's
proxy reaches it: at its port on the hub's loopback."""

from __future__ import annotations

import http.client
import time

from composespawner.launchers.local import LocalLauncher


def get(spawner: LocalLauncher, path: str, timeout: float = 60) -> str:
    """What ``GET path`` answers."""
    connection = http.client.HTTPConnection("127.0.0.1", spawner.port, timeout=timeout)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def answers(spawner: LocalLauncher, within: float = 60) -> str:
    """What ``GET /`` answers, once the notebook listens (a container's published port
    may take a connection before the notebook behind it listens, and drop it)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return get(spawner, "/", timeout=5)
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
            assert spawner.proc is not None, "the notebook was not started"
            assert spawner.proc.poll() is None, "the notebook's process ended"
            assert time.monotonic() < deadline, "the notebook never listened"
            time.sleep(0.05)  # polling the port: the condition itself
