"""The starter kits' use cases: scoring a submission, and reading a kit's leaderboards.

Part of the portal's service (``portal/service.py``): it raises the portal's own
errors, never an HTTP status.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composespawner.domain.catalog import Catalog, Kit
from composespawner.domain.cohorts import InvalidCohort
from composespawner.launchers.environments import StackEnvironments
from composespawner.ledger import Ledger, Standing, standings
from composespawner.ledger.runner import LedgerRunner
from composespawner.ledger.submissions import BY
from composespawner.portal import kit_views
from composespawner.portal.errors import Forbidden, InvalidInput, NotFound, PortalError, Unavailable
from composespawner.portal.scoring import Scorer, SubmissionRefused


@dataclass
class Leaderboards:
    """The catalog's starter kits, their submissions and their boards."""

    ledger: Ledger
    runner: LedgerRunner
    catalog: Catalog
    scorer: Scorer | None = None  # scores starter-kit submissions (None: none are taken)
    stack_environments: Path | None = None  # where the stacks' environments are built

    def kit(self, kit_id: str) -> Kit:
        kit = self.catalog.kit(kit_id)
        if kit is None:
            known = ", ".join(k.id for k in self.catalog.kits) or "none"
            raise NotFound(f"No starter kit {kit_id!r}; the kits: {known}.")
        return kit

    @staticmethod
    def check_order(by: str) -> None:
        """A board ranks its users' or its teams' bests; InvalidInput for anything else."""
        if by not in BY:
            raise InvalidInput("by must be user or team.")

    async def standings(self, kit: Kit, cohort: str | None, by: str) -> list[Standing]:
        """The kit's board for ``cohort`` (None: the open one), each one's best by ``by``."""
        self.check_order(by)
        board = await self.runner.run(self.ledger.submissions.of_board, kit.id, cohort)
        return standings(board, by)

    async def submit(
        self, user: str, groups: list[str], kit: Kit, ask: kit_views.SubmissionAsk
    ) -> dict[str, Any]:
        """Score ``ask``'s model on ``kit``'s blind data and put it on its leaderboard."""
        if self.scorer is None or self.stack_environments is None:
            raise Unavailable("This hub takes no starter-kit submissions.")
        mine = await self.runner.run(self.ledger.policy.cohorts, groups) if groups else []
        try:
            board = kit_views.board_for(kit.id, sorted(mine, key=lambda c: c.name), ask.cohort)
        except InvalidCohort as e:
            raise Forbidden(str(e)) from None
        python = self._stack_python(kit)
        try:
            score = await self.scorer.score(kit, python, ask.model)
        except SubmissionRefused as e:
            raise PortalError(str(e), e.status) from None
        manifest = await self._run_manifest_of(user, ask.server)
        submission = await self.runner.run(
            functools.partial(
                self.ledger.submissions.add,
                kit=kit.id,
                cohort=board,
                user=user,
                team=ask.team,
                score=score,
                model=ask.model,
                record=ask.record,
                manifest=manifest,
            )
        )
        on_board = await self.runner.run(self.ledger.submissions.of_board, kit.id, board)
        rank = next(s.rank for s in standings(on_board, "user") if s.name == user)
        return {
            "id": submission.id,
            "kit": kit.id,
            "cohort": board,
            "score": score,
            "rank": rank,
            "model_sha256": submission.model_sha256,
        }

    def _stack_python(self, kit: Kit) -> Path:
        stack = self.catalog.stack(kit.stack)
        # The catalog checks a kit's stack; submit() checks stack_environments.
        assert stack is not None
        assert stack.common is not None
        assert self.stack_environments is not None
        environment = StackEnvironments(self.stack_environments, stack.common).ready(stack)
        if environment is None:
            raise Unavailable(
                f"The {stack.label} stack is not built on this hub yet: start a server on it,"
                " then submit again."
            )
        return environment.bin / "python"

    async def _run_manifest_of(self, user: str, server: str) -> dict[str, Any] | None:
        """The run manifest of ``user``'s running ``server``, if it is running."""
        machines = await self.runner.run(self.ledger.live_machines, user)
        machine = next((m for m in machines if m.server_name == server), None)
        if machine is None:
            return None
        run = await self.runner.run(self.ledger.run_manifest, machine.id)
        return None if run is None else run.manifest
