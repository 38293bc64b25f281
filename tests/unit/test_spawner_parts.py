"""The composing spawner's parts that need no hub: progress, saved state, requests, refusals."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import SizeChoice
from composespawner.domain.hardware import Device
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.request import MAX_OPTIONS_BYTES
from composespawner.launchers.base import SpawnRefused
from composespawner.services.admission import Admission
from composespawner.services.composer import Composer
from composespawner.spawners.options import (
    LinkChoices,
    UserRequests,
    options_to_start,
    stack_asked_for,
)
from composespawner.spawners.progress import StartProgress, step_percent
from composespawner.spawners.refusals import options_to_store
from composespawner.spawners.state import ComposeState, restored_state, saved_state
from harness.paths import HUB_CONFIG
from tests.support.composers import demo_composer

CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")
GPU = Device("b1", "gpu", "NVIDIA T4 16GB", frozenset({"r1"}), "c1", "attached", uuid="u-1")
MACHINE = ComposedMachine("m-1", "host-01", "r1", (GPU,), None, ())


async def test_the_progress_page_follows_each_step_until_the_start_ends() -> None:
    steps = StartProgress()
    steps.begin()
    seen: list[dict[str, Any]] = []

    async def follow() -> None:
        async for event in steps.follow():
            seen.append(event)

    following = asyncio.ensure_future(follow())
    steps.add("claiming")
    await asyncio.sleep(0)
    assert [e["message"] for e in seen] == ["claiming"]
    steps.add("starting notebook")
    steps.end()
    await asyncio.wait_for(following, 5)
    assert seen == [
        {"progress": 10, "message": "claiming"},
        {"progress": 22, "message": "starting notebook"},
    ]
    # A page opened after the start ended still sees every step, and ends.
    assert [e async for e in steps.follow()] == seen
    assert step_percent(100) == 90


def test_saved_state_is_read_back_as_it_was_kept() -> None:
    kept = ComposeState(MACHINE, {"gpu_model": "t4"}, {"machine": "m-1"})
    state = saved_state(kept)
    assert state["compose"]["version"] == 1
    assert restored_state(state) == kept


def test_a_share_holders_state_keeps_its_share_and_an_older_state_loads_as_whole() -> None:
    quarter = ComposeState(replace(MACHINE, gpu_share=4))
    assert restored_state(saved_state(quarter)) == quarter
    # A state saved before shares (version 1 without gpu_share) held whole GPUs.
    older = saved_state(ComposeState(MACHINE))
    del older["compose"]["gpu_share"]
    restored = restored_state(older).machine
    assert restored is not None
    assert restored.gpu_share == 1
    assert restored == MACHINE


def test_a_state_of_none_of_ours_or_not_ours_to_read_restores_nothing() -> None:
    assert saved_state(ComposeState(None, {}, None)) == {}
    assert restored_state({"pid": 7}) == ComposeState()
    assert restored_state({"compose_options": "t4", "run_manifest": []}) == ComposeState()


def test_oversized_options_are_not_stored_and_the_previous_ones_stay() -> None:
    small, big = {"gpu_count": 1}, {"notes": "x" * (MAX_OPTIONS_BYTES + 1)}
    assert options_to_store("thesis", small, None) is small
    assert options_to_store("thesis", big, small) is small
    assert options_to_store("thesis", big, "not options") is None


def test_a_start_without_options_reuses_the_last_accepted_ones() -> None:
    accepted = {"gpu_model": "t4", "gpu_count": 1}
    assert options_to_start({}, accepted, "thesis") is accepted
    with pytest.raises(SpawnRefused) as refused:
        options_to_start({}, accepted, "<b>")
    assert refused.value.reason == "invalid-options"


def test_the_stack_a_start_builds_is_asked_for_or_its_kits_or_the_default() -> None:
    assert stack_asked_for(CATALOG, {"stack": "tensorflow"}) == CATALOG.stack("tensorflow")
    assert stack_asked_for(CATALOG, {"kit": "digits"}) == CATALOG.stack("pytorch")
    assert stack_asked_for(CATALOG, {}) == CATALOG.default_stack
    assert stack_asked_for(CATALOG, {"stack": ["pytorch"]}) is None  # checked later by start


def test_a_links_choices_are_for_the_form_of_that_same_request_only() -> None:
    link, other = object(), object()
    choices = LinkChoices()
    choices.keep(link, {"gpu_model": "t4"})
    assert choices.take(other) is None
    choices.keep(link, {"gpu_model": "t4"})
    assert choices.take(link) == {"gpu_model": "t4"}
    assert choices.take(link) is None  # once


def test_options_not_stored_are_logged_naming_the_server(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        options_to_store("thesis", {"notes": "x" * (MAX_OPTIONS_BYTES + 1)}, None)
    assert "for server 'thesis'" in caplog.text


@pytest.fixture
async def composer(tmp_path: Path) -> AsyncIterator[Composer]:
    composer = demo_composer(tmp_path)
    yield composer
    await composer.close()


def requests_of(composer: Composer) -> UserRequests:
    log = logging.getLogger("test")
    return UserRequests(composer, "student1", frozenset({"cs-101"}), log, "student1/")


@pytest.mark.timeout(30)
async def test_a_start_in_a_size_its_cohort_does_not_use_is_refused_naming_those_it_does(
    composer: Composer,
) -> None:
    admitted = Admission(sizes=SizeChoice(frozenset({"small", "large"}), ("cs-101",)))

    with pytest.raises(SpawnRefused) as refused:
        await requests_of(composer).for_start({"gpu_count": 0, "size": "xlarge"}, admitted)

    assert refused.value.status_code == 403
    assert refused.value.jupyterhub_message == (
        "Your cohort cs-101 uses these sizes only: 2 cores, 8 GiB; 8 cores, 64 GiB."
        ' Choose one of them ("size": small, large).'
    )
    assert composer.ledger.live_machines() == []  # refused before anything is asked for


@pytest.mark.timeout(30)
async def test_a_start_naming_no_size_gets_one_its_cohort_uses(composer: Composer) -> None:
    admitted = Admission(sizes=SizeChoice(frozenset({"small", "large"}), ("cs-101",)))
    requests = requests_of(composer)
    # One GPU's default (medium) is not the cohort's: the first it uses instead.
    one_t4 = {"gpu_model": "t4", "gpu_count": 1}
    assert (await requests.for_start(one_t4, admitted)).size == "small"
    two_t4 = {"gpu_model": "t4", "gpu_count": 2, "size": ""}
    assert (await requests.for_start(two_t4, admitted)).size == "large"  # its default
    assert (await requests.for_start(one_t4, Admission())).size == "medium"  # no cohort limit
