"""Give idle GPUs back while their servers run on (issue 32): the reclaimer's pass.

Every few seconds (``composespawner reclaimer``, a hub-managed service) one
:meth:`Reclaimer.sweep`:

1. lists the GPUs that running machines hold whole, by host, with the UUIDs the
   fabric's inventory gives them (the key every activity source reads by);
2. reads each host's activity once (:class:`~composespawner.activity.ActivitySource`);
   a host that cannot be read has all its GPUs observed as unknown, and unknown is
   not idle (an outage is logged when it starts and when it ends, not every pass);
3. folds each reading into the GPU's watch and asks the policy what to do
   (:mod:`composespawner.domain.reclaim`: the site's policy under the cohort's
   overrides), and saves the watches with the seconds each GPU worked;
4. acts: ``detach`` shrinks the machine by that GPU through the composer, as the
   portal's shrink does; ``warn`` only records the warning in the watch (the portal
   and JupyterLab show it from there); ``reclaim`` shuts down the kernels holding
   the GPU (every kernel of the server where the source cannot name the holders)
   through the notebook server's API, then detaches. A GPU is recorded as given
   back only once the fabric confirmed the detach; anything that fails is logged
   and tried again next pass, since the watch still says what to do.

A GPU held in shares is never touched: its other holders use it (a later step may
end just one holder's share). Deciding is pure (:func:`judge`, :func:`gpus_by_host`);
the :class:`Reclaimer` gathers what they need and carries out what they say.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from composespawner.activity import ActivitySource, ActivityUnreadable
from composespawner.domain.activity import (
    ActivityReading,
    GpuActivity,
    gpu_uuid,
    kernel_in,
    owned_by,
)
from composespawner.domain.hardware import Inventory
from composespawner.domain.reclaim import (
    SITE_DEFAULT,
    Decision,
    GpuWatch,
    ReclaimPolicy,
    cohort_policy,
    decide,
    kernels_holding,
    observe,
    reclaims_that_wait,
    record_warning,
)
from composespawner.fabric.base import FabricError
from composespawner.ledger import LedgerError, Machine
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.kernels import Kernel, KernelsUnavailable

BY = "reclaimer"  # who gave a GPU back, in the ledger's record and audit log
FABRIC = ""  # the fabric's inventory, among the hosts' outages (no host id is empty)
READ_TIMEOUT = 30.0  # seconds for one host's reading, beyond the source's own timeout
INTERVAL = 60.0  # seconds between passes, unless the reclaimer's config says otherwise

Outcome = Literal["done", "failed", "skipped"]
Key = tuple[str, str]  # (machine id, block id): one GPU on one machine


class KernelsApi(Protocol):
    """A notebook server's kernels (``services/kernels.py``'s NotebookKernels)."""

    async def kernels(self, user: str, server: str) -> list[Kernel]: ...

    async def shut_down(self, user: str, server: str, kernel_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class HeldGpu:
    """A GPU a running machine holds whole, as the reclaimer watches it."""

    machine: Machine
    block_id: str
    uuid: str | None  # as the activity sources key it; None: the fabric gives none

    @property
    def key(self) -> Key:
        return (self.machine.id, self.block_id)


@dataclass(frozen=True, slots=True)
class Judgement:
    """One GPU's watch after this pass's reading, the seconds it worked, what to do."""

    watch: GpuWatch
    active_s: float
    decision: Decision


@dataclass(frozen=True, slots=True)
class Action:
    """What one pass did (or tried) with one GPU."""

    kind: Literal["detach", "warn", "reclaim"]
    machine_id: str
    user: str
    server: str
    block_id: str
    why: str
    outcome: Outcome
    detail: str = ""  # what failed, or why it was skipped; kernels shut down

    def summary(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.__slots__ if getattr(self, name)}


# ---------------------------------------------------------------------------
# Deciding: pure
# ---------------------------------------------------------------------------


def gpus_by_host(machines: Iterable[Machine], inventory: Inventory) -> dict[str, list[HeldGpu]]:
    """The GPUs running machines hold whole, by host.

    Only ``running`` machines: a machine being composed or launched is its spawn's
    to finish, and a shrink refuses anything else. Shares are left out: a shared GPU
    is used by its other holders, so detaching it for one of them would take it
    from all (a later step may end just that holder's share).
    """
    by_host: dict[str, list[HeldGpu]] = {}
    for machine in machines:
        if machine.state != "running" or not machine.host_id:
            continue
        for block_id in machine.block_ids:
            device = inventory.device(block_id)
            if block_id in machine.shared or device is None or device.kind != "gpu":
                continue
            uuid = gpu_uuid(device.uuid) if device.uuid else None
            by_host.setdefault(machine.host_id, []).append(HeldGpu(machine, block_id, uuid))
    return by_host


def spare_other_gpus(
    acting: list[tuple[HeldGpu, Decision]],
    held: Iterable[HeldGpu],
    holders: Mapping[Key, tuple[str, ...] | None],
) -> list[tuple[HeldGpu, Decision]]:
    """``acting`` without the reclaims that would end kernels using a GPU that stays.

    A reclaim shuts down the kernels holding its GPU, or every kernel of the server
    where the holders are unknown (DCGM names none), so it goes ahead only when none of
    them may be using another GPU the machine keeps (:func:`reclaims_that_wait`, on
    ``holders`` by GPU as this pass read them). The warning stands: the user can still
    give it back.
    """
    reclaiming: dict[str, dict[str, tuple[str, ...] | None]] = {}
    for gpu, decision in acting:
        if decision.action == "reclaim":
            reclaiming.setdefault(gpu.machine.id, {})[gpu.block_id] = holders.get(gpu.key)
    staying: dict[str, dict[str, tuple[str, ...] | None]] = {}
    for gpu in held:
        if gpu.block_id not in reclaiming.get(gpu.machine.id, {}):
            staying.setdefault(gpu.machine.id, {})[gpu.block_id] = holders.get(gpu.key)
    waiting = {
        machine: reclaims_that_wait(gpus, staying.get(machine, {}))
        for machine, gpus in reclaiming.items()
    }
    return [
        (gpu, decision)
        for gpu, decision in acting
        if decision.action != "reclaim" or gpu.block_id not in waiting[gpu.machine.id]
    ]


def judge(
    before: GpuWatch | None, gpu: GpuActivity | None, now: float, policy: ReclaimPolicy
) -> Judgement:
    """Fold the reading ``gpu`` (None: unknown) taken at ``now`` into the watch, and decide.

    A ``warn`` is recorded in the watch at once: saving the watch is sending it.
    """
    after = observe(before, gpu, now, policy)
    decision = decide(after, policy, now)
    if decision.action == "warn":
        after = record_warning(after, now)
    return Judgement(after, active_seconds(before, after, now), decision)


def active_seconds(before: GpuWatch | None, after: GpuWatch, now: float) -> float:
    """Seconds the GPU worked since the last reading: the whole interval when this reading
    did work and continued the run (both ends seen, the gap within ``max_gap``, as
    ``observe`` judged); 0 otherwise, as unknown is not idle but not work either."""
    if before is None or before.since is None or after.since != before.since:
        return 0.0
    return now - before.last_at if after.last_work_at == now else 0.0


# ---------------------------------------------------------------------------
# Doing
# ---------------------------------------------------------------------------


class _MovedOn(Exception):
    """The server's machine is not the one watched any more (stopped, started again)."""


class Notices:
    """What the reclaimer tells its log once, not every pass: a warning, and an outage
    when it starts and when it ends."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._outages: dict[str, str] = {}  # host (or FABRIC) -> why, while unreadable
        self._said: set[str] = set()  # warnings given already

    def once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            self.log.warning(message, *args)

    def unreadable(self, what: str, why: str) -> None:
        if what not in self._outages:
            self.log.warning(
                "%s; the GPUs count as unknown and none is reclaimed until it reads again", why
            )
        self._outages[what] = why

    def readable(self, what: str) -> None:
        if self._outages.pop(what, None) is not None:
            self.log.info("%s readable again", "The fabric" if what == FABRIC else what)


class Reclaimer:
    """Reads the running machines' GPUs and gives idle ones back, one :meth:`sweep` at a time.

    ``kernels``: the notebook servers' kernels API; without it a GPU is warned about
    but never reclaimed (detaching under a live kernel would break it).
    ``notebook_uids``: the accounts a machine's notebook runs as, whose processes alone
    may name its kernels (:func:`~composespawner.domain.activity.owned_by`); None where
    the source vouches for them itself (a host's agent knows its notebooks' accounts).
    """

    def __init__(
        self,
        composer: Composer,
        source: ActivitySource,
        *,
        site_policy: ReclaimPolicy = SITE_DEFAULT,
        interval: float = 0.0,
        kernels: KernelsApi | None = None,
        read_timeout: float = READ_TIMEOUT,
        notebook_uids: Callable[[Machine], Collection[int] | None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.composer = composer
        self.notebook_uids = notebook_uids
        self.source = source
        self.site_policy = site_policy
        self.interval = interval  # seconds between passes: a cohort's max_gap must exceed it
        self.kernels = kernels
        self.read_timeout = read_timeout
        self.log = log or logging.getLogger(__name__)
        self.notices = Notices(self.log)

    async def sweep(self, now: float) -> list[Action]:
        """One pass at ``now`` (seconds, as ``time.time()``): what it did."""
        started = time.monotonic()
        gpus = await self._held_gpus()
        if not gpus:
            return []
        readings = dict(zip(gpus, await asyncio.gather(*map(self._read, gpus)), strict=True))
        policies = await self._policies({g.machine.cohort for held in gpus.values() for g in held})
        reclaims = self.composer.ledger.reclaims
        watches = await self.composer.runner.run(reclaims.watches)
        judged: list[tuple[HeldGpu, Judgement]] = []
        for host, held in gpus.items():
            for gpu in held:
                activity = self._activity(readings[host], gpu)
                if activity is None and readings[host] is not None and gpu.uuid is not None:
                    self.notices.once(
                        f"unlisted:{host}:{gpu.uuid}",
                        "Host %s's activity source does not list GPU %s (UUID %s): it is never"
                        " reclaimed. A DCGM exporter lists the GPUs it found at its start:"
                        " restart it after GPUs are attached",
                        host,
                        gpu.block_id,
                        gpu.uuid,
                    )
                policy = policies[gpu.machine.cohort]
                judged.append((gpu, judge(watches.get(gpu.key), activity, now, policy)))
        await self.composer.runner.run(
            reclaims.save_watches,
            {gpu.key: j.watch for gpu, j in judged},
            {gpu.key: j.active_s for gpu, j in judged if j.active_s > 0},
        )
        acting = [(gpu, j.decision) for gpu, j in judged if j.decision.action != "none"]
        holders = {gpu.key: j.watch.holders for gpu, j in judged}
        acting = spare_other_gpus(acting, (g for held in gpus.values() for g in held), holders)
        # A decision is only as fresh as its reading: one acted on later than max_gap
        # after it (a long pass) is left for the next pass's reading.
        fresh_until = {gpu.key: started + policies[gpu.machine.cohort].max_gap for gpu, _ in acting}
        return [
            await self._act(gpu, d, now, fresh_until[gpu.key], holders[gpu.key])
            for gpu, d in acting
        ]

    async def run_forever(self, interval: float, clock: Callable[[], float] = time.time) -> None:
        while True:
            try:
                actions = await self.sweep(clock())
            except Exception:
                self.log.exception("Reclaim pass failed; trying again in %.0f s", interval)
            else:
                if actions:
                    self.log.info("Reclaim pass: %s", [a.summary() for a in actions])
            await asyncio.sleep(interval)

    # -- gathering ---------------------------------------------------------------

    def _activity(self, reading: ActivityReading | None, gpu: HeldGpu) -> GpuActivity | None:
        """The GPU's activity in ``reading`` (None: unknown), a holder's kernel believed
        only from its notebook's own accounts where the source does not vouch for it."""
        activity = _activity(reading, gpu)
        if activity is None or self.notebook_uids is None:
            return activity
        return owned_by(activity, self.notebook_uids(gpu.machine))

    async def _held_gpus(self) -> dict[str, list[HeldGpu]]:
        machines = await self.composer.runner.run(self.composer.ledger.live_machines)
        if not any(m.state == "running" for m in machines):
            return {}
        # Kinds and UUIDs never change: any inventory read so far tells them.
        try:
            inventory = await self.composer.pool.known_inventory()
        except FabricError as e:
            # None read yet and the fabric down: no UUIDs, so nothing can be read or taken.
            self.notices.unreadable(FABRIC, f"The fabric's inventory is unreadable ({e})")
            return {}
        self.notices.readable(FABRIC)
        gpus = gpus_by_host(machines, inventory)
        for gpu in (g for held in gpus.values() for g in held if g.uuid is None):
            self.notices.once(
                f"uuid:{gpu.block_id}",
                "The fabric gives GPU %s no UUID: its activity cannot be read, so it is"
                " never reclaimed",
                gpu.block_id,
            )
        return gpus

    async def _read(self, host: str) -> ActivityReading | None:
        """The host's reading, or None when it cannot be had (its GPUs are then unknown)."""
        try:
            reading = await asyncio.wait_for(self.source.read(host), self.read_timeout)
        except (ActivityUnreadable, TimeoutError) as e:
            why = str(e) or f"no reading of {host} within {self.read_timeout:g} s"
            self.notices.unreadable(host, why)
            return None
        self.notices.readable(host)
        return reading

    async def _policies(self, cohorts: set[str | None]) -> dict[str | None, ReclaimPolicy]:
        policies: dict[str | None, ReclaimPolicy] = {None: self.site_policy}
        for cohort in cohorts - {None}:
            assert cohort is not None
            overrides = await self.composer.runner.run(
                self.composer.ledger.reclaims.cohort_policy, cohort
            )
            policy, problem = cohort_policy(self.site_policy, overrides, self.interval)
            if problem:
                self.notices.once(
                    f"cohort:{cohort}:{problem}",
                    "Cohort %s's reclaim policy no longer fits the site's (%s): its GPUs"
                    " follow the site's policy until an admin sets it again",
                    cohort,
                    problem,
                )
            policies[cohort] = policy
        return policies

    # -- acting ------------------------------------------------------------------

    async def _may_take(self, gpu: HeldGpu, now: float, fresh_until: float) -> None:
        """Raise _MovedOn unless the GPU may be taken now: its reading is still fresh,
        the server still runs the watched machine holding it, and its user has not
        pressed *Keep* since the reading (the ledger keeps that press over this pass's
        save). Asked right before each step that cannot be undone."""
        if time.monotonic() > fresh_until:
            raise _MovedOn("its reading is older than max_gap: the next pass reads it again")
        await self._still_watched(gpu)
        reclaims = self.composer.ledger.reclaims
        watch = (await self.composer.runner.run(reclaims.watches, [gpu.machine.id])).get(gpu.key)
        if watch is not None and watch.kept_until is not None and now < watch.kept_until:
            raise _MovedOn("its user pressed Keep")

    async def _act(
        self,
        gpu: HeldGpu,
        decision: Decision,
        now: float,
        fresh_until: float,
        holders: tuple[str, ...] | None,
    ) -> Action:
        """Carry out ``decision`` on a GPU with these ``holders`` (None: unknown)."""
        kind = decision.action
        assert kind != "none"
        machine = gpu.machine
        self.log.info(
            "Reclaimer: %s GPU %s of %s/%s (machine %s): %s",
            kind,
            gpu.block_id,
            machine.user_name,
            machine.server_name,
            machine.id,
            decision.why,
        )

        def action(outcome: Outcome, detail: str = "") -> Action:
            return Action(
                kind,
                machine.id,
                machine.user_name,
                machine.server_name,
                gpu.block_id,
                decision.why,
                outcome,
                detail,
            )

        if kind == "warn":
            return action("done")
        if kind == "reclaim" and self.kernels is None:
            self.notices.once(
                "no-kernels",
                "No kernels API (hub URL or token unset): idle GPUs are"
                " warned about but never reclaimed",
            )
            return action("skipped", "no kernels API")
        try:
            await self._may_take(gpu, now, fresh_until)
            shut = 0
            if kind == "reclaim":
                shut = await self._shut_down_kernels(gpu, kernels_holding(holders))
                await self._may_take(gpu, now, fresh_until)  # the shutdown took a while
                await self._let_go(gpu, holders)
            await self.composer.shrink(machine.user_name, machine.server_name, [gpu.block_id])
        except (ComposeFailed, KernelsUnavailable, FabricError, LedgerError) as e:
            self.log.warning(
                "Reclaimer: %s of GPU %s failed, next pass tries again: %s", kind, gpu.block_id, e
            )
            return action("failed", str(e))
        except (ComposeRefused, _MovedOn) as e:
            # The machine moved on (stopped, shrunk by its user, kept): nothing to give back.
            self.log.info("Reclaimer: %s of GPU %s skipped: %s", kind, gpu.block_id, e)
            return action("skipped", str(e))
        return await self._record(gpu, decision, action("done", _kernels_said(kind, shut)))

    async def _still_watched(self, gpu: HeldGpu) -> None:
        """Raise unless the server still runs the watched machine, holding the GPU."""
        machine = gpu.machine
        current = await self.composer.running_machine(machine.user_name, machine.server_name)
        if current.id != machine.id or gpu.block_id not in current.block_ids:
            raise _MovedOn(f"{machine.user_name}/{machine.server_name} moved on from {machine.id}")

    async def _shut_down_kernels(self, gpu: HeldGpu, holding: frozenset[str] | None) -> int:
        """Shut down the server's kernels that hold the GPU: how many went.

        ``holding`` names them where the source names the processes holding it (NVML on
        the notebooks' host): those go, every other kernel stays; a holder that is no
        kernel (a terminal's program) cannot be ended through the API and loses the GPU,
        as its warning said. Where the source names none (DCGM), ``holding`` is None and
        every kernel of the server goes: any may hold a context on it (CUDA_VISIBLE_DEVICES
        names all the machine's GPUs, and some frameworks take a context on each GPU they
        see), and a GPU detached under a live context breaks that kernel at its next CUDA
        call instead of ending it cleanly. Busy kernels too: the GPU did no work for
        reclaim_after, so their work is not on it (one that may be using a GPU the server
        keeps was ruled out by :func:`spare_other_gpus`).
        """
        assert self.kernels is not None
        machine = gpu.machine
        user, server = machine.user_name, machine.server_name
        running = await self.kernels.kernels(user, server)
        going = [k for k in running if holding is None or k.id in holding]
        for kernel in going:
            await self.kernels.shut_down(user, server, kernel.id)
        self.log.info(
            "Reclaimer: shut down %d of %d kernel(s) of %s/%s to take GPU %s%s",
            len(going),
            len(running),
            user,
            server,
            gpu.block_id,
            "" if holding is None else f" (holding it: {sorted(holding) or 'none'})",
        )
        return len(going)

    async def _let_go(self, gpu: HeldGpu, holders: tuple[str, ...] | None) -> None:
        """Raise _MovedOn unless, read again after its kernels were shut down, the GPU is
        held by nothing but the programs the warning said would lose it: a kernel that
        took it since the pass's reading, or a worker that outlived its kernel, is left
        to the next pass rather than broken by the detach. Where the holders are unknown
        (DCGM) this cannot be told; every kernel of the server was shut down."""
        if holders is None:
            return
        reading = await self._read(gpu.machine.host_id or "")
        activity = self._activity(reading, gpu)
        if activity is None or activity.holders is None:
            raise _MovedOn("who holds it could not be read again: the next pass looks again")
        losing = {h for h in holders if kernel_in(h) is None}
        left = sorted({h.key for h in activity.holders} - losing)
        if left:
            raise _MovedOn(f"still held by {', '.join(left)}: the next pass looks again")

    async def _record(self, gpu: HeldGpu, decision: Decision, done: Action) -> Action:
        """The fabric confirmed the detach: record the give-back (and drop the watch)."""
        try:
            await self.composer.runner.run(
                self.composer.ledger.reclaims.gave_back, gpu.machine.id, gpu.block_id, decision, BY
            )
        except Exception as e:
            # The GPU is back in the pool already (the shrink freed it in the ledger):
            # only the record of why is missing. The pass goes on with the other GPUs.
            self.log.exception("Reclaimer: GPU %s given back but not recorded", gpu.block_id)
            return replace(done, detail=f"not recorded: {e}")
        return done


def _activity(reading: ActivityReading | None, gpu: HeldGpu) -> GpuActivity | None:
    """The GPU's activity in the reading; None (unknown) when the host or the GPU was not read."""
    if reading is None or gpu.uuid is None:
        return None
    return reading.gpus.get(gpu.uuid)


def _kernels_said(kind: str, shut: int) -> str:
    return f"{shut} kernel(s) shut down" if kind == "reclaim" else ""
