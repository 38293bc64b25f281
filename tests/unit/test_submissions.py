"""Starter-kit submissions as the portal reads them, and the blind data's seed."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from composespawner.domain.cohorts import Cohort, InvalidCohort
from composespawner.portal.kit_views import board_for, submission_from_json
from composespawner.portal.scoring import blind_seed, read_secret

MODEL = base64.b64encode(b"torchscript").decode()


def test_a_submission_is_read_with_its_model_decoded() -> None:
    ask = submission_from_json({"model": MODEL, "record": {"seed": 0}, "team": "Blue team"})
    assert (ask.model, ask.record, ask.team, ask.server, ask.cohort) == (
        b"torchscript",
        {"seed": 0},
        "Blue team",
        "",
        None,
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "send a JSON object"),
        ({"model": MODEL, "record": {}, "weights": "x"}, "unknown field 'weights'"),
        ({"record": {}}, "model must be the base64"),
        ({"model": "not base64!", "record": {}}, "model must be the base64"),
        ({"model": "", "record": {}}, "model must be the base64"),
        ({"model": MODEL}, "record must be the run's repro record"),
        ({"model": MODEL, "record": {}, "team": "<b>x</b>"}, "team must be up to 64"),
        ({"model": MODEL, "record": {}, "team": "x" * 65}, "team must be up to 64"),
        ({"model": MODEL, "record": {}, "team": 7}, "team must be up to 64"),
        ({"model": MODEL, "record": {}, "server": 3}, "server must be the name"),
    ],
)
def test_a_bad_submission_is_refused_with_what_to_send(body: object, words: str) -> None:
    with pytest.raises(InvalidCohort, match=words):
        submission_from_json(body)


def test_a_submission_goes_to_the_board_of_the_cohort_whose_kit_it_is() -> None:
    course = Cohort("cs-101", starter_kit="digits")
    lab = Cohort("a-lab")
    assert board_for("digits", [lab, course], None) == "cs-101"
    assert board_for("pathology", [lab, course], None) == "a-lab"  # the first
    assert board_for("digits", [], None) is None  # the open board
    assert board_for("digits", [lab, course], "a-lab") == "a-lab"
    with pytest.raises(InvalidCohort, match="you are not in cohort 'cs-102'"):
        board_for("digits", [lab, course], "cs-102")


def test_the_blind_seed_is_the_kits_and_the_secrets(tmp_path: Path) -> None:
    secret = read_secret(tmp_path / "secret")
    assert len(secret) == 32
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert read_secret(tmp_path / "secret") == secret  # kept, not made again
    assert blind_seed(secret, "digits") == blind_seed(secret, "digits")
    assert blind_seed(secret, "digits") != blind_seed(secret, "pathology")
    assert blind_seed(secret, "digits") != blind_seed(b"another secret", "digits")
    assert 0 <= blind_seed(secret, "digits") < 2**32
