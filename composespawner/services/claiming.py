"""One claim-and-attach, shared by a compose (a new machine) and a grow (a running one).

The order keeps the invariants docs/architecture.md numbers: placement picks
devices from a read of the pool; the ledger claims them in one transaction that
compares-and-sets every device and checks the quota (1, 3); only then does the
fabric attach. All or nothing (4): if anything fails or is cancelled after the
claim began, what was attached is detached, the claim given back, and the
original error re-raised (or what the user reads of it).

What differs between a compose and a grow (how devices are placed, claimed,
attached and given back, and what the user reads) is a :class:`ClaimStep`;
:func:`claim_and_attach` is the order both follow.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn, Protocol, TypeVar

from composespawner.domain.placement import NoFit
from composespawner.services.failures import ComposeRefused

# A claim can lose a race for the devices placement picked (someone claimed
# them between our read and our transaction): place again on fresh data.
CLAIM_ATTEMPTS = 3

PlanT = TypeVar("PlanT")


class ClaimStep(Protocol[PlanT]):
    """What one claim-and-attach places, claims, attaches and undoes."""

    # What the user reads when every attempt lost its race (its reason: "contention").
    contention: str

    async def place(self, *, fresh: bool) -> PlanT | NoFit:
        """Where the ask fits now; ``fresh``: on data read again, not the cached pool."""

    async def take(self, plan: PlanT) -> bool:
        """Claim the plan in one ledger transaction; False when another claim took a device
        first. A refusal (quota, cohorts) raises ComposeRefused, having ended what it must."""

    async def refused(self, why: str, reason: str) -> ComposeRefused:
        """Nothing was claimed: end what the claim began; the refusal to raise."""

    async def attach(self, plan: PlanT) -> None:
        """Attach the claimed devices on the fabric."""

    async def undo(self, plan: PlanT | None, error: BaseException) -> None:
        """Detach what was attached and give the claim back (``plan`` None: none was made)."""

    def failed(self, error: BaseException, *, attaching: bool) -> BaseException:
        """What the caller hears of ``error`` once undone: the error itself to re-raise it."""


async def claim_and_attach(step: ClaimStep[PlanT]) -> PlanT:
    """Place and claim, placing again on fresh data while claims lose races; then attach.

    All or nothing: on any failure, cancellation included, the step undoes what
    was done (shielded, so a cancelled start still ends) before the error goes on.
    """
    try:
        plan = await _claim(step)
    except ComposeRefused:
        raise  # the step ended what the claim began before refusing
    except BaseException as e:
        await _undo(step, None, e)
    try:
        await step.attach(plan)
    except BaseException as e:
        await _undo(step, plan, e)
    return plan


async def _claim(step: ClaimStep[PlanT]) -> PlanT:
    for attempt in range(CLAIM_ATTEMPTS):
        plan = await step.place(fresh=attempt > 0)
        if isinstance(plan, NoFit):
            raise await step.refused(plan.reason, "no-fit")
        if await step.take(plan):
            return plan
    raise await step.refused(step.contention, "contention")


async def _undo(step: ClaimStep[PlanT], plan: PlanT | None, error: BaseException) -> NoReturn:
    await asyncio.shield(step.undo(plan, error))
    heard = step.failed(error, attaching=plan is not None)
    if heard is error:
        raise error
    raise heard from error
