"""The composer's parts, each alone: reservations, snapshots, background releases."""

from __future__ import annotations

import asyncio
import logging

import pytest

from composespawner.fabric.base import FabricUnreachable
from composespawner.services.releases import BackgroundReleases
from composespawner.services.reservations import Reservations
from composespawner.services.snapshot import Snapshot

LOG = logging.getLogger("tests.composer_parts")


# -- reservations ---------------------------------------------------------------


def test_a_claim_in_flight_keeps_placement_off_its_blocks_until_a_ledger_read_shows_it() -> None:
    reservations = Reservations()
    reservations.hold(["b1", "b2"])
    assert reservations.taken({}, read_after=0) == {"b1", "b2"}

    reservations.commit(["b1", "b2"])
    # A read that began before the commit does not show it: still reserved.
    assert reservations.taken({}, read_after=0) == {"b1", "b2"}
    # A read that began after it does: the ledger's holders carry it from now on.
    assert reservations.taken({"b1": "m", "b2": "m"}, read_after=1) == {"b1", "b2"}
    assert reservations.taken({}, read_after=1) == set()


def test_a_claim_not_made_frees_its_blocks_at_once() -> None:
    reservations = Reservations()
    reservations.hold(["b1"])
    reservations.drop(["b1"])
    assert reservations.taken({"b9": "m"}, read_after=0) == {"b9"}


# -- snapshots --------------------------------------------------------------------


class Reads:
    def __init__(self) -> None:
        self.count = 0
        self.hold: asyncio.Event | None = None

    async def __call__(self) -> int:
        self.count += 1
        if self.hold is not None:
            await self.hold.wait()
        return self.count


async def test_one_read_serves_every_caller_within_its_ttl() -> None:
    snapshot, reads = Snapshot[int](ttl=60), Reads()
    reads.hold = asyncio.Event()
    waiting = [asyncio.ensure_future(snapshot.get(reads)) for _ in range(5)]
    await asyncio.sleep(0)  # let all five wait on the one read
    reads.hold.set()

    assert await asyncio.gather(*waiting) == [1] * 5
    assert await snapshot.get(reads) == 1
    assert reads.count == 1


async def test_fresh_and_forget_read_again() -> None:
    snapshot, reads = Snapshot[int](ttl=60), Reads()
    await snapshot.get(reads)
    assert await snapshot.get(reads, fresh=True) == 2
    snapshot.forget()
    assert await snapshot.get(reads) == 3


async def test_current_answers_without_reading_only_what_get_would_return_at_once() -> None:
    snapshot, reads = Snapshot[int](ttl=60), Reads()
    assert snapshot.current() is None  # nothing read yet
    await snapshot.get(reads)
    assert snapshot.current() == 1
    assert snapshot.current(fresh=True) is None
    snapshot.forget()
    assert snapshot.current() is None
    assert reads.count == 1, "current() never reads"

    expired = Snapshot[int](ttl=0)
    await expired.get(reads)
    assert expired.current() is None


async def test_a_slow_read_gives_the_last_value_with_its_age_and_goes_on() -> None:
    snapshot, reads = Snapshot[int](ttl=60), Reads()
    reads.hold = asyncio.Event()
    with pytest.raises(TimeoutError):  # nothing read yet, and the read hangs
        await snapshot.get_within(reads, budget=0.01)
    reads.hold.set()
    assert await snapshot.get(reads) == 1  # the read that outlived the budget landed

    snapshot.forget()  # out of date: the next get reads again, and that read hangs
    reads.hold = asyncio.Event()
    value, age = await snapshot.get_within(reads, budget=0.01)
    assert value == 1
    assert age is not None
    assert age > 0
    reads.hold.set()
    assert await snapshot.get(reads) == 2


# -- background releases ------------------------------------------------------------


async def test_a_release_is_retried_until_the_fabric_confirms_and_runs_once_at_a_time() -> None:
    calls: list[str] = []

    async def release(machine_id: str, reason: str, failed: bool) -> None:
        calls.append(machine_id)
        if len(calls) < 3:
            raise FabricUnreachable("test: no answer")

    background = BackgroundReleases(release, retry_max=0.01, log=LOG, first_retry=0.001)
    background.start("m1", reason="stopped", failed=False)
    background.start("m1", reason="stopped again", failed=False)  # already under way
    assert background.pending == 1

    assert await background.wait("m1", within=10)
    assert calls == ["m1", "m1", "m1"]
    assert background.pending == 0
    assert not await background.wait("m2", within=0)  # never started here
