"""What one user's spawn may take right now: their quota, and the cohort reservations in force.

Read once per form and per spawn (one ledger read, :meth:`Policy.spawn_policy`)
and turned here, purely, into what placement must leave alone, what the claim's
transaction must check, and what the form says about it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from composespawner.domain.catalog import Catalog, GpuModel
from composespawner.domain.cohorts import (
    END_OF_DAY,
    Reservation,
    SizeChoice,
    StackChoice,
    active_reservations,
    holdback,
    size_choice,
    stack_choice,
)
from composespawner.domain.colocation import Registration
from composespawner.domain.quotas import NO_QUOTA, Quota
from composespawner.domain.request import share_word
from composespawner.ledger import KeepFree, SpawnPolicy


@dataclass(frozen=True)
class ClaimTerms:
    """What one claim must respect besides the devices it names."""

    quota: Quota = NO_QUOTA
    keep_free: tuple[KeepFree, ...] = ()  # checked in the claim's transaction
    cohort: str | None = None  # the reservation a member's claim counts against
    registrations: Mapping[str, Registration] | None = None  # co-located, as of the spawn
    # fabric GPU models → free GPUs placement leaves alone for cohorts
    holdback: Mapping[frozenset[str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Admission:
    quota: Quota = NO_QUOTA
    reservations: tuple[Reservation, ...] = ()
    # (cohort, catalog GPU model) → GPUs its members hold under its reservation (a share: 1/n)
    held: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # co-located devices registered in the portal, as of this read
    registrations: Mapping[str, Registration] = field(default_factory=dict)
    # the stacks and starter kit the user's cohorts give them
    stacks: StackChoice = field(default_factory=StackChoice)
    # the sizes (cores and memory) the user's cohorts give them
    sizes: SizeChoice = field(default_factory=SizeChoice)

    def holdback(self, groups: Collection[str]) -> dict[str, int]:
        """Catalog model → free GPUs this user must leave to cohorts they are not in."""
        return holdback(self.reservations, groups, self.held)

    def keep_free(self, groups: Collection[str], catalog: Catalog) -> list[KeepFree]:
        """The reservations the claim's transaction checks for this user."""
        kept = []
        for r in self.reservations:
            model = catalog.gpu_model(r.model)
            if r.cohort in groups or model is None:
                continue
            kept.append(
                KeepFree(r.cohort, model.fabric_models, r.gpus, model.label, _hhmm(r.until))
            )
        return kept

    def cohort_for(self, groups: Collection[str], model: str | None) -> str | None:
        """The reservation a member's claim of ``model`` counts against, if any (a CPU-only
        server's, ``model`` None, against none)."""
        return next(
            (r.cohort for r in self.reservations if r.cohort in groups and r.model == model), None
        )

    def terms(self, groups: Collection[str], model: str | None, catalog: Catalog) -> ClaimTerms:
        """The terms of a claim of ``model`` GPUs by a user in ``groups``."""
        return ClaimTerms(
            quota=self.quota,
            keep_free=tuple(self.keep_free(groups, catalog)),
            cohort=self.cohort_for(groups, model),
            holdback=self.fabric_holdback(groups, catalog),
            registrations=self.registrations,
        )

    def fabric_holdback(
        self, groups: Collection[str], catalog: Catalog
    ) -> dict[frozenset[str], int]:
        """:meth:`holdback` keyed by each catalog model's fabric models, for placement."""
        by_model = {m.id: m.fabric_models for m in catalog.gpu_models}
        return {by_model[m]: n for m, n in self.holdback(groups).items() if m in by_model}

    def notes(self, groups: Collection[str]) -> dict[str, str]:
        """Catalog model → what the form says of GPUs kept from this user."""
        kept = self.holdback(groups)
        notes: dict[str, str] = {}
        for r in self.reservations:
            if r.model in kept and r.cohort not in groups:
                # A reservation in shares says so: "... session (48 quarters reserved) ...".
                unit = share_word(r.share, plural=True)
                reserved = f" ({r.shares} {unit} reserved)" if r.shares else ""
                notes[r.model] = (
                    f"{kept[r.model]} kept for cohort {r.cohort}'s session{reserved}"
                    f" until {_hhmm(r.until)}"
                )
        return notes


def admission(policy: SpawnPolicy, catalog: Catalog, at: datetime) -> Admission:
    """The admission of ``policy`` at ``at`` (site-local time)."""
    reservations = tuple(active_reservations(policy.reserving, at))
    held = {
        (r.cohort, r.model): _held(policy.held, r.cohort, catalog.gpu_model(r.model))
        for r in reservations
    }
    stacks = stack_choice(policy.cohorts, at.date())
    sizes = size_choice(policy.cohorts, at.date())
    return Admission(policy.quota, reservations, held, policy.registrations, stacks, sizes)


def _held(held: Mapping[tuple[str, str], float], cohort: str, model: GpuModel | None) -> float:
    fabric_models = model.fabric_models if model else frozenset[str]()
    return sum(n for (c, m), n in held.items() if c == cohort and m in fabric_models)


def _hhmm(at: datetime) -> str:
    return "24:00" if at.time() == END_OF_DAY else f"{at:%H:%M}"
