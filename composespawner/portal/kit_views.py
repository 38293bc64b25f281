"""What the starter kits' calls accept and show, as plain data: pure functions, no I/O.

A submission's body checked and decoded, the leaderboard it goes to, and a
standing as the API shows it (see ``views`` for the rest of the portal's).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from composespawner.domain.cohorts import Cohort, InvalidCohort
from composespawner.ledger import Standing
from composespawner.portal.views import optional_text

TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")


@dataclass(frozen=True)
class SubmissionAsk:
    """A submission as posted: the model, its run's record, and where it goes."""

    model: bytes
    record: dict[str, Any]
    server: str
    team: str | None
    cohort: str | None


def submission_from_json(body: object) -> SubmissionAsk:
    """``{"model": base64, "record": {...}, "server": "", "team": "blue", "cohort": ...}``;
    InvalidCohort says what is wrong."""
    example = '{"model": "<base64 of torch.jit.save>", "record": {...}}'
    if not isinstance(body, dict):
        raise InvalidCohort(f"send a JSON object: {example}")
    unknown = sorted(set(body) - {"model", "record", "server", "team", "cohort"})
    if unknown:
        raise InvalidCohort(f"unknown field {unknown[0]!r}; send {example}")
    model = body.get("model")
    try:
        decoded = base64.b64decode(model, validate=True) if isinstance(model, str) else None
    except (binascii.Error, ValueError):
        decoded = None
    if not decoded:
        raise InvalidCohort("model must be the base64 of a TorchScript file (torch.jit.save)")
    record = body.get("record")
    if not isinstance(record, dict):
        raise InvalidCohort("record must be the run's repro record, a JSON object")
    team = body.get("team")
    if team is not None and (not isinstance(team, str) or not TEAM.match(team)):
        raise InvalidCohort(
            "team must be up to 64 letters, digits, spaces, '.', '_' or '-', starting with"
            " a letter or digit"
        )
    server = body.get("server", "")
    if not isinstance(server, str):
        raise InvalidCohort("server must be the name of your server ('' for the default)")
    return SubmissionAsk(decoded, record, server, team, optional_text(body.get("cohort"), "cohort"))


def board_for(kit: str, cohorts: Sequence[Cohort], asked: str | None) -> str | None:
    """Which cohort's leaderboard a submission goes to: the one asked for (one of the
    user's), else the first whose starter kit it is, else the first they are in; None
    (the open board) for a user in no cohort."""
    names = [c.name for c in cohorts]
    if asked is not None:
        if asked not in names:
            raise InvalidCohort(f"you are not in cohort {asked!r}; yours: {', '.join(names)}")
        return asked
    chosen = next((c.name for c in cohorts if c.starter_kit == kit), None)
    return chosen or (names[0] if names else None)


def standing_json(standing: Standing) -> dict[str, Any]:
    s = standing.submission
    stack = (s.manifest or {}).get("stack") or {}
    return {
        "rank": standing.rank,
        "name": standing.name,
        "score": standing.score,
        "submissions": standing.submissions,
        "best": {
            "id": s.id,
            "user": s.user_name,
            "team": s.team,
            "submitted_at": s.submitted_at.isoformat(),
            "model_sha256": s.model_sha256,
            "weights": s.record.get("weights"),
            "stack": stack.get("id"),
            "lock_sha256": stack.get("lock_sha256"),
        },
    }
