"""The use cases of a composed machine: compose one, grow or shrink it, release it.

This is the service layer between the JupyterHub glue (``spawners/``, the
portal) and the adapters (ledger, fabric): every change to a machine goes
through the :class:`Composer` (the reconciler, which audits the ledger and the
pool themselves, reads them directly). It owns the order of operations that
keeps the invariants of docs/architecture.md:

* the claim (quota check + compare-and-set of every device) happens in one
  ledger transaction *before* anything on the fabric changes;
* compose (and grow) is all-or-nothing: on any failure, cancellation included,
  what was attached is detached, the claim released, and the original error
  re-raised;
* release only frees a device in the ledger once the fabric confirmed the
  detach; while the fabric cannot be reached the machine stays ``stopping``
  with its devices held, and a background task keeps trying.

What it leans on, each in a module of its own: :mod:`.claiming` (the
claim-and-attach a compose and a grow share), :mod:`.resize` (growing and
shrinking), :mod:`.pool` (cached reads of the fabric and the ledger, offers),
:mod:`.reservations` (this process's claims in flight), :mod:`.releases`
(releases retried in the background),
:class:`~composespawner.ledger.LedgerRunner` (the one way to call the ledger)
and :mod:`.failures` (refusals, failures and what users read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import CompositionTag, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.placement import DeviceAsk, NoFit, Plan, Pool, place
from composespawner.domain.quotas import NO_SITE_QUOTA, QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import Fabric, FabricError
from composespawner.ledger import (
    DevicesTaken,
    HostRecord,
    Ledger,
    LedgerError,
    LedgerRunner,
    Machine,
    QuotaExceeded,
    ReservedForCohort,
    RoomClaim,
    ServerBusy,
    ShareClaim,
    utcnow,
)
from composespawner.ledger.limits import check_ask
from composespawner.services.admission import Admission, ClaimTerms, admission
from composespawner.services.claiming import claim_and_attach
from composespawner.services.failures import (
    ComposeFailed,
    ComposeRefused,
    refusal,
    why_busy,
    why_claim_failed,
    why_compose_failed,
)
from composespawner.services.pool import Offer, PoolReadout, PoolView
from composespawner.services.releases import Releaser, fail_unclaimed
from composespawner.services.reservations import HeldRoom, HeldShare, Reservations
from composespawner.services.resize import Resizer

Progress = Callable[[str], None]

__all__ = ["ComposeFailed", "ComposeRefused", "ComposedMachine", "Composer"]


class Composer:
    """Composes, resizes and releases machines for every spawner of one hub.

    It measures nothing itself: the composition root (``settings.build_composer``)
    builds a ``MeasuredComposer`` and a ``MeasuredFabric`` for that, so one built
    directly, as unit tests do, counts nothing.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        fabric: Fabric,
        catalog: Catalog,
        hub_id: str,
        snapshot_ttl: float = 3.0,
        release_retry_max: float = 60.0,
        fabric_wait: float | None = None,
        site_quota: QuotaRule = NO_SITE_QUOTA,
        timezone: tzinfo = UTC,
        clock: Callable[[], datetime] = utcnow,
        log: logging.Logger | None = None,
    ) -> None:
        """``fabric_wait``: seconds a spawn waits for the fabric's inventory, or for
        its server's last machine to be given back, before it is refused (None: as
        long as the fabric client's own timeouts take). ``site_quota``: the site
        default from the config, under what the ledger's own site rule sets.
        ``timezone``: where cohort session times are told; ``clock``: now, for them."""
        self.ledger = ledger
        self.site_quota = site_quota
        self.timezone = timezone
        self.clock = clock
        self.fabric = fabric
        self.catalog = catalog
        self.hub_id = hub_id
        self.log = log or logging.getLogger(__name__)
        self.runner = LedgerRunner(ledger)
        self.reservations = Reservations()
        self.pool = PoolView(
            runner=self.runner,
            fabric=fabric,
            catalog=catalog,
            reservations=self.reservations,
            snapshot_ttl=snapshot_ttl,
            fabric_wait=fabric_wait,
            log=self.log,
            hub_id=hub_id,
        )
        self._releaser = Releaser(
            runner=self.runner,
            fabric=fabric,
            pool=self.pool,
            hub_id=hub_id,
            retry_max=release_retry_max,
            log=self.log,
        )
        self._resizer = Resizer(
            runner=self.runner,
            fabric=fabric,
            pool=self.pool,
            catalog=catalog,
            admit=self.admission_for,
            log=self.log,
        )

    @property
    def fabric_wait(self) -> float | None:
        return self.pool.fabric_wait

    @fabric_wait.setter
    def fabric_wait(self, seconds: float | None) -> None:
        self.pool.fabric_wait = seconds

    async def admission_for(self, user: str, groups: frozenset[str]) -> Admission:
        """The user's quota, and the cohort reservations in force now (one ledger read)."""
        policy = await self.runner.run(
            self.ledger.policy.spawn_policy, user, groups, self.site_quota
        )
        return admission(policy, self.catalog, self.clock().astimezone(self.timezone))

    async def offer(self, user: str, groups: frozenset[str], *, within: float | None) -> Offer:
        """What the spawn form shows ``user``, under their quota and the reservations in force."""
        allowed = await self.admission_for(user, groups)
        offer = await self.pool.offer(
            user,
            groups,
            quota=allowed.quota,
            holdback=allowed.fabric_holdback(groups, self.catalog),
            notes=allowed.notes(groups),
            registrations=allowed.registrations,
            within=within,
        )
        sizes = tuple(s for s in self.catalog.sizes if allowed.sizes.allows(s.id))
        return replace(offer, stacks=allowed.stacks, sizes=sizes)

    def readout(self) -> PoolReadout:
        """The pool as this composer knows it, for a metrics scrape: no wait on the fabric."""
        return self.pool.readout(releases_pending=self._releaser.pending)

    async def record(
        self, machine_id: str, to: str, message: str, manifest: dict[str, Any] | None = None
    ) -> None:
        """Record a non-terminal lifecycle step the spawner took (``running``), and with it
        the run manifest of what the server runs on.

        Raises ComposeRefused if the machine was moved on underneath (an admin, the reconciler).
        """
        try:
            await self.runner.run(
                self.ledger.transition, machine_id, to, message, manifest=manifest
            )
        except LedgerError as e:
            raise refusal(e) from e

    # -- composing -------------------------------------------------------

    async def compose(
        self,
        *,
        user: str,
        groups: frozenset[str],
        server: str,
        request: MachineRequest,
        progress: Progress,
        then: tuple[str, str] | None = None,
        admitted: Admission | None = None,
    ) -> ComposedMachine:
        """Claim, then attach; all-or-nothing. Raises ComposeRefused or ComposeFailed.

        The user's effective quota is read first: what one server may ask for is
        checked at once, what the user holds in the claim's transaction.
        ``then``: a next lifecycle step (state, message) the caller takes at once,
        recorded in the same ledger transaction as ``composed``. ``admitted``: the
        user's admission, when the caller has just read it.
        """
        allowed = admitted or await self.admission_for(user, groups)
        try:
            check_ask(user, allowed.quota, request.gpu_model, request.gpus)
        except QuotaExceeded as e:
            raise refusal(e) from e
        ask = _device_ask(self.catalog, request)
        terms = allowed.terms(groups, request.gpu_model, self.catalog)
        machine_id = await self._request_machine(user, server, request)
        plan = await claim_and_attach(
            MachineClaim(
                self.runner,
                self.pool,
                self.reservations,
                self.fabric,
                self._undo,
                self.log,
                machine_id=machine_id,
                user=user,
                groups=groups,
                ask=ask,
                terms=terms,
                tag=CompositionTag(hub=self.hub_id, machine=machine_id, owner=f"{user}/{server}"),
                progress=progress,
            )
        )
        await self._record_composed(machine_id, then)
        self.log.info(
            "Composed machine %s for %s/%s on %s in %s (%d cores, %d GiB): %s",
            machine_id,
            user,
            server,
            plan.host.system_id,
            plan.zone,
            plan.need.cores,
            plan.need.memory_gib,
            ", ".join(plan.block_ids) or "no devices",
        )
        return ComposedMachine(
            machine_id=machine_id,
            host=plan.host.system_id,
            zone=plan.zone,
            gpus=plan.gpus,
            nic=plan.nic,
            drives=plan.drives,
            share=plan.share,
            gpu_share=plan.gpu_share,
        )

    async def _request_machine(self, user: str, server: str, request: MachineRequest) -> str:
        """A new ``requested`` machine for the server; its id.

        A server stopped a moment ago may still be giving its last machine back
        (stop() leaves that to the background): wait for it a little.
        """
        try:
            for attempt in range(2):
                try:
                    return await self.runner.run(
                        self.ledger.request_machine, user, server, request.to_options()
                    )
                except ServerBusy as e:
                    stopping = e.state == "stopping" and e.machine_id is not None
                    if attempt or not stopping or not await self._released(e.machine_id or ""):
                        raise ComposeRefused(why_busy(e), status=409, reason="server-busy") from e
        except LedgerError as e:
            raise refusal(e) from e
        except asyncio.CancelledError:
            await asyncio.shield(self._end_cancelled_request(user, server))
            raise
        raise AssertionError("the second attempt returns or raises")

    async def _record_composed(self, machine_id: str, then: tuple[str, str] | None) -> None:
        steps = [("composed", "all devices attached"), *([then] if then else [])]
        try:
            await self.runner.run(self.ledger.advance, machine_id, *steps)
        except LedgerError as e:
            self.log.warning("Machine %s moved on during its compose (%s); undoing", machine_id, e)
            await asyncio.shield(self._undo(machine_id, e.user_message))
            raise refusal(e) from e

    async def _end_cancelled_request(self, user: str, server: str) -> None:
        live = await self.runner.run(self.ledger.live_machine, user, server)
        if live is not None and live.state == "requested":
            await fail_unclaimed(self.runner, live.id, why_compose_failed(asyncio.CancelledError()))

    async def _undo(self, machine_id: str, reason: str) -> None:
        try:
            await self.release(machine_id, reason=reason, failed=True)
        except FabricError:
            self.log.exception("Undo of %s failed; retrying in the background", machine_id)
            self.release_soon(machine_id, reason=reason, failed=True)

    # -- growing and shrinking a running machine (see resize) ---------------

    async def running_machine(self, user: str, server: str) -> Machine:
        """The user's server's machine; ComposeRefused unless it runs."""
        return await self._resizer.running_machine(user, server)

    async def grow(self, user: str, groups: frozenset[str], server: str, count: int) -> Machine:
        """Add ``count`` GPUs to the server's running machine; the machine as it is now."""
        return await self._resizer.grow(user, groups, server, count)

    async def shrink(self, user: str, server: str, gpu_ids: Sequence[str]) -> Machine:
        """Give back ``gpu_ids`` of the server's running machine; the machine as it is now."""
        return await self._resizer.shrink(user, server, gpu_ids)

    async def composed(self, machine: Machine) -> ComposedMachine:
        """The machine as its notebook's environment describes it (see machine_env)."""
        return await self._resizer.composed(machine)

    # -- releasing (see releases) -------------------------------------------

    async def release(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Take the machine apart on the fabric, then free it in the ledger.

        Idempotent. Raises FabricError if the fabric did not confirm; the
        devices then stay held in the ledger (unknown is not dead).
        """
        await self._releaser.release(machine_id, reason=reason, failed=failed)

    async def release_in_background(
        self, machine_id: str, *, reason: str, failed: bool = False
    ) -> None:
        """Mark the machine ``stopping`` now; take it apart and free it in the background.

        For callers that must not wait on the fabric (a stop). The devices stay
        held in the ledger until the fabric confirms, as with release(); if this
        process dies first, the reconciler finishes what is ``stopping``.
        """
        await self._releaser.release_in_background(machine_id, reason=reason, failed=failed)

    def release_soon(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Keep trying to release in the background until the fabric confirms."""
        self._releaser.release_soon(machine_id, reason=reason, failed=failed)

    async def wait_released(self, machine_id: str, *, within: float | None) -> bool:
        """Whether this process's background release of the machine ends within ``within`` s."""
        return await self._releaser.wait(machine_id, within=within)

    async def _released(self, machine_id: str) -> bool:
        return await self.wait_released(machine_id, within=self.fabric_wait)

    # -- repairs (the reconciler's) -----------------------------------------

    async def clear_host(self, host: str, blocks: Sequence[str], machine_id: str) -> None:
        """Take apart what this hub composed on a host for a machine the ledger has ended.

        For the reconciler: nothing in the ledger holds these devices any more.
        """
        await self._releaser.clear_host(host, blocks, machine_id)

    async def reattach(self, host: str, blocks: Sequence[str]) -> None:
        """Attach again devices the ledger holds for this host but the fabric lost."""
        for block in blocks:
            await self.fabric.attach(host, block)
        self.pool.forget()

    async def close(self) -> None:
        self._releaser.cancel_all()
        await self.fabric.close()
        await self.runner.run(self.ledger.close)


@dataclass
class MachineClaim:
    """A compose's claim and attach (see claiming): a new machine, placed whole on one host.

    Until the claim commits, the machine is ``requested``: a refusal fails it, so
    the server is not left busy; after, an undo releases it (see Composer.release).
    """

    runner: LedgerRunner
    pool: PoolView
    reservations: Reservations
    fabric: Fabric
    end: Callable[[str, str], Awaitable[None]]  # release a machine (id, reason) as failed
    log: logging.Logger
    machine_id: str
    user: str
    groups: frozenset[str]
    ask: DeviceAsk
    terms: ClaimTerms
    tag: CompositionTag
    progress: Progress
    contention: str = (
        "The devices you chose were taken by other users while we claimed them. Try again."
    )

    async def place(self, *, fresh: bool) -> Plan | NoFit:
        plan = place(await self._pool(fresh), self.ask)
        if isinstance(plan, NoFit) and not fresh:
            # Our snapshot may predate another hub's release: look again before
            # telling the user nothing fits.
            plan = place(await self._pool(True), self.ask)
        if isinstance(plan, NoFit):
            return NoFit(_with_reservations(plan.reason, self.ask, self.terms))
        # No await between the read and this: no other spawn of ours interleaves.
        self.reservations.hold(_reserved_blocks(plan), self._room(plan), _share_slot(plan))
        return plan

    def _room(self, plan: Plan) -> HeldRoom | None:
        """What the plan takes of a shared host (None: it holds its host's block instead)."""
        if not plan.host.shareable:
            return None
        return HeldRoom(self.machine_id, plan.host.system_id, plan.need)

    async def _pool(self, fresh: bool) -> Pool:
        return await self.pool.claimable(
            self.user,
            self.groups,
            fresh=fresh,
            holdback=self.terms.holdback,
            registrations=self.terms.registrations,
        )

    async def take(self, plan: Plan) -> bool:
        """Claim the plan's blocks (and its room on the host) in the ledger; False when
        another claim took one first."""
        self.progress(f"claiming {_gpus_asked(self.ask)} in {plan.zone} ({self.ask.size_label})")
        blocks, room, slot = _reserved_blocks(plan), self._room(plan), _share_slot(plan)
        reservations = self.reservations
        try:
            await self.runner.run(
                self.runner.ledger.claim,
                self.machine_id,
                host_id=plan.host.system_id,
                zone=plan.zone,
                block_ids=_claimed_blocks(plan),
                quota=self.terms.quota,
                groups=self.groups,
                keep_free=self.terms.keep_free,
                cohort=self.terms.cohort,
                room=_room_claim(plan) if room else None,
                share=_share_claim(plan),
            )
        except DevicesTaken:
            reservations.drop(blocks, room, slot)
            self.log.info("Claim for %s lost a race", self.machine_id)
            return False
        except (QuotaExceeded, ReservedForCohort) as e:
            reservations.drop(blocks, room, slot)
            await fail_unclaimed(self.runner, self.machine_id, e.user_message)
            raise refusal(e) from e
        except BaseException:
            reservations.drop(blocks, room, slot)
            raise
        reservations.commit(blocks, room, slot)
        return True

    async def refused(self, why: str, reason: str) -> ComposeRefused:
        await fail_unclaimed(self.runner, self.machine_id, why)
        return ComposeRefused(why, status=409, reason=reason)

    async def attach(self, plan: Plan) -> None:
        # A share's GPU too, when it joins one split already: attaching is idempotent, and
        # the notebook must not start before the GPU is there (its opener may be attaching).
        devices = (*plan.gpus, *([plan.nic] if plan.nic else []), *plan.drives)
        await self.fabric.compose(plan.host.system_id, devices, self.tag, self.progress)

    async def undo(self, plan: Plan | None, error: BaseException) -> None:
        if isinstance(error, LedgerError):
            # The ledger said no (devices given to another group, the machine ended
            # underneath): nothing is attached yet, only the request to end.
            reason = error.user_message
        elif plan is None:
            # The fabric failed (or the start was cancelled) before anything was
            # attached: the machine must still end, or the server stays busy forever.
            reason = why_claim_failed(error)
        else:
            host = plan.host.system_id
            self.log.warning(
                "Compose of %s on %s failed (%r); undoing", self.machine_id, host, error
            )
            reason = why_compose_failed(error)
        await self.end(self.machine_id, reason)

    def failed(self, error: BaseException, *, attaching: bool) -> BaseException:
        if isinstance(error, LedgerError):
            return refusal(error)
        if isinstance(error, FabricError):
            why = why_compose_failed(error) if attaching else why_claim_failed(error)
            return ComposeFailed(why)
        return error


def _device_ask(catalog: Catalog, request: MachineRequest) -> DeviceAsk:
    """What placement looks for: the request in the fabric's terms."""
    model = catalog.gpu_model(request.gpu_model) if request.gpu_model else None
    network = catalog.network(request.network)
    assert network is not None, "request was validated"
    size = request.share_of(catalog)
    return DeviceAsk(
        gpu_models=model.fabric_models if model else frozenset(),
        gpu_count=request.gpu_count,
        label=model.label if model else "GPU",
        nic_speed_gbps=network.speed_gbps,
        scratch_gb=request.scratch_gb,
        share=None if size.whole_host else Share(size.cores, size.memory_gib),
        size_label=size.label,
        gpu_share=request.gpu_share,
    )


def _gpus_asked(ask: DeviceAsk) -> str:
    if ask.gpu_share > 1:
        return f"1/{ask.gpu_share} of a {ask.label}"
    return f"{ask.gpu_count} × {ask.label}" if ask.gpu_count else "no GPU"


def _claimed_blocks(plan: Plan) -> tuple[str, ...]:
    """The blocks a claim takes whole: the devices, and a host that is not shared itself
    (a share's GPU is claimed as a share, see _share_claim)."""
    own = () if plan.host.shareable else (plan.host.block_id,)
    shared = _share_claim(plan)
    return (*own, *(b for b in plan.block_ids if shared is None or b != shared.block_id))


def _reserved_blocks(plan: Plan) -> tuple[str, ...]:
    """What this process's other placements must not take whole meanwhile: every block
    the plan names, a share's GPU included (it is split, or about to be)."""
    own = () if plan.host.shareable else (plan.host.block_id,)
    return (*own, *plan.block_ids)


def _share_claim(plan: Plan) -> ShareClaim | None:
    if plan.gpu_share <= 1:
        return None
    return ShareClaim(plan.gpus[0].block_id, plan.gpu_share, plan.host.system_id)


def _share_slot(plan: Plan) -> HeldShare | None:
    """A share claim of this process, for placement to count before the ledger shows it."""
    claim = _share_claim(plan)
    if claim is None:
        return None
    return HeldShare(claim.block_id, claim.host_id, claim.size)


def _room_claim(plan: Plan) -> RoomClaim:
    host = HostRecord(plan.host.system_id, plan.host.block_id, plan.capacity)
    return RoomClaim(host, plan.need.cores, plan.need.memory_gib)


def _with_reservations(reason: str, ask: DeviceAsk, terms: ClaimTerms) -> str:
    """A no-fit reason, and why some GPUs were not offered: cohorts' sessions keep them."""
    kept = [k for k in terms.keep_free if k.models & ask.gpu_models]
    notes = [
        f"{k.label} GPUs are kept for cohort {k.cohort}'s session until {k.until}." for k in kept
    ]
    return " ".join([reason, *notes])
