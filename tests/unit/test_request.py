"""MachineRequest parsing: every bad input gets a message a person can act on."""

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import SizeChoice, StackChoice
from composespawner.domain.request import (
    MAX_OPTIONS_BYTES,
    MachineRequest,
    OptionsTooLarge,
    RequestError,
    SizeNotAllowed,
    StackNotAllowed,
    check_server_name,
    default_size,
    parse_form,
    parse_options,
    settle_size,
    settle_stack,
)

CATALOG_FILE = Path(__file__).resolve().parents[2] / "hub_config" / "catalog.toml"
CATALOG = Catalog.from_file(CATALOG_FILE)
PUBLIC = frozenset({"h100", "a100", "l40s", "t4"})


def test_form_post_becomes_typed_request() -> None:
    form = {
        "_xsrf": ["token"],
        "gpu_model": ["a100"],
        "gpu_count": ["2"],
        "network": ["100g"],
        "scratch_gb": ["1920"],
    }
    # No stack chosen: settle_stack gives it the first the user may use.
    assert parse_form(form, CATALOG, PUBLIC) == MachineRequest(
        "a100", 2, "100g", 1920, None, size="large"
    )
    form["stack"] = ["tensorflow"]
    assert parse_form(form, CATALOG, PUBLIC).stack == "tensorflow"


def test_api_options_round_trip() -> None:
    request = MachineRequest("t4", 1, "shared", 0, "tensorflow")
    assert parse_options(request.to_options(), CATALOG, PUBLIC) == request


def test_defaults_for_optional_fields() -> None:
    request = parse_options({"gpu_model": "t4", "gpu_count": 1}, CATALOG, PUBLIC)
    assert (request.network, request.scratch_gb, request.stack) == ("shared", 0, None)
    assert settle_stack(request, CATALOG, StackChoice()).stack == "pytorch"  # the catalog's first


def test_a_cohort_that_restricts_stacks_gets_the_first_it_uses_and_only_those() -> None:
    course = StackChoice(frozenset({"tensorflow"}), None, ("cs-101",))
    request = parse_options({"gpu_model": "t4", "gpu_count": 1}, CATALOG, PUBLIC)
    assert settle_stack(request, CATALOG, course).stack == "tensorflow"
    wanted = replace(request, stack="pytorch")
    with pytest.raises(StackNotAllowed, match="cohort cs-101 uses these stacks only: TensorFlow"):
        settle_stack(wanted, CATALOG, course)
    assert StackNotAllowed.status == 403
    gone = StackChoice(frozenset({"jax"}), None, ("cs-101",))
    with pytest.raises(StackNotAllowed, match="uses no stack this hub offers now"):
        settle_stack(request, CATALOG, gone)
    with pytest.raises(StackNotAllowed):  # a kit on a stack the cohort does not use
        settle_stack(replace(request, kit="digits", stack="pytorch"), CATALOG, course)


def test_a_kit_brings_its_stack_and_comes_back_from_the_options() -> None:
    request = parse_options({"gpu_model": "t4", "gpu_count": 1, "kit": "digits"}, CATALOG, PUBLIC)
    assert (request.kit, request.stack) == ("digits", "pytorch")
    assert parse_options(request.to_options(), CATALOG, PUBLIC) == request
    no_kit = {"gpu_model": "t4", "gpu_count": 1, "kit": ""}
    assert parse_options(no_kit, CATALOG, PUBLIC).kit is None


