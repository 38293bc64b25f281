"""Growing and shrinking a running machine through the composer: the claim-and-attach a
compose uses, all or nothing, and the machine as it was after any failure."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from composespawner.domain.quotas import QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import FabricError
from composespawner.ledger import Actor, DevicesTaken, Ledger, Machine
from composespawner.services.claiming import CLAIM_ATTEMPTS
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.resize import FABRIC_FAILED, MoreGpus
from tests.support.composers import demo_composer
from tests.support.faulty import FaultyFabric

pytestmark = pytest.mark.timeout(30)

ONE_T4 = MachineRequest(gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0)


class RacedLedger(Ledger):
    """A ledger where another claim takes a device first, every time a grow claims."""

    grows = 0

    def grow(self, machine_id: str, *, block_ids: Sequence[str], **terms: Any) -> Machine:
        self.grows += 1
        raise DevicesTaken(list(block_ids))


async def _composer(tmp_path: Path, ledger_class: type[Ledger] = Ledger) -> Composer:
    return demo_composer(tmp_path, ledger_class)


@pytest.fixture
async def composer(tmp_path: Path) -> AsyncIterator[Composer]:
    composer = await _composer(tmp_path)
    yield composer
    await composer.close()


async def _running(composer: Composer, user: str = "u") -> Machine:
    composed = await composer.compose(
        user=user,
        groups=frozenset(),
        server="",
        request=ONE_T4,
        progress=lambda message: None,
        then=("launching", "starting notebook"),
    )
    await composer.record(composed.machine_id, "running", "notebook up")
    return await composer.running_machine(user, "")


def _fabric(composer: Composer) -> FaultyFabric:
    assert isinstance(composer.fabric, FaultyFabric)
    return composer.fabric


async def test_a_grow_claims_and_attaches_more_gpus_and_a_shrink_gives_them_back(
    composer: Composer,
) -> None:
    before = await _running(composer)
    host = before.host_id or ""

    grown = await composer.grow("u", frozenset(), "", 1)

    added = sorted(set(grown.block_ids) - set(before.block_ids))
    assert len(added) == 1
    assert set(added) <= set(_fabric(composer).state.attached(host))
    assert {b: grown.id for b in grown.block_ids} == composer.ledger.holders()
    assert len((await composer.composed(grown)).gpus) == 2

    shrunk = await composer.shrink("u", "", added)

    assert shrunk.block_ids == before.block_ids
    assert not set(added) & set(_fabric(composer).state.attached(host))
    assert not set(added) & set(composer.ledger.holders())


async def test_a_grow_past_the_quota_is_refused_naming_the_limit(composer: Composer) -> None:
    await _running(composer)
    composer.ledger.policy.set_quota_rule(QuotaRule("user", "u", gpus_held=1), Actor("admin"))

    with pytest.raises(ComposeRefused) as refused:
        await composer.grow("u", frozenset(), "", 1)

    assert refused.value.status == 403


async def test_a_grow_whose_attach_fails_is_undone_and_the_machine_is_as_it_was(
    composer: Composer,
) -> None:
    before = await _running(composer)
    host = before.host_id or ""
    attached = _fabric(composer).state.attached(host)
    _fabric(composer).faults.fail_attach(after=1, how="refused")

    with pytest.raises(ComposeFailed, match="nothing was added") as failed:
        await composer.grow("u", frozenset(), "", 2)

    assert str(failed.value) == FABRIC_FAILED
    assert isinstance(failed.value.__cause__, FabricError)
    assert _fabric(composer).state.attached(host) == attached
    now = await composer.running_machine("u", "")
    assert now.block_ids == before.block_ids
    assert composer.ledger.holders() == {b: before.id for b in before.block_ids}


async def test_a_grow_that_loses_every_race_is_refused_saying_others_took_the_gpus(
    tmp_path: Path,
) -> None:
    composer = await _composer(tmp_path, RacedLedger)
    try:
        before = await _running(composer)

        with pytest.raises(ComposeRefused) as refused:
            await composer.grow("u", frozenset(), "", 1)

        assert (str(refused.value), refused.value.status) == (MoreGpus.contention, 409)
        assert refused.value.reason == "contention"
        assert isinstance(composer.ledger, RacedLedger)
        assert composer.ledger.grows == CLAIM_ATTEMPTS
        assert (await composer.running_machine("u", "")).block_ids == before.block_ids
    finally:
        await composer.close()


async def test_only_a_running_server_grows(composer: Composer) -> None:
    with pytest.raises(ComposeRefused, match="start it first") as refused:
        await composer.grow("u", frozenset(), "", 1)

    assert refused.value.status == 404
