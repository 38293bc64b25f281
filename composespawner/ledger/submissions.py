"""Starter-kit submissions and the leaderboards made of them (``Ledger.submissions``).

A leaderboard belongs to a kit and a cohort (or to no cohort: the open one) and
ranks each user, or each team, by their best score; the earliest submission
of an equal score ranks first, as challenge platforms rank ties.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, insert, select

from composespawner.ledger.database import LedgerPart
from composespawner.ledger.models import KitSubmissionRow

SUBMISSIONS = cast(Table, KitSubmissionRow.__table__)
BY = ("user", "team")


@dataclass(frozen=True, slots=True)
class Submission:
    id: int
    kit: str
    cohort: str | None
    user_name: str
    team: str | None
    submitted_at: datetime
    score: float
    model_sha256: str
    record: dict[str, Any] = field(hash=False)
    manifest: dict[str, Any] | None = field(hash=False)


@dataclass(frozen=True, slots=True)
class Standing:
    """One line of a leaderboard: who, their best score, and the submission it came from."""

    rank: int
    name: str  # the user or the team
    score: float
    submission: Submission
    submissions: int  # how many they made


def standings(submissions: list[Submission], by: str) -> list[Standing]:
    """Rank each user (``by="user"``) or team by their best score. Pure.

    Submissions without a team are left out of the teams' board.
    """
    best: dict[str, Submission] = {}
    counts: dict[str, int] = {}
    for s in submissions:
        name = s.user_name if by == "user" else s.team
        if name is None:
            continue
        counts[name] = counts.get(name, 0) + 1
        held = best.get(name)
        if held is None or (s.score, -s.submitted_at.timestamp(), -s.id) > (
            held.score,
            -held.submitted_at.timestamp(),
            -held.id,
        ):
            best[name] = s
    ranked = sorted(best.items(), key=lambda kv: (-kv[1].score, kv[1].submitted_at, kv[1].id))
    return [
        Standing(rank, name, s.score, s, counts[name])
        for rank, (name, s) in enumerate(ranked, start=1)
    ]


class Submissions(LedgerPart):
    """Starter-kit submissions, kept with their models."""

    def add(
        self,
        *,
        kit: str,
        cohort: str | None,
        user: str,
        team: str | None,
        score: float,
        model: bytes,
        record: dict[str, Any],
        manifest: dict[str, Any] | None,
    ) -> Submission:
        row = Submission(
            id=0,
            kit=kit,
            cohort=cohort,
            user_name=user,
            team=team,
            submitted_at=self._now(),
            score=score,
            model_sha256=hashlib.sha256(model).hexdigest(),
            record=copy.deepcopy(record),
            manifest=copy.deepcopy(manifest),
        )
        values = {k: getattr(row, k) for k in Submission.__slots__ if k != "id"}
        with self._write() as connection:
            key = connection.execute(
                insert(SUBMISSIONS).values(**values, model=model)
            ).inserted_primary_key
        assert key is not None
        return replace(row, id=int(key[0]))

    def of_board(self, kit: str, cohort: str | None) -> list[Submission]:
        """Every submission to the kit's leaderboard of ``cohort`` (None: the open one)."""
        board = SUBMISSIONS.c.cohort.is_(None) if cohort is None else SUBMISSIONS.c.cohort == cohort
        query = select(*_LISTED).where(SUBMISSIONS.c.kit == kit, board)
        with self._engine.begin() as connection:
            return [_submission(row) for row in connection.execute(query)]

    def get(self, submission_id: int) -> tuple[Submission, bytes] | None:
        """A submission and its model."""
        query = select(*_LISTED, SUBMISSIONS.c.model).where(SUBMISSIONS.c.id == submission_id)
        with self._engine.begin() as connection:
            row = connection.execute(query).first()
        if row is None:
            return None
        return _submission(row), bytes(row._mapping["model"])


_LISTED = [c for c in SUBMISSIONS.c if c.name != "model"]


def _submission(row: Any) -> Submission:
    columns = {k: v for k, v in row._mapping.items() if k != "model"}
    return Submission(**copy.deepcopy(columns))
