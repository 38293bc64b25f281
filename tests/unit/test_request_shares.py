"""Requests for a share of one GPU (``gpu_share``): what is accepted, and every refusal
saying what to change."""

from pathlib import Path
from typing import Any

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.request import (
    MachineRequest,
    RequestError,
    parse_form,
    parse_options,
    share_label,
    share_phrase,
    share_word,
)

CATALOG = Catalog.from_file(Path(__file__).resolve().parents[2] / "hub_config" / "catalog.toml")
PUBLIC = frozenset({"h100", "a100", "l40s", "t4"})
QUARTER_T4 = {"gpu_model": "t4", "gpu_count": 1, "gpu_share": 4}


def test_a_quarter_of_a_t4_round_trips_through_the_options() -> None:
    request = parse_options(QUARTER_T4, CATALOG, PUBLIC)
    assert (request.gpu_model, request.gpu_count, request.gpu_share) == ("t4", 1, 4)
    assert request.gpus == 0.25
    assert request.to_options()["gpu_share"] == 4
    assert parse_options(request.to_options(), CATALOG, PUBLIC) == request
    assert request.describe(CATALOG) == "¼ of an NVIDIA T4 16GB, 4 cores, 32 GiB"


def test_whole_gpus_keep_their_options_as_before_shares() -> None:
    whole = parse_options({"gpu_model": "t4", "gpu_count": 2, "gpu_share": 1}, CATALOG, PUBLIC)
    assert whole == parse_options({"gpu_model": "t4", "gpu_count": 2}, CATALOG, PUBLIC)
    assert (whole.gpu_share, whole.gpus) == (1, 2.0)
    assert "gpu_share" not in whole.to_options()
    assert parse_options({"gpu_count": 0}, CATALOG, PUBLIC).gpus == 0
    assert MachineRequest("t4", 1, "shared", 0) == MachineRequest("t4", 1, "shared", 0, None)


@pytest.mark.parametrize(
    "form",
    [
        {"gpu_model": ["t4"], "gpu_count": ["1"], "gpu_share": ["2"]},  # a spawn link's fields
        {"gpu_model": ["t4"], "gpu_count": ["1/2"]},  # the form's count selector
        {"gpu_model": ["t4"], "gpu_count": ["1/2"], "gpu_share": ["2"]},
    ],
)
def test_a_form_posts_a_share_as_digits_or_as_its_count_choice(form: dict[str, list[str]]) -> None:
    request = parse_form({"_xsrf": ["x"], **form}, CATALOG, PUBLIC)
    assert (request.gpu_count, request.gpu_share) == (1, 2)
    assert parse_options(request.to_options(), CATALOG, PUBLIC) == request


def test_a_form_without_a_share_asks_for_whole_gpus() -> None:
    form = {"gpu_model": ["t4"], "gpu_count": ["2"], "gpu_share": [""]}
    assert parse_form(form, CATALOG, PUBLIC).gpu_share == 1


