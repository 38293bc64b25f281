"""A reclaim ends only the kernels holding the GPU it takes, where the source names them.

NVML lists the processes holding each GPU and the reclaimer's source names the kernel
each belongs to (``activity/processes.py``); the same real SQLite ledger, composer on
the strict in-process fabric and strict kernels API as ``test_reclaimer.py``, with a
server holding two T4s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from composespawner.domain.activity import ActivityReading, GpuActivity, Holder, owned_by
from composespawner.domain.reclaim import (
    Decision,
    kernels_holding,
    reclaim_times,
    reclaims_that_wait,
)
from composespawner.ledger import Machine
from composespawner.services.composer import Composer
from composespawner.services.kernels import NotebookKernels
from composespawner.services.reclaimer import Action, HeldGpu, Reclaimer, spare_other_gpus
from tests.support.activity_fakes import (
    TOKEN,
    FakeKernels,
    FakeKernelsServer,
    ScriptedActivity,
    busy,
    idle,
)
from tests.support.composers import demo_composer
from tests.support.faulty import FaultyFabric
from tests.unit.test_reclaimer import ONE_T4, POLICY, running_on, sweeps

pytestmark = pytest.mark.timeout(60)


def held_by(activity: GpuActivity, *holders: Holder) -> GpuActivity:
    return replace(activity, processes=len(holders), holders=holders)


@dataclass
class Driver:
    """The GPUs as NVML reads them: the holders the test set, less the processes of the
    kernels shut down since (a CUDA context ends with its process)."""

    scripted: ScriptedActivity
    kernels: FakeKernels

    async def read(self, host_id: str) -> ActivityReading:
        reading = await self.scripted.read(host_id)
        running = set(self.kernels.kernel_ids("u", ""))
        gpus = {}
        for uuid, gpu in reading.gpus.items():
            if gpu.holders is not None:
                alive = [h for h in gpu.holders if h.kernel_id is None or h.kernel_id in running]
                gpu = held_by(gpu, *alive)
            gpus[uuid] = gpu
        return replace(reading, gpus=gpus)


@dataclass
class TwoGpus:
    composer: Composer
    source: ScriptedActivity
    kernels: FakeKernels
    reclaimer: Reclaimer
    machine: Machine
    blocks: tuple[str, str]
    uuids: tuple[str, str]

    @property
    def host(self) -> str:
        return self.machine.host_id or ""

    def attached(self) -> list[str]:
        fabric = self.composer.fabric
        assert isinstance(fabric, FaultyFabric)
        return [b for b in self.blocks if b in fabric.state.attached(self.host)]

    async def sweeps(self, start: float, end: float) -> dict[float, list[Action]]:
        return await sweeps(self.reclaimer, start, end)


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[TwoGpus]:
    server = FakeKernelsServer(FakeKernels())
    server.start()
    composer = demo_composer(tmp_path)
    client = NotebookKernels(server.url, TOKEN, timeout=5.0)
    try:
        machine = await running_on(composer, request=replace(ONE_T4, gpu_count=2))
        inventory = await composer.pool.known_inventory()
        devices = [d for b in machine.block_ids if (d := inventory.device(b)) and d.kind == "gpu"]
        assert len(devices) == 2
        assert all(d.uuid for d in devices)
        source = ScriptedActivity()
        driver = Driver(source, server.fake)
        reclaimer = Reclaimer(composer, driver, site_policy=POLICY, kernels=client)
        yield TwoGpus(
            composer,
            source,
            server.fake,
            reclaimer,
            machine,
            (devices[0].block_id, devices[1].block_id),
            (str(devices[0].uuid).lower(), str(devices[1].uuid).lower()),
        )
    finally:
        await client.close()
        await composer.close()
        await server.stop()


async def test_a_reclaim_ends_only_the_kernel_holding_the_idle_gpu(two: TwoGpus) -> None:
    # k1 holds the first T4 (and a data loader's worker of it too), without work; k2
    # trains on the second; k3 holds no GPU. Only k1 goes, with the first T4.
    two.kernels.run("u", "", "k1", "k2", "k3")
    first = held_by(idle(two.uuids[0], held=True), Holder(101, "k1"), Holder(102, "k1"))
    second = held_by(busy(two.uuids[1]), Holder(201, "k2"))
    two.source.set(two.host, first, second)

    done = await two.sweeps(0, 600)

    kinds = {at: [(a.kind, a.block_id, a.outcome) for a in acts] for at, acts in done.items()}
    assert {at: acts for at, acts in kinds.items() if acts} == {
        300: [("warn", two.blocks[0], "done")],
        600: [("reclaim", two.blocks[0], "done")],
    }
    assert "1 kernel(s)" in done[600][0].detail
    assert two.kernels.deletes() == ["/user/u/api/kernels/k1"]
    assert two.kernels.kernel_ids("u", "") == ["k2", "k3"]
    assert two.attached() == [two.blocks[1]]


async def test_a_kernel_holding_a_busy_gpu_too_keeps_its_idle_one(two: TwoGpus) -> None:
    # k1 holds both T4s and works on the second: ending it for the first would end that
    # work, so the first waits (warned) while the second is in use.
    two.kernels.run("u", "", "k1")
    both = (Holder(101, "k1"),)
    two.source.set(
        two.host,
        held_by(idle(two.uuids[0], held=True), *both),
        held_by(busy(two.uuids[1]), *both),
    )

    done = await two.sweeps(0, 900)

    assert [a.kind for acts in done.values() for a in acts] == ["warn"]
    assert two.kernels.deletes() == []
    assert two.attached() == list(two.blocks)


async def test_a_gpu_a_program_outside_the_kernels_holds_is_taken_without_ending_one(
    two: TwoGpus,
) -> None:
    # A terminal's program holds the first T4 without work: no kernel holds it, so none
    # is shut down; the GPU is detached under the program, as its warning said.
    two.kernels.run("u", "", "k1")
    two.source.set(
        two.host,
        held_by(idle(two.uuids[0], held=True), Holder(555, None)),
        held_by(busy(two.uuids[1]), Holder(101, "k1")),
    )

    done = await two.sweeps(0, 600)

    [reclaim] = done[600]
    assert (reclaim.kind, reclaim.outcome, reclaim.detail) == (
        "reclaim",
        "done",
        "0 kernel(s) shut down",
    )
    assert two.kernels.deletes() == []
    assert two.attached() == [two.blocks[1]]


async def test_a_kernel_that_took_the_gpu_since_the_reading_is_not_broken_by_the_detach(
    two: TwoGpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While k1 is being shut down the user runs a cell on k2 that takes the idle T4:
    # read again before the detach, it is held by k2, so it stays for the next pass.
    two.kernels.run("u", "", "k1", "k2")
    second = held_by(busy(two.uuids[1]), Holder(201, None))
    two.source.set(two.host, held_by(idle(two.uuids[0], held=True), Holder(101, "k1")), second)
    handle = two.kernels.handle

    def k2_takes_it(method: str, user: str, server: str, kernel_id: str | None) -> Any:
        if method == "DELETE":
            taken = held_by(idle(two.uuids[0], held=True), Holder(301, "k2"))
            two.source.set(two.host, taken, second)
        return handle(method, user, server, kernel_id)

    monkeypatch.setattr(two.kernels, "handle", k2_takes_it)

    done = await two.sweeps(0, 600)

    [skipped] = done[600]
    assert (skipped.kind, skipped.outcome) == ("reclaim", "skipped")
    assert "still held by kernel:k2" in skipped.detail
    assert two.kernels.deletes() == ["/user/u/api/kernels/k1"]
    assert two.attached() == list(two.blocks)
    # The next pass reads k2 holding it, still without work: k2 goes with it.
    [reclaim] = (await two.sweeps(630, 630))[630]
    assert (reclaim.kind, reclaim.outcome) == ("reclaim", "done")
    assert two.kernels.kernel_ids("u", "") == []
    assert two.attached() == [two.blocks[1]]


async def test_holders_saved_in_the_watch_survive_the_ledger(two: TwoGpus) -> None:
    two.kernels.run("u", "", "k1")
    two.source.set(
        two.host,
        held_by(idle(two.uuids[0], held=True), Holder(9, None), Holder(101, "k1")),
        busy(two.uuids[1]),  # a source that cannot name holders
    )

    await two.sweeps(0, 0)

    watches = two.composer.ledger.reclaims.watches()
    assert watches[(two.machine.id, two.blocks[0])].holders == ("kernel:k1", "pid:9")
    assert watches[(two.machine.id, two.blocks[1])].holders is None


# -- deciding: pure ------------------------------------------------------------------


def test_the_kernels_a_reclaim_ends_are_those_holding_it_or_all_when_unknown() -> None:
    assert kernels_holding(("kernel:a", "kernel:b", "pid:7")) == {"a", "b"}
    assert kernels_holding(("pid:7",)) == frozenset()
    assert kernels_holding(None) is None


@pytest.mark.parametrize(
    ("reclaiming", "staying", "waits"),
    [
        # Holders known: wait only for a holder shared with a GPU that stays.
        ({"a": ("kernel:1",)}, {"b": ("kernel:2",)}, set()),
        ({"a": ("kernel:1",)}, {"b": ("kernel:1", "kernel:2")}, {"a"}),
        ({"a": ("pid:5",)}, {"b": ("pid:5",)}, {"a"}),
        ({"a": ("kernel:1",)}, {"b": ()}, set()),
        # A GPU that stays with unknown holders may be used by any kernel.
        ({"a": ("kernel:1",)}, {"b": None}, {"a"}),
        # Holders unknown: every kernel goes, so any GPU that stays makes it wait.
        ({"a": None}, {"b": ("kernel:2",)}, {"a"}),
        ({"a": None, "b": None}, {}, set()),
        ({"a": ("kernel:1",), "b": ("kernel:1",)}, {}, set()),
    ],
)
def test_a_reclaim_waits_while_its_kernels_may_use_a_gpu_that_stays(
    reclaiming: dict[str, tuple[str, ...] | None],
    staying: dict[str, tuple[str, ...] | None],
    waits: set[str],
) -> None:
    assert reclaims_that_wait(reclaiming, staying) == waits


async def test_spare_other_gpus_keeps_the_reclaims_that_end_no_kernel_of_a_gpu_that_stays(
    two: TwoGpus,
) -> None:
    first, second = (HeldGpu(two.machine, b, u) for b, u in zip(two.blocks, two.uuids, strict=True))
    reclaim = Decision("reclaim", "idle 700 s after a warning")
    detach = Decision("detach", "nothing held it")
    unknown = {first.key: None, second.key: None}
    assert spare_other_gpus([(first, reclaim)], [first, second], unknown) == []
    assert spare_other_gpus([(first, detach)], [first, second], unknown) == [(first, detach)]
    both = [(first, reclaim), (second, reclaim)]
    assert spare_other_gpus(both, [first, second], unknown) == both
    apart = {first.key: ("kernel:1",), second.key: ("kernel:2",)}
    assert spare_other_gpus([(first, reclaim)], [first, second], apart) == [(first, reclaim)]


def test_a_warned_gpu_goes_with_the_warned_gpus_it_is_entangled_with() -> None:
    # a and b share kernel 1: a goes when b is due too; c is apart: on its own time;
    # d shares kernel 2 with e, which is not warned about: d waits, with no time.
    warned = {
        "a": (("kernel:1",), 100.0),
        "b": (("kernel:1", "kernel:3"), 160.0),
        "c": (("kernel:4",), 130.0),
        "d": (("kernel:2",), 90.0),
    }
    assert reclaim_times(warned, {"e": ("kernel:2",), "f": ()}) == {
        "a": 160.0,
        "b": 160.0,
        "c": 130.0,
        "d": None,
    }
    # Holders unknown anywhere: a server's GPUs go only all at once.
    assert reclaim_times({"a": (None, 100.0), "b": (("kernel:1",), 50.0)}, {}) == {
        "a": 100.0,
        "b": 100.0,
    }
    assert reclaim_times({"a": (("kernel:1",), 100.0)}, {"b": None}) == {"a": None}


async def test_a_strangers_process_naming_a_kernel_ends_no_kernel(two: TwoGpus) -> None:
    # The probe's: a process of another account (4242) put kernel-k3.json on its command
    # line; k3 is the owner's (1000) and holds no GPU. Taken at its word, the reclaim of
    # the T4 it holds would shut k3 down; it is a program that loses the T4, no kernel.
    two.reclaimer.notebook_uids = lambda machine: {1000} if machine.user_name == "u" else None
    two.kernels.run("u", "", "k2", "k3")
    two.source.set(
        two.host,
        held_by(idle(two.uuids[0], held=True), Holder(301, "k3", 4242)),
        held_by(busy(two.uuids[1]), Holder(201, "k2", 1000)),
    )

    done = await two.sweeps(0, 600)

    assert [(a.kind, a.block_id) for a in done[600]] == [("reclaim", two.blocks[0])]
    assert "0 kernel(s)" in done[600][0].detail
    assert two.kernels.deletes() == []
    assert two.kernels.kernel_ids("u", "") == ["k2", "k3"]
    assert two.attached() == [two.blocks[1]]


def test_a_holders_word_counts_only_for_the_notebooks_own_accounts() -> None:
    gpu = held_by(idle("aaaa", held=True), Holder(1, "k1", 1000), Holder(2, "k1", 4242))
    owned = owned_by(gpu, {1000})
    assert owned.holders == (Holder(1, "k1", 1000), Holder(2, None, 4242))
    assert owned_by(gpu, None).holders is None  # whose the notebook is, unknown
    unread = held_by(idle("aaaa", held=True), Holder(1, "k1", None), Holder(2, None, None))
    assert owned_by(unread, {1000}).holders is None  # a kernel's account unread: unknown
    assert owned_by(idle("aaaa", held=True), {1000}).holders is None  # DCGM named none
