"""Starter-kit submissions: kept with their model, ranked per kit and cohort."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from composespawner.ledger import Ledger, Submission, standings

T0 = datetime(2026, 11, 24, 12, tzinfo=UTC)


def submitted(n: int, user: str, score: float, team: str | None = None) -> Submission:
    return Submission(n, "digits", "cs-101", user, team, T0 + timedelta(minutes=n), score,
                      "ab" * 32, {}, None)  # fmt: skip


def test_each_user_and_team_is_ranked_by_their_best_and_ties_go_to_the_earliest() -> None:
    board = [
        submitted(1, "ann", 0.90, "blue"),
        submitted(2, "bob", 0.95, "red"),
        submitted(3, "ann", 0.97, "blue"),
        submitted(4, "cy", 0.97),  # later than ann's 0.97
        submitted(5, "bob", 0.80, "red"),
    ]
    by_user = standings(board, "user")
    assert [(s.rank, s.name, s.score, s.submissions) for s in by_user] == [
        (1, "ann", 0.97, 2),
        (2, "cy", 0.97, 1),
        (3, "bob", 0.95, 2),
    ]
    assert by_user[0].submission.id == 3
    by_team = standings(board, "team")
    assert [(s.name, s.score) for s in by_team] == [("blue", 0.97), ("red", 0.95)]


def test_a_submission_is_kept_with_its_model_on_its_cohorts_board(ledger: Ledger) -> None:
    book = ledger.submissions
    kept = book.add(kit="digits", cohort="cs-101", user="ann", team="blue", score=0.97,
                    model=b"torchscript", record={"seed": 0}, manifest={"server": ""})  # fmt: skip
    book.add(kit="digits", cohort=None, user="bob", team=None, score=0.5, model=b"x",
             record={}, manifest=None)  # fmt: skip
    assert kept.id > 0
    assert book.of_board("digits", "cs-101") == [kept]
    assert [s.user_name for s in book.of_board("digits", None)] == ["bob"]
    assert book.of_board("eeg-seizures", "cs-101") == []
    found = book.get(kept.id)
    assert found is not None
    assert found[1] == b"torchscript"
    assert (
        found[0].model_sha256 == "e60a540d042bda602fbc9f39a90d844fa30cba65169402aac3dc75b6032d609f"
    )
    assert book.get(kept.id + 100) is None