SHARE_OF_WHOLE_ONLY = (
    "NVIDIA A100 80GB is offered only whole: ask for gpu_share 1, or choose a model offered"
    " in shares: NVIDIA T4 16GB (t4: gpu_share 2 or 4)."
)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpu_model": "a100", "gpu_count": 1, "gpu_share": 4}, SHARE_OF_WHOLE_ONLY),
        (
            {**QUARTER_T4, "gpu_share": 8},
            "NVIDIA T4 16GB is offered in halves and quarters (gpu_share 2 or 4), not in"
            " eighths: ask for one of those, or gpu_share 1 for whole GPUs.",
        ),
        (
            {**QUARTER_T4, "gpu_share": 5},
            "offered in halves and quarters (gpu_share 2 or 4), not in 1/5-shares",
        ),
        (
            {**QUARTER_T4, "gpu_count": 2},
            "A share is of exactly one GPU: send gpu_count 1 with gpu_share 4, or gpu_share 1"
            " for 2 whole GPUs.",
        ),
        (
            {"gpu_count": 0, "gpu_share": 4},
            "A share is of exactly one GPU: send gpu_count 1 with gpu_share 4, or leave"
            " gpu_share out.",
        ),
        ({**QUARTER_T4, "gpu_share": 0.25}, "send an integer such as 4 (a quarter of one GPU)"),
        ({**QUARTER_T4, "gpu_share": 4.0}, "; not '4.0'"),
        (
            {**QUARTER_T4, "gpu_share": "4"},
            "gpu_share is the number of shares one GPU is split into: send an integer such"
            " as 4 (a quarter of one GPU), or 1 for whole GPUs; not '4'.",
        ),
        ({**QUARTER_T4, "gpu_share": "1/4"}, "send an integer such as 4"),
        ({**QUARTER_T4, "gpu_share": True}, "; not 'True'"),
        ({**QUARTER_T4, "gpu_share": [4]}, "send an integer such as 4"),
        (
            {**QUARTER_T4, "gpu_share": 0},
            "gpu_share must be 1 (whole GPUs) or a share size such as 4 (a quarter of one"
            " GPU); got 0.",
        ),
        ({**QUARTER_T4, "gpu_share": -4}, "got -4"),
    ],
)
def test_bad_shares_are_refused_saying_what_to_change(options: dict[str, Any], words: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_options(options, CATALOG, PUBLIC)
    assert words in str(refused.value)
    assert (refused.value.field, refused.value.status) == ("gpu_share", 400)


@pytest.mark.parametrize(
    ("form", "words"),
    [
        ({"gpu_model": ["a100"], "gpu_count": ["1/4"]}, "NVIDIA A100 80GB is offered only whole"),
        ({"gpu_model": ["t4"], "gpu_count": ["1/4"], "gpu_share": ["2"]}, "choose one share"),
        ({"gpu_model": ["t4"], "gpu_count": ["1"], "gpu_share": ["0.25"]}, "not '0.25'"),
        ({"gpu_model": ["t4"], "gpu_count": ["2"], "gpu_share": ["4"]}, "exactly one GPU"),
        ({"gpu_model": ["t4"], "gpu_count": ["1"], "gpu_share": ["<b>"]}, "not '?b?'"),
    ],
)
def test_bad_shares_in_a_form_are_refused(form: dict[str, list[str]], words: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_form(form, CATALOG, PUBLIC)
    assert words in str(refused.value)
    assert refused.value.field == "gpu_share"


def test_a_model_the_user_cannot_see_is_not_suggested_for_shares() -> None:
    with pytest.raises(RequestError) as refused:
        parse_options({"gpu_model": "a100", "gpu_count": 1, "gpu_share": 2}, CATALOG, {"a100"})
    assert str(refused.value) == "NVIDIA A100 80GB is offered only whole: ask for gpu_share 1."


@pytest.mark.parametrize(
    ("size", "label", "word", "words"),
    [
        (2, "½", "half", "halves"),
        (3, "⅓", "third", "thirds"),
        (4, "¼", "quarter", "quarters"),
        (8, "⅛", "eighth", "eighths"),
        (5, "1/5", "1/5-share", "1/5-shares"),
    ],
)
def test_shares_are_named_for_people(size: int, label: str, word: str, words: str) -> None:
    assert (share_label(size), share_word(size), share_word(size, plural=True)) == (
        label,
        word,
        words,
    )


@pytest.mark.parametrize(
    ("label", "phrase"),
    [
        ("NVIDIA T4", "¼ of an NVIDIA T4"),
        ("H100", "¼ of an H100"),
        ("Tesla T4", "¼ of a Tesla T4"),
        ("Intel Max 1100", "¼ of an Intel Max 1100"),
        ("T4", "¼ of a T4"),
    ],
)
def test_a_share_names_its_model_with_its_article(label: str, phrase: str) -> None:
    assert share_phrase(4, label) == phrase


def test_a_share_on_a_whole_host_is_refused_naming_the_sizes() -> None:
    """A whole host would keep the GPU's other holders off it, for the price of a share."""
    with pytest.raises(RequestError) as refused:
        parse_options({**QUARTER_T4, "size": "whole"}, CATALOG, PUBLIC)
    assert (refused.value.field, refused.value.status) == ("size", 400)
    assert "choose a size (small, medium, large, xlarge)" in str(refused.value)
