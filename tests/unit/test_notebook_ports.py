"""Ports for local notebooks: outside the kernel's ephemeral range, never one already held."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from composespawner.launchers.ports import (
    LINUX_EPHEMERAL,
    NoFreePort,
    can_bind,
    candidate_ports,
    ephemeral_ports,
    notebook_port,
)

EPHEMERAL = range(32768, 61000)


class Scripted(random.Random):
    """Picks the given indexes in turn (into the candidate ports, low ones first)."""

    def __init__(self, *indexes: int) -> None:
        super().__init__()
        self.indexes = list(indexes)

    def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        return self.indexes.pop(0)


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    found = tmp_path / "ip_local_port_range"
    found.write_text("40000\t50000\n")
    assert ephemeral_ports(found) == range(40000, 50001)
    found.write_text("nonsense\n")
    assert ephemeral_ports(found) == LINUX_EPHEMERAL
    assert ephemeral_ports(tmp_path / "missing") == LINUX_EPHEMERAL


def test_candidates_are_the_unprivileged_ports_outside_the_ephemeral_range() -> None:
    assert candidate_ports(EPHEMERAL) == [range(1024, 32768), range(61000, 65536)]
    assert candidate_ports(range(1024, 65536)) == []
    assert candidate_ports(range(500, 60000)) == [range(60000, 65536)]


def test_a_thousand_picks_stay_outside_the_ephemeral_range_and_the_avoided() -> None:
    avoid = set(range(1024, 30000))
    rng = random.Random(9)
    picks = [notebook_port("127.0.0.1", avoid, EPHEMERAL, rng) for _ in range(1000)]
    assert not [p for p in picks if p in EPHEMERAL or p in avoid or p < 1024 or p > 65535]
    # Both sides of the ephemeral range are used.
    assert min(picks) < 32768 < 61000 <= max(picks)


def test_a_port_something_listens_on_is_passed_over() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        free = next(p for p in range(20000, 30000) if can_bind("127.0.0.1", p))
        ephemeral = range(taken + 1, 65536)  # the candidates: 1024 .. taken
        port = notebook_port("127.0.0.1", set(), ephemeral, Scripted(taken - 1024, free - 1024))
    assert port == free


def test_an_avoided_port_is_passed_over() -> None:
    port = notebook_port("127.0.0.1", {2000}, EPHEMERAL, Scripted(2000 - 1024, 3000 - 1024))
    assert port == 3000


def test_no_free_port_says_where_it_looked() -> None:
    with pytest.raises(NoFreePort, match="outside the ephemeral range 1024-65534"):
        notebook_port("127.0.0.1", {65535}, range(1024, 65535))
    with pytest.raises(NoFreePort, match="outside the ephemeral range 1024-65535"):
        notebook_port("127.0.0.1", set(), range(1024, 65536))
