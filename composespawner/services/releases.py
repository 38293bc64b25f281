"""Releasing a machine: taken apart on the fabric, then freed in the ledger.

The ledger frees a device only once the fabric confirmed its detach; while the
fabric cannot be reached the machine stays ``stopping`` with its devices held
(unknown is not dead). A stop must not wait on the fabric (its timeouts and
retries can take a minute), and a release the fabric did not confirm must be
tried again: :class:`BackgroundReleases` keeps trying. If the hub dies first,
the reconciler finishes what is left ``stopping``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from composespawner.domain.hardware import CompositionTag
from composespawner.fabric.base import Fabric, FabricError
from composespawner.ledger import LedgerRunner, Machine
from composespawner.services.pool import PoolView

Release = Callable[[str, str, bool], Awaitable[None]]  # machine id, reason, failed


class BackgroundReleases:
    """One retrying task per machine, with jittered exponential backoff."""

    def __init__(
        self,
        release: Release,
        *,
        retry_max: float,
        log: logging.Logger,
        first_retry: float = 0.5,
    ) -> None:
        self._release = release
        self.retry_max = retry_max
        self.first_retry = first_retry
        self.log = log
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, machine_id: str, *, reason: str, failed: bool) -> None:
        """Release in the background until the fabric confirms; once per machine at a time."""
        if machine_id in self._tasks and not self._tasks[machine_id].done():
            return
        task = asyncio.ensure_future(self._until_done(machine_id, reason, failed))
        self._tasks[machine_id] = task

    async def _until_done(self, machine_id: str, reason: str, failed: bool) -> None:
        delay = self.first_retry
        while True:
            try:
                await self._release(machine_id, reason, failed)
                return
            except FabricError as e:
                self.log.warning(
                    "Release of %s not confirmed (%s); retry in %.1fs", machine_id, e, delay
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.retry_max)

    async def wait(self, machine_id: str, *, within: float | None) -> bool:
        """Whether this process's background release of the machine ends within ``within`` s."""
        task = self._tasks.get(machine_id)
        if task is None:
            return False
        done, _ = await asyncio.wait([task], timeout=within)
        return bool(done)

    @property
    def pending(self) -> int:
        """Releases going on that the fabric has not confirmed yet."""
        return sum(not task.done() for task in self._tasks.values())

    def cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()


class Releaser:
    """Releases the machines of one composer: now, or in the background until confirmed."""

    def __init__(
        self,
        *,
        runner: LedgerRunner,
        fabric: Fabric,
        pool: PoolView,
        hub_id: str,
        retry_max: float,
        log: logging.Logger,
    ) -> None:
        self.runner = runner
        self.fabric = fabric
        self.pool = pool
        self.hub_id = hub_id
        self.log = log
        self.background = BackgroundReleases(self._release_for_retry, retry_max=retry_max, log=log)

    async def release(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Take the machine apart on the fabric, then free it in the ledger.

        Idempotent. Raises FabricError if the fabric did not confirm; the
        devices then stay held in the ledger (unknown is not dead).
        """
        machine = await self._mark_stopping(machine_id, reason)
        if machine is None:
            return
        if machine.host_id:
            await self._decompose(machine)
        end = "failed" if failed else "released"
        await self.runner.run(
            self.runner.ledger.release,
            machine_id,
            to=end,
            message=reason,
            failure=reason if failed else None,
        )
        self.pool.forget()  # the next form and placement should see these devices free
        self.log.info("Released machine %s (%s): %s", machine_id, end, reason)

    async def _decompose(self, machine: Machine) -> None:
        """Take apart what the machine holds on its host (what it held when release began)."""
        assert machine.host_id is not None
        host = machine.host_id
        known = (await self.pool.known_inventory()).host(host)  # a host's own block never changes
        # A GPU held in shares leaves with its last holder only (ledger/shares.py).
        closing = (
            await self.runner.run(self.runner.ledger.leave_shares, machine.id)
            if machine.shared
            else ()
        )
        staying = set(machine.shared) - set(closing)
        own = known.block_id if known else None
        devices = [b for b in machine.block_ids if b != own and b not in staying]
        if not await self.fabric.decompose(host, devices, self.tag(machine.id, machine)):
            # We mark a host before attaching anything, so a host without our mark
            # holds nothing we attached; what is on it belongs to someone else.
            self.log.info("Host %s has no mark of %s: nothing of ours on it", host, machine.id)
            # But a shared GPU's last holder detaches what its first holder attached,
            # whether or not it got as far as the host's mark itself.
            await self._detach_closing(host, closing)

    async def _detach_closing(self, host: str, closing: Sequence[str]) -> None:
        """Detach the shared GPUs a release closes from their host. The ledger holds them
        there for this hub until the detach is confirmed, so they are ours to detach even
        where the mark went with the host's last machine; never from a host another hub
        marked."""
        if not closing:
            return
        mark, linked = await self.fabric.host_mark(host)
        if mark is not None and mark.hub != self.hub_id:
            return
        for block in sorted(set(closing) & set(linked)):
            await self.fabric.detach(host, block)

    def tag(self, machine_id: str, machine: Machine | None = None) -> CompositionTag:
        """The mark this hub wrote on the machine's host (the owner only when known)."""
        owner = f"{machine.user_name}/{machine.server_name}" if machine else ""
        return CompositionTag(hub=self.hub_id, machine=machine_id, owner=owner)

    async def release_in_background(self, machine_id: str, *, reason: str, failed: bool) -> None:
        """Mark the machine ``stopping`` now; take it apart and free it in the background."""
        if await self._mark_stopping(machine_id, reason) is not None:
            self.release_soon(machine_id, reason=reason, failed=failed)

    async def _mark_stopping(self, machine_id: str, reason: str) -> Machine | None:
        """The machine, now ``stopping``; None when it holds nothing to give back."""
        ledger = self.runner.ledger
        machine = await self.runner.run(ledger.machine, machine_id)
        if machine is None or machine.state in ("released", "failed"):
            return None
        if machine.state == "requested":
            await fail_unclaimed(self.runner, machine_id, reason)
            return None
        if machine.state != "stopping":
            # What it holds as it stops: a grow that committed a moment ago included.
            machine = await self.runner.run(ledger.transition, machine_id, "stopping", reason)
        return machine

    def release_soon(self, machine_id: str, *, reason: str, failed: bool) -> None:
        """Keep trying to release in the background until the fabric confirms."""
        self.background.start(machine_id, reason=reason, failed=failed)

    async def _release_for_retry(self, machine_id: str, reason: str, failed: bool) -> None:
        await self.release(machine_id, reason=reason, failed=failed)

    async def wait(self, machine_id: str, *, within: float | None) -> bool:
        """Whether the background release of the machine ends within ``within`` s."""
        return await self.background.wait(machine_id, within=within)

    @property
    def pending(self) -> int:
        """Releases going on in the background that the fabric has not confirmed yet."""
        return self.background.pending

    def cancel_all(self) -> None:
        self.background.cancel_all()

    async def clear_host(self, host: str, blocks: Sequence[str], machine_id: str) -> None:
        """Take apart what this hub composed on a host for a machine the ledger has ended."""
        await self.fabric.decompose(host, blocks, self.tag(machine_id))
        self.pool.forget()


async def fail_unclaimed(runner: LedgerRunner, machine_id: str, reason: str) -> None:
    """End a machine that holds nothing yet (``requested``): its server is free again."""
    await runner.run(runner.ledger.transition, machine_id, "failed", reason, failure=reason)
