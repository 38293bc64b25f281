"""GPU shares through the composer: quarters packed onto one T4, attached once and detached
after the last holder only, a failed joiner leaving the others' GPU alone, and a share
that neither grows nor shrinks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from composespawner.domain.hardware import CompositionTag
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.request import MachineRequest
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from tests.support.composers import demo_composer
from tests.support.faulty import FaultyFabric

pytestmark = pytest.mark.timeout(30)

QUARTER = MachineRequest(
    gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0, size="small", gpu_share=4
)


@pytest.fixture
async def composer(tmp_path: Path) -> AsyncIterator[Composer]:
    composer = demo_composer(tmp_path)
    yield composer
    await composer.close()


def fabric(composer: Composer) -> FaultyFabric:
    assert isinstance(composer.fabric, FaultyFabric)
    return composer.fabric


async def quarter(composer: Composer, user: str) -> ComposedMachine:
    composed = await composer.compose(
        user=user,
        groups=frozenset(),
        server="",
        request=QUARTER,
        progress=lambda message: None,
        then=("launching", "starting notebook"),
    )
    await composer.record(composed.machine_id, "running", "notebook up")
    return composed


async def stop(composer: Composer, machine: ComposedMachine) -> None:
    await composer.release(machine.machine_id, reason="stopped")


async def test_four_quarters_share_one_gpu_attached_until_the_last_stops(
    composer: Composer,
) -> None:
    machines = [await quarter(composer, f"student{i}") for i in range(5)]
    first_four = machines[:4]
    [[gpu]] = {tuple(d.block_id for d in m.gpus) for m in first_four}
    [host] = {m.host for m in first_four}
    assert all(m.gpu_share == 4 for m in machines)
    assert machines[4].gpus[0].block_id != gpu  # the first was full: a second GPU splits
    assert fabric(composer).state.attached(host).count(gpu) == 1
    running = await composer.running_machine("student0", "")
    assert (await composer.composed(running)).gpu_share == 4

    for machine in first_four[:3]:
        await stop(composer, machine)
        assert gpu in fabric(composer).state.attached(host)
    await stop(composer, first_four[3])
    assert gpu not in fabric(composer).state.attached(host)
    assert gpu in composer.ledger.free_blocks()
    assert set(composer.ledger.holds().split) == {machines[4].gpus[0].block_id}


async def test_a_joiner_whose_attach_fails_leaves_the_gpu_to_its_holder(
    composer: Composer,
) -> None:
    first = await quarter(composer, "ada")
    fabric(composer).faults.fail_attach(after=0, how="refused")

    with pytest.raises(ComposeFailed):
        await quarter(composer, "bob")

    gpu = first.gpus[0].block_id
    assert gpu in fabric(composer).state.attached(first.host)  # ada's notebook keeps it
    split = composer.ledger.holds().split[gpu]
    assert (split.holders, split.closing) == (1, False)
    assert composer.ledger.live_machines("bob") == []


async def test_a_share_neither_grows_nor_shrinks(composer: Composer) -> None:
    machine = await quarter(composer, "ada")
    before = await composer.running_machine("ada", "")

    for change in (
        composer.grow("ada", frozenset(), "", 1),
        composer.shrink("ada", "", [machine.gpus[0].block_id]),
    ):
        with pytest.raises(ComposeRefused, match="share") as refused:
            await change
        assert refused.value.status == 409

    assert await composer.running_machine("ada", "") == before
    assert machine.gpus[0].block_id in fabric(composer).state.attached(machine.host)


async def test_the_last_holder_detaches_the_gpu_even_if_it_never_reached_the_mark(
    composer: Composer,
) -> None:
    ada = await quarter(composer, "ada")
    bob = await quarter(composer, "bob")
    gpu = ada.gpus[0].block_id
    # As if ada's compose had stopped before it joined the host's mark.
    tag = CompositionTag(hub=composer.hub_id, machine=ada.machine_id, owner="ada/")
    await composer.fabric.leave_host(ada.host, tag)
    await stop(composer, bob)
    assert gpu in fabric(composer).state.attached(ada.host)

    await stop(composer, ada)  # the last holder: it closes the GPU, with no mark of its own

    assert gpu not in fabric(composer).state.attached(ada.host)
    assert composer.ledger.holds().split == {}
    assert gpu in composer.ledger.free_blocks()
