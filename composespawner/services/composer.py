"""The use cases of a composed machine: compose one, release one.

This is the service layer between the JupyterHub glue (``spawner.py``) and the
adapters (ledger, fabric). It owns the order of operations that keeps the
invariants of ARCHITECTURE.md:

* the claim (quota check + compare-and-set of every device) happens in one
  ledger transaction *before* anything on the fabric changes;
* compose is all-or-nothing: on any failure, cancellation included, what was
  attached is detached, the claim released, and the original error re-raised;
* release only frees a device in the ledger once the fabric confirmed the
  detach; while the fabric cannot be reached the machine stays ``stopping``
  with its devices held, and a background task keeps trying.

What it leans on, each in a module of its own: :mod:`.pool` (cached reads of
the fabric and the ledger, offers), :mod:`.reservations` (this process's claims
in flight), :mod:`.releases` (releases retried in the background),
:class:`~composespawner.ledger.LedgerRunner` (the one way to call the ledger)
and :mod:`.failures` (refusals, failures and what users read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import CompositionTag
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.placement import DeviceAsk, NoFit, Plan, Pool, place
from composespawner.domain.quotas import NO_SITE_QUOTA, QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import Fabric, FabricError
from composespawner.ledger import (
    DevicesTaken,
    Ledger,
    LedgerError,
    LedgerRunner,
    Machine,
    QuotaExceeded,
    ReservedForCohort,
    ServerBusy,
    utcnow,
)
from composespawner.ledger.limits import check_ask
from composespawner.services.admission import Admission, ClaimTerms, admission
from composespawner.services.failures import (
    ComposeFailed,
    ComposeRefused,
    refusal,
    why_busy,
    why_claim_failed,
    why_compose_failed,
)
from composespawner.services.metrics import measure_compose
from composespawner.services.pool import Offer, PoolView
from composespawner.services.releases import BackgroundReleases
from composespawner.services.reservations import Reservations

Progress = Callable[[str], None]

# A claim can lose a race for the devices placement picked (someone claimed
# them between our snapshot and our transaction): place again on fresh data.
CLAIM_ATTEMPTS = 3

__all__ = ["ComposeFailed", "ComposeRefused", "ComposedMachine", "Composer"]


class Composer:
    """Composes and releases machines for every spawner of one hub."""

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
        )
        self.background = BackgroundReleases(
            self._release_for_retry, retry_max=release_retry_max, log=self.log
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
        return replace(offer, stacks=allowed.stacks)

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

    @measure_compose
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
            check_ask(user, allowed.quota, request.gpu_model, request.gpu_count)
        except QuotaExceeded as e:
            raise refusal(e) from e
        ask = self._ask(request)
        terms = allowed.terms(groups, request.gpu_model, self.catalog)
        machine_id = await self._request_machine(user, server, request)
        claim = self._claim(machine_id, user, groups, ask, terms, progress)
        plan = await self._claim_or_end(machine_id, claim)
        tag = CompositionTag(hub=self.hub_id, machine=machine_id, owner=f"{user}/{server}")
        await self._attach(machine_id, plan, tag, progress)
        await self._record_composed(machine_id, then)
        self.log.info(
            "Composed machine %s for %s/%s on %s in %s: %s",
            machine_id,
            user,
            server,
            plan.host.system_id,
            plan.zone,
            ", ".join(plan.block_ids),
        )
        return ComposedMachine(
            machine_id=machine_id,
            host=plan.host.system_id,
            zone=plan.zone,
            gpus=plan.gpus,
            nic=plan.nic,
            drives=plan.drives,
        )

    def _ask(self, request: MachineRequest) -> DeviceAsk:
        model = self.catalog.gpu_model(request.gpu_model)
        network = self.catalog.network(request.network)
        assert model is not None, "request was validated"
        assert network is not None, "request was validated"
        return DeviceAsk(
            gpu_models=model.fabric_models,
            gpu_count=request.gpu_count,
            label=model.label,
            nic_speed_gbps=network.speed_gbps,
            scratch_gb=request.scratch_gb,
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

    async def _claim_or_end(self, machine_id: str, claim: Awaitable[Plan]) -> Plan:
        """The claim's plan; on any failure but a refusal the requested machine ends."""
        try:
            return await claim
        except ComposeRefused:
            raise
        except LedgerError as e:
            # The ledger said no (devices given to another group, the machine ended
            # underneath): nothing is attached yet, only the request to end.
            await asyncio.shield(self._undo(machine_id, e.user_message))
            raise refusal(e) from e
        except BaseException as e:
            # The fabric failed (or the start was cancelled) before anything was
            # attached: the machine must still end, or the server stays busy forever.
            await asyncio.shield(self._undo(machine_id, why_claim_failed(e)))
            if isinstance(e, FabricError):
                raise ComposeFailed(why_claim_failed(e)) from e
            raise

    async def _claim(
        self,
        machine_id: str,
        user: str,
        groups: frozenset[str],
        ask: DeviceAsk,
        terms: ClaimTerms,
        progress: Progress,
    ) -> Plan:
        """Place and claim, placing again on fresh data while claims lose races."""
        for attempt in range(CLAIM_ATTEMPTS):
            plan = await self._place(user, groups, ask, terms, fresh=attempt > 0)
            if isinstance(plan, NoFit):
                why = _with_reservations(plan.reason, ask, terms)
                await self._fail_unclaimed(machine_id, why)
                raise ComposeRefused(why, status=409, reason="no-fit")
            progress(f"claiming {ask.gpu_count} × {ask.label} in {plan.zone}")
            if await self._take(machine_id, plan, groups, terms):
                return plan
            self.log.info("Claim for %s lost a race (attempt %d)", machine_id, attempt + 1)
        why = "The devices you chose were taken by other users while we claimed them. Try again."
        await self._fail_unclaimed(machine_id, why)
        raise ComposeRefused(why, status=409, reason="contention")

    async def _place(
        self, user: str, groups: frozenset[str], ask: DeviceAsk, terms: ClaimTerms, *, fresh: bool
    ) -> Plan | NoFit:
        async def pool(fresh: bool) -> Pool:
            return await self.pool.claimable(
                user,
                groups,
                fresh=fresh,
                holdback=terms.holdback,
                registrations=terms.registrations,
            )

        plan = place(await pool(fresh), ask)
        if isinstance(plan, NoFit) and not fresh:
            # Our snapshot may predate another hub's release: look again before
            # telling the user nothing fits.
            plan = place(await pool(True), ask)
        if not isinstance(plan, NoFit):
            # No await between the read and this: no other spawn of ours interleaves.
            self.reservations.hold((plan.host.block_id, *plan.block_ids))
        return plan

    async def _take(
        self, machine_id: str, plan: Plan, groups: frozenset[str], terms: ClaimTerms
    ) -> bool:
        """Claim the plan's blocks in the ledger; False when another claim took one first."""
        blocks = (plan.host.block_id, *plan.block_ids)
        try:
            await self.runner.run(
                self.ledger.claim,
                machine_id,
                host_id=plan.host.system_id,
                zone=plan.zone,
                block_ids=blocks,
                quota=terms.quota,
                groups=groups,
                keep_free=terms.keep_free,
                cohort=terms.cohort,
            )
        except DevicesTaken:
            self.reservations.drop(blocks)
            return False
        except (QuotaExceeded, ReservedForCohort) as e:
            self.reservations.drop(blocks)
            await self._fail_unclaimed(machine_id, e.user_message)
            raise refusal(e) from e
        except BaseException:
            self.reservations.drop(blocks)
            raise
        self.reservations.commit(blocks)
        return True

    async def _attach(
        self, machine_id: str, plan: Plan, tag: CompositionTag, progress: Progress
    ) -> None:
        host = plan.host.system_id
        devices = (*plan.gpus, *([plan.nic] if plan.nic else []), *plan.drives)
        try:
            await self.fabric.compose(host, devices, tag, progress)
        except BaseException as e:
            self.log.warning("Compose of %s on %s failed (%r); undoing", machine_id, host, e)
            await asyncio.shield(self._undo(machine_id, why_compose_failed(e)))
            if isinstance(e, FabricError):
                raise ComposeFailed(why_compose_failed(e)) from e
            raise

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
            await self._fail_unclaimed(live.id, why_compose_failed(asyncio.CancelledError()))

    async def _fail_unclaimed(self, machine_id: str, reason: str) -> None:
        await self.runner.run(self.ledger.transition, machine_id, "failed", reason, failure=reason)

    async def _undo(self, machine_id: str, reason: str) -> None:
        try:
            await self.release(machine_id, reason=reason, failed=True)
        except FabricError:
            self.log.exception("Undo of %s failed; retrying in the background", machine_id)
            self.release_soon(machine_id, reason=reason, failed=True)

    # -- releasing -------------------------------------------------------

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
            self.ledger.release,
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
        devices = [b for b in machine.block_ids if b != (known.block_id if known else None)]
        if not await self.fabric.decompose(host, devices, self._tag(machine.id, machine)):
            # We mark a host before attaching anything, so a host without our mark
            # holds nothing we attached; what is on it belongs to someone else.
            self.log.info("Host %s has no mark of %s: nothing of ours on it", host, machine.id)

    def _tag(self, machine_id: str, machine: Machine | None = None) -> CompositionTag:
        owner = f"{machine.user_name}/{machine.server_name}" if machine else ""
        return CompositionTag(hub=self.hub_id, machine=machine_id, owner=owner)

    async def release_in_background(
        self, machine_id: str, *, reason: str, failed: bool = False
    ) -> None:
        """Mark the machine ``stopping`` now; take it apart and free it in the background.

        For callers that must not wait on the fabric (a stop). The devices stay
        held in the ledger until the fabric confirms, as with release(); if this
        process dies first, the reconciler finishes what is ``stopping``.
        """
        if await self._mark_stopping(machine_id, reason) is not None:
            self.release_soon(machine_id, reason=reason, failed=failed)

    async def _mark_stopping(self, machine_id: str, reason: str) -> Machine | None:
        """The machine, now ``stopping``; None when it holds nothing to give back."""
        machine = await self.runner.run(self.ledger.machine, machine_id)
        if machine is None or machine.state in ("released", "failed"):
            return None
        if machine.state == "requested":
            await self._fail_unclaimed(machine_id, reason)
            return None
        if machine.state != "stopping":
            # What it holds as it stops: a grow that committed a moment ago included.
            machine = await self.runner.run(self.ledger.transition, machine_id, "stopping", reason)
        return machine

    def release_soon(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Keep trying to release in the background until the fabric confirms."""
        self.background.start(machine_id, reason=reason, failed=failed)

    async def _release_for_retry(self, machine_id: str, reason: str, failed: bool) -> None:
        await self.release(machine_id, reason=reason, failed=failed)

    async def wait_released(self, machine_id: str, *, within: float | None) -> bool:
        """Whether this process's background release of the machine ends within ``within`` s."""
        return await self.background.wait(machine_id, within=within)

    async def _released(self, machine_id: str) -> bool:
        return await self.wait_released(machine_id, within=self.fabric_wait)

    # -- repairs (the reconciler's) -----------------------------------------

    async def clear_host(self, host: str, blocks: Sequence[str], machine_id: str) -> None:
        """Take apart what this hub composed on a host for a machine the ledger has ended.

        For the reconciler: nothing in the ledger holds these devices any more.
        """
        await self.fabric.decompose(host, blocks, self._tag(machine_id))
        self.pool.forget()

    async def reattach(self, host: str, blocks: Sequence[str]) -> None:
        """Attach again devices the ledger holds for this host but the fabric lost."""
        for block in blocks:
            await self.fabric.attach(host, block)
        self.pool.forget()

    async def close(self) -> None:
        self.background.cancel_all()
        await self.fabric.close()
        await self.runner.run(self.ledger.close)


def _with_reservations(reason: str, ask: DeviceAsk, terms: ClaimTerms) -> str:
    """A no-fit reason, and why some GPUs were not offered: cohorts' sessions keep them."""
    kept = [k for k in terms.keep_free if k.models & ask.gpu_models]
    notes = [
        f"{k.label} GPUs are kept for cohort {k.cohort}'s session until {k.until}." for k in kept
    ]
    return " ".join([reason, *notes])
