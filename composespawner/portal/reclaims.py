"""The portal's use cases for idle GPUs (issue 32): what users are told, *Keep*, and
cohorts' reclaim policies.

The site's policy is ``c.ComposeSettings.reclaim_policy``, the one the reclaimer acts
on; a cohort's overrides, stored in the ledger, win for the machines claimed under its
reservation, exactly as the reclaimer merges them (``domain.reclaim.cohort_policy``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from composespawner.domain.reclaim import (
    KeepRefused,
    ReclaimPolicy,
    cohort_policy,
    policy_problems,
)
from composespawner.ledger import Actor, DeviceRecord, Ledger, Machine, UnknownDevices
from composespawner.ledger.runner import LedgerRunner
from composespawner.portal import reclaim_views
from composespawner.portal.errors import Conflict, InvalidInput, NotFound


@dataclass
class ReclaimDesk:
    """What the portal's handlers ask about idle GPUs."""

    ledger: Ledger
    runner: LedgerRunner
    site: ReclaimPolicy
    timezone: tzinfo
    interval: float = 0.0  # the reclaimer's seconds between passes (its config)

    async def policy_for(self, cohort: str | None) -> ReclaimPolicy:
        """The policy a machine claimed under ``cohort`` (None: none) follows."""
        if cohort is None:
            return self.site
        overrides = await self.runner.run(self.ledger.reclaims.cohort_policy, cohort)
        return cohort_policy(self.site, overrides, self.interval)[0]

    async def annotated(
        self,
        servers: Iterable[dict[str, Any]],
        machines: Iterable[Machine],
        devices: Mapping[str, DeviceRecord],
    ) -> list[dict[str, Any]]:
        """Each server's JSON (its ``machine`` the id of one of ``machines``) with every
        GPU's reclaim fields (``reclaim_views``) and the policy it follows."""
        by_id = {m.id: m for m in machines}
        watches = await self.runner.run(self.ledger.reclaims.watches, sorted(by_id))
        # One read per cohort, not per server.
        policies = {c: await self.policy_for(c) for c in {m.cohort for m in by_id.values()}}
        now = time.time()
        annotated = []
        for server in servers:
            machine = by_id[server["machine"]]
            policy = policies[machine.cohort]
            gpus = [gpu["id"] for gpu in server["gpus"]]
            states = reclaim_views.server_states(
                {gpu: watches.get((machine.id, gpu)) for gpu in gpus},
                {gpu: devices[gpu].model if gpu in devices else "GPU" for gpu in gpus},
                policy,
                now,
                self.timezone,
            )
            annotated.append(reclaim_views.with_states(server, states, policy))
        return annotated

    async def keep(self, user: str, server: str, gpu: str) -> dict[str, Any]:
        """``user`` pressed *Keep* on GPU ``gpu`` of their running server ``server``."""
        shown = f"Your server {server!r}" if server else "Your default server"
        machine = next(
            (
                m
                for m in await self.runner.run(self.ledger.live_machines, user)
                if m.server_name == server
            ),
            None,
        )
        if machine is None:
            raise NotFound(f"{shown} is not running: there is no GPU of it to keep.")
        policy = await self.policy_for(machine.cohort)
        try:
            kept = await self.runner.run(
                self.ledger.reclaims.keep, user, server, gpu, policy, time.time()
            )
        except UnknownDevices:
            # Another user's GPU is answered as one that does not exist.
            raise NotFound(
                f"{shown} holds no GPU {gpu!r}: its GPUs are listed on your machine's page."
            ) from None
        except KeepRefused as e:
            raise Conflict(str(e)) from None
        devices = await self.runner.run(self.ledger.devices, [gpu])
        model = devices[0].model if devices else "GPU"
        return reclaim_views.keep_answer(gpu, model, kept, policy, self.timezone)

    # -- cohorts' policies ----------------------------------------------------------------

    async def cohort_policy(self, cohort: str) -> dict[str, Any]:
        """A cohort's overrides, the policy its machines follow, and the site's."""
        names = await self.runner.run(self.ledger.policy.cohort_names)
        if cohort not in names:
            raise NotFound(f"No cohort {cohort!r}.")
        overrides = await self.runner.run(self.ledger.reclaims.cohort_policy, cohort)
        policy, problem = cohort_policy(self.site, overrides, self.interval)
        return {
            "cohort": cohort,
            "overrides": overrides or {},
            "policy": policy.as_dict(),
            "site": self.site.as_dict(),
            # Overrides that no longer fit the site's values (it changed since): ignored.
            "problem": problem,
        }

    async def cohort_policies(self, cohorts: Iterable[str]) -> dict[str, dict[str, Any]]:
        """For the cohorts page, each of ``cohorts``: its overrides and, in words, the
        policy its GPUs follow (one read)."""
        stored = await self.runner.run(self.ledger.reclaims.cohort_policies)
        shown = {}
        for name in cohorts:
            policy, problem = cohort_policy(self.site, stored.get(name), self.interval)
            shown[name] = {
                "overrides": stored.get(name) or {},
                "text": reclaim_views.policy_text(policy.as_dict()),
                "problem": problem,
            }
        return shown

    async def set_cohort_policy(self, cohort: str, body: object, actor: Actor) -> dict[str, Any]:
        """Store ``body`` (fields of a policy, or {} / null for the site's) as ``cohort``'s."""
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise InvalidInput(
                'Send the fields to change, such as {"warn_after": 1200, "reclaim_after": 1800}'
                " (seconds), or {} for the site's policy."
            )
        problems = policy_problems(body, over=self.site)
        if problems:
            raise InvalidInput("; ".join(problems.values()))
        problem = cohort_policy(self.site, body, self.interval)[1]
        if problem:
            raise InvalidInput(problem)
        stored = await self.runner.run(
            self.ledger.reclaims.set_cohort_policy, cohort, body or None, actor.name
        )
        if not stored:
            raise NotFound(f"No cohort {cohort!r}: create it first.")
        return await self.cohort_policy(cohort)