def test_without_stacks_in_the_catalog_a_request_has_none() -> None:
    bare = replace(CATALOG, stacks=())
    assert parse_options({"gpu_model": "t4", "gpu_count": 1}, bare, PUBLIC).stack is None
    with pytest.raises(RequestError, match="none are offered") as caught:
        parse_options({"gpu_model": "t4", "gpu_count": 1, "stack": "pytorch"}, bare, PUBLIC)
    assert caught.value.field == "stack"


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"gpu_count": 1}, "gpu_model", "Choose a GPU model"),
        ({"gpu_model": "v100", "gpu_count": 1}, "gpu_model", "Unknown GPU model 'v100'"),
        ({"gpu_model": 7, "gpu_count": 1}, "gpu_model", "Unknown GPU model '7'"),
        ({"gpu_model": "t4", "gpu_count": 0}, "gpu_model", "CPU-only server"),
        ({"gpu_count": 1}, "gpu_model", "0 GPUs for a CPU-only server"),
        ({"gpu_count": 0, "size": "huge"}, "size", "Unknown size 'huge'. Choose one of: small"),
        ({"gpu_count": 0, "size": 8}, "size", "Unknown size '8'"),
        ({"gpu_count": 0, "cores": 8}, "cores", 'give "size", one of small'),
        ({"gpu_count": 0, "memory_gib": 999}, "memory_gib", 'give "size"'),
        ({"gpu_model": "t4", "gpu_count": -2}, "gpu_count", "got -2"),
        ({"gpu_model": "t4", "gpu_count": 99}, "gpu_count", "the most one machine can hold"),
        ({"gpu_model": "t4", "gpu_count": 10**12}, "gpu_count", "from 0 \\(CPU only\\) to 4"),
        ({"gpu_model": "t4", "gpu_count": 1.5}, "gpu_count", "whole number"),
        ({"gpu_model": "t4", "gpu_count": "two"}, "gpu_count", "whole number"),
        ({"gpu_model": "t4", "gpu_count": True}, "gpu_count", "whole number"),
        ({"gpu_model": "t4", "gpu_count": None}, "gpu_count", "whole number"),
        ({"gpu_model": "t4", "gpu_count": 1, "network": "400g"}, "network", "400g"),
        ({"gpu_model": "t4", "gpu_count": 1, "scratch_gb": 5}, "scratch_gb", "0, 1920, 3840"),
        ({"gpu_model": "t4", "gpu_count": 1, "scratch_gb": -1920}, "scratch_gb", "one of"),
        ({"gpu_model": "t4", "gpu_count": 1, "stack": "conda"}, "stack", "pytorch, tensorflow"),
        ({"gpu_model": "t4", "gpu_count": 1, "stack": ["pytorch"]}, "stack", "Unknown software"),
        ({"gpu_model": "t4", "gpu_count": 1, "stack": "<b>x</b>"}, "stack", "'\\?b\\?x"),
        ({"gpu_model": "t4", "gpu_count": 1, "kit": "mnist"}, "kit", "Unknown starter kit"),
        ({"gpu_model": "t4", "gpu_count": 1, "kit": 3}, "kit", "digits, eeg-seizures"),
        (
            {"gpu_model": "t4", "gpu_count": 1, "kit": "digits", "stack": "tensorflow"},
            "kit",
            "runs on the PyTorch 2.13 stack: choose that stack, or no starter kit",
        ),
        ({"gpu_model": "t4", "gpu_count": 1, "colour": "red"}, "colour", "Unknown option"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(RequestError, match=words) as caught:
        parse_options(options, CATALOG, PUBLIC)
    assert caught.value.field == field


def test_colocated_model_is_unknown_to_outsiders() -> None:
    options = {"gpu_model": "rtx6000", "gpu_count": 1}
    with pytest.raises(RequestError) as caught:
        parse_options(options, CATALOG, PUBLIC)
    assert "rtx6000" in str(caught.value)
    assert "rtx6000" not in str(caught.value).split("Choose one of:")[1]
    assert parse_options(options, CATALOG, PUBLIC | {"rtx6000"}).gpu_model == "rtx6000"


def test_markup_never_reaches_a_message() -> None:
    with pytest.raises(RequestError) as caught:
        parse_options({"gpu_model": "<script>alert(1)</script>", "gpu_count": 1}, CATALOG, PUBLIC)
    assert "<" not in str(caught.value)
    assert ">" not in str(caught.value)


def test_form_with_repeated_field_is_refused() -> None:
    with pytest.raises(RequestError, match="exactly one value for 'gpu_count'"):
        parse_form({"gpu_model": ["t4"], "gpu_count": ["1", "2"]}, CATALOG, PUBLIC)


@pytest.mark.parametrize("name", ["", "thesis", "exp-2.run_1"])
def test_plain_server_names_pass(name: str) -> None:
    check_server_name(name)


@pytest.mark.parametrize("name", ["<b>x</b>", "a b", "../etc", "-lead", "x" * 64, "naïve"])
def test_odd_server_names_are_refused(name: str) -> None:
    with pytest.raises(RequestError, match="is not allowed"):
        check_server_name(name)


def test_oversized_options_are_refused_before_anything_else() -> None:
    padding = "x" * MAX_OPTIONS_BYTES
    with pytest.raises(OptionsTooLarge) as api:
        parse_options({"gpu_model": "t4", "gpu_count": 1, "notes": padding}, CATALOG, PUBLIC)
    with pytest.raises(OptionsTooLarge) as form:
        parse_form({"gpu_model": ["t4"], "notes": [padding]}, CATALOG, PUBLIC)
    for refused in (api.value, form.value):
        assert refused.status == 413
        assert f"at most {MAX_OPTIONS_BYTES:,} bytes" in str(refused)
        assert "Send only gpu_model, gpu_count" in str(refused)


def test_a_cpu_only_server_takes_a_size_and_no_gpu() -> None:
    request = parse_options({"gpu_count": 0}, CATALOG, PUBLIC)
    assert (request.gpu_model, request.gpu_count, request.size) == (None, 0, "small")
    assert request.describe(CATALOG) == "CPU only, 2 cores, 8 GiB"
    assert parse_options(request.to_options(), CATALOG, PUBLIC) == request
    chosen = parse_options({"gpu_count": "0", "gpu_model": "", "size": "whole"}, CATALOG, PUBLIC)
    assert chosen.size == "whole"


@pytest.mark.parametrize(
    ("count", "size"), [(0, "small"), (1, "medium"), (3, "large"), (4, "xlarge")]
)
def test_a_request_naming_no_size_gets_its_gpu_counts_default(count: int, size: str) -> None:
    options = {"gpu_count": count, **({"gpu_model": "t4"} if count else {})}
    assert parse_options(options, CATALOG, PUBLIC).size == size


def test_a_catalog_without_sizes_gives_every_machine_its_whole_host() -> None:
    raw = tomllib.loads(CATALOG_FILE.read_text())
    for key in ("sizes", "default_size", "hosts"):
        raw.pop(key)
    catalog = Catalog.from_dict(raw, relative_to=CATALOG_FILE.parent)
    assert [s.id for s in catalog.sizes] == ["whole"]
    assert parse_options({"gpu_model": "t4", "gpu_count": 1}, catalog, PUBLIC).size == "whole"


COURSE_SIZES = SizeChoice(frozenset({"small", "large"}), ("cs-101",))


def test_a_cohort_that_limits_sizes_refuses_another_size_naming_those_it_uses() -> None:
    request = parse_options({"gpu_count": 0, "size": "xlarge"}, CATALOG, PUBLIC)
    with pytest.raises(SizeNotAllowed) as refused:
        settle_size(request, CATALOG, COURSE_SIZES, named=True)
    assert str(refused.value) == (
        "Your cohort cs-101 uses these sizes only: 2 cores, 8 GiB; 8 cores, 64 GiB."
        ' Choose one of them ("size": small, large).'
    )
    assert (refused.value.status, refused.value.field) == (403, "size")
    allowed = replace(request, size="large")
    assert settle_size(allowed, CATALOG, COURSE_SIZES, named=True) == allowed
    assert settle_size(request, CATALOG, SizeChoice(), named=True) == request  # no limit


@pytest.mark.parametrize(
    ("count", "size"),
    [(0, "small"), (2, "large"), (1, "small")],  # 1 GPU's default (medium) is not allowed
)
def test_a_request_naming_no_size_gets_the_default_if_allowed_else_the_first_allowed(
    count: int, size: str
) -> None:
    options: dict[str, Any] = {"gpu_count": count}
    if count:
        options["gpu_model"] = "t4"
    request = parse_options(options, CATALOG, PUBLIC)
    assert settle_size(request, CATALOG, COURSE_SIZES, named=False).size == size
    # The same size named outright is refused rather than changed.
    if size != request.size:
        with pytest.raises(SizeNotAllowed):
            settle_size(request, CATALOG, COURSE_SIZES, named=True)


def test_a_cohort_whose_sizes_the_hub_no_longer_offers_says_whom_to_ask() -> None:
    gone = SizeChoice(frozenset({"huge"}), ("cs-101",))
    request = parse_options({"gpu_count": 0}, CATALOG, PUBLIC)
    for named in (True, False):
        with pytest.raises(SizeNotAllowed, match="cs-101 uses no size this hub offers now"):
            settle_size(request, CATALOG, gone, named=named)


def test_the_default_size_a_form_preselects_follows_the_cohorts_sizes() -> None:
    assert default_size(CATALOG, 1, SizeChoice()) == CATALOG.size("medium")
    assert default_size(CATALOG, 1, COURSE_SIZES) == CATALOG.size("small")  # medium: not theirs
    assert default_size(CATALOG, 2, COURSE_SIZES) == CATALOG.size("large")
    assert default_size(CATALOG, 0, SizeChoice(frozenset({"gone"}), ("cs-101",))) is None
