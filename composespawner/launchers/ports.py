"""Ports for local notebooks, chosen so that nothing else takes them first.

JupyterHub's ``random_port`` asks the kernel for an ephemeral port and lets
it go: the notebook binds it a moment later. In a 200-user storm a notebook
found its port taken by then (``Address already in use``): ephemeral ports are
also what every outgoing connection (the hub's, the proxy's, the notebooks'
own to the hub) is given, and the kernel may hand the same free port to two
askers. A port outside the kernel's ephemeral range is taken only by a process
that binds it by number; of those, this hub's own notebooks are kept apart by
the caller, and a listener already there is found by trying to bind.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Container
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = range(32768, 61000)  # Linux's default, where the file is missing
FIRST_UNPRIVILEGED = 1024
ATTEMPTS = 100


class NoFreePort(Exception):
    """No port outside the ephemeral range could be bound."""


def ephemeral_ports(path: Path = EPHEMERAL_RANGE_FILE) -> range:
    """The ports the kernel gives to outgoing connections and to ``bind(0)``."""
    try:
        low, high = (int(n) for n in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return range(low, high + 1)


def candidate_ports(ephemeral: range) -> list[range]:
    """The unprivileged ports outside ``ephemeral``, as ranges."""
    below = range(FIRST_UNPRIVILEGED, max(FIRST_UNPRIVILEGED, ephemeral.start))
    above = range(max(FIRST_UNPRIVILEGED, ephemeral.stop), 65536)
    return [r for r in (below, above) if r]


def can_bind(ip: str, port: int) -> bool:
    """Whether a listener could bind ``ip:port`` now (nothing holds it)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, port))
        except OSError:
            return False
    return True


def notebook_port(
    ip: str,
    avoid: Container[int],
    ephemeral: range | None = None,
    rng: random.Random | None = None,
) -> int:
    """A port for a notebook on ``ip``: outside the ephemeral range, not in ``avoid``, free now.

    Random rather than the lowest free one: hubs (or a restarted hub and the
    notebooks it left running) sharing a machine then seldom try the same port,
    and each probe is likely to find one free.
    """
    ephemeral = ephemeral_ports() if ephemeral is None else ephemeral
    ranges = candidate_ports(ephemeral)
    total = sum(len(r) for r in ranges)
    pick = rng or random
    for _ in range(ATTEMPTS if total else 0):
        port = _nth(ranges, pick.randrange(total))
        if port not in avoid and can_bind(ip or "0.0.0.0", port):
            return port
    raise NoFreePort(
        f"no free port for a notebook on {ip or 'all addresses'} outside the ephemeral range "
        f"{ephemeral.start}-{ephemeral.stop - 1} after {ATTEMPTS} tries"
    )


def _nth(ranges: list[range], index: int) -> int:
    for r in ranges:
        if index < len(r):
            return r[index]
        index -= len(r)
    raise IndexError(index)
