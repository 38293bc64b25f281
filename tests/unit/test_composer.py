"""Composer: claim, then attach, all-or-nothing; free only what the fabric confirmed.

The service layer runs over a real SQLite ledger and the strict in-process fake
of the fabric (the simulator's own state model, so it refuses whatever the
simulator refuses). Faults come from tests/support/faulty.py, the fake with
switches that fail or hold chosen calls and pass everything else through. Assertions read the
fabric's state and the ledger directly, never the composer's own view.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from datetime import time as clock_time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import Cohort, Session
from composespawner.domain.hardware import CompositionTag, HostMark, Inventory
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.quotas import NO_QUOTA, Quota, QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import FabricError, FabricUnreachable
from composespawner.ledger import (
    Actor,
    DeviceRecord,
    KeepFree,
    Ledger,
    Machine,
    QuotaExceeded,
    RoomClaim,
    ShareClaim,
)
from composespawner.ledger.models import MachineRow
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from tests.support.faulty import AttachFailure, FaultyFabric
from tests.support.inprocess import InProcessFabric

HUB_CONFIG = Path(__file__).resolve().parents[2] / "hub_config"
HUB_ID = "test-hub"
H100_MODEL = "NVIDIA H100 PCIe"
T4_MODEL = "NVIDIA T4"

T4_PAIR_WITH_EXTRAS = MachineRequest(gpu_model="t4", gpu_count=2, network="25g", scratch_gb=1920)


def ask(model: str, count: int) -> MachineRequest:
    return MachineRequest(gpu_model=model, gpu_count=count, network="shared", scratch_gb=0)


def ignore_progress(message: str) -> None:
    del message


class HeldClaimLedger(Ledger):
    """A ledger whose claim waits in its worker thread until the test lets it go."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.claim_entered = threading.Event()
        self.claim_may_go = threading.Event()

    @property
    def is_local_file(self) -> bool:
        # A claim that waits is a database server's: the composer calls it in a
        # worker thread, which is the path under test (SQLite runs on the loop).
        return False

    def claim(
        self,
        machine_id: str,
        *,
        host_id: str | None,
        zone: str,
        block_ids: Sequence[str],
        quota: Quota = NO_QUOTA,
        groups: frozenset[str] = frozenset(),
        host_block: str | None = None,
        keep_free: Sequence[KeepFree] = (),
        cohort: str | None = None,
        room: RoomClaim | None = None,
        share: ShareClaim | None = None,
    ) -> Machine:
        self.claim_entered.set()
        if not self.claim_may_go.wait(timeout=10):
            raise TimeoutError("test never let the claim go")
        return super().claim(
            machine_id,
            host_id=host_id,
            zone=zone,
            block_ids=block_ids,
            quota=quota,
            groups=groups,
            host_block=host_block,
            keep_free=keep_free,
            cohort=cohort,
            room=room,
            share=share,
        )


# ---------------------------------------------------------------------------
# The rig: composer + ledger + fabric, and ways to read them
# ---------------------------------------------------------------------------


@dataclass
class Rig:
    composer: Composer
    ledger: Ledger
    fabric: FaultyFabric

    async def compose(
        self,
        user: str,
        request: MachineRequest,
        *,
        server: str = "",
        groups: frozenset[str] = frozenset(),
        gpu_limit: int | None = None,
        progress: Callable[[str], None] = ignore_progress,
    ) -> ComposedMachine:
        """``gpu_limit``: set the user's own quota of GPUs held at once first."""
        if gpu_limit is not None:
            self.set_gpus_held(user, gpu_limit)
        return await self.composer.compose(
            user=user, groups=groups, server=server, request=request, progress=progress
        )

    def set_gpus_held(self, user: str, limit: int) -> None:
        rule = QuotaRule("user", user, gpus_held=limit)
        self.ledger.policy.set_quota_rule(rule, Actor("test-admin"))

    def machines(self, user: str, server: str = "") -> list[Machine]:
        """Every ledger machine of one server, oldest first (the ledger has no such query)."""
        query = (
            sa.select(MachineRow.id)
            .where(MachineRow.user_name == user, MachineRow.server_name == server)
            .order_by(MachineRow.created_at)
        )
        with self.ledger.engine.connect() as connection:
            ids = list(connection.scalars(query))
        return [m for m in map(self.ledger.machine, ids) if m is not None]

    def machine(self, machine_id: str) -> Machine:
        machine = self.ledger.machine(machine_id)
        assert machine is not None, machine_id
        return machine

    def composed_for(self) -> tuple[str, str]:
        """(host, machine id) of the first tag written: the compose under test."""
        host, tag = self.fabric.tags_written[0]
        assert tag is not None
        assert tag.hub == HUB_ID
        return host, tag.machine

    def host_block(self, host: str) -> str:
        return self.fabric.state.host(host).block_id

    def attachments(self) -> dict[str, str]:
        """Device block → host, for everything attached on the fabric."""
        state = self.fabric.state
        return {b: h.id for h in state.inventory.hosts for b in state.attached(h.id)}

    def hosts_in(self, zone: str) -> list[str]:
        return sorted(h.id for h in self.fabric.state.inventory.hosts if zone in h.zones)

    def model_blocks(self, model: str) -> list[str]:
        return sorted(d.id for d in self.fabric.state.inventory.devices if d.model == model)

    def leftovers(self, machine_id: str, host: str) -> list[str]:
        """What a failed compose left behind; empty once it was fully undone."""
        state, machine = self.fabric.state, self.machine(machine_id)
        found = []
        if state.attached(host):
            found.append(f"{host} still has {state.attached(host)} attached")
        if self.fabric.mark(host) is not None:
            found.append(f"{host} still marked {self.fabric.mark(host)}")
        if machine.state != "failed":
            found.append(f"machine is {machine.state}, not failed")
        if self.ledger.holders():
            found.append(f"ledger still holds {self.ledger.holders()}")
        return found


async def eventually(check: Callable[[], bool], *, what: str, within: float = 5.0) -> None:
    """Poll ``check`` until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {within} s: {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(ledger_class: type[Ledger] = Ledger, snapshot_ttl: float = 0) -> Rig:
        ledger = ledger_class(f"sqlite:///{tmp_path}/ledger-{len(made)}.sqlite")
        ledger.upgrade()
        fabric = FaultyFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml")
        composer = Composer(
            ledger=ledger,
            fabric=fabric,
            catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
            hub_id=HUB_ID,
            snapshot_ttl=snapshot_ttl,
            release_retry_max=0.05,
        )
        made.append(Rig(composer, ledger, fabric))
        return made[-1]

    yield make
    for rig in made:
        await rig.composer.close()


@pytest.fixture
def rig(make_rig: Callable[..., Rig]) -> Rig:
    return make_rig()


# ---------------------------------------------------------------------------
# 1. The happy path, there and back
# ---------------------------------------------------------------------------


async def test_compose_attaches_tags_and_records_then_release_gives_it_all_back(rig: Rig) -> None:
    progress: list[str] = []
    machine = await rig.compose("u", T4_PAIR_WITH_EXTRAS, progress=progress.append)

    state, host = rig.fabric.state, machine.host
    assert [g.model for g in machine.gpus] == ["NVIDIA T4"] * 2
    assert machine.nic is not None
    assert machine.nic.speed_gbps == 25
    assert sum(d.capacity_gb or 0 for d in machine.drives) >= 1920
    devices = tuple(d.block_id for d in (*machine.gpus, machine.nic, *machine.drives))
    assert state.attached(host) == devices
    tag = CompositionTag(hub=HUB_ID, machine=machine.machine_id, owner="u/")
    assert rig.fabric.mark(host) == HostMark.of(tag)
    record = rig.machine(machine.machine_id)
    assert (record.state, record.host_id, record.zone) == ("composed", host, machine.zone)
    assert set(record.block_ids) == set(devices)  # the host is shared: its block is nobody's
    assert rig.ledger.holders() == {b: machine.machine_id for b in record.block_ids}

    expected = [
        f"claiming 2 × NVIDIA T4 16GB in {machine.zone}",
        "attaching GPU 1/2",
        "attaching GPU 2/2",
        "attaching 25 Gb/s network card",
        "attaching scratch NVMe 1/1",
    ]
    assert machine.zone.startswith("rack-")
    assert len(progress) == len(expected), progress
    for message, start in zip(progress, expected, strict=True):
        assert message.startswith(start), (message, start)

    await rig.composer.release(machine.machine_id, reason="server stopped")

    assert rig.attachments() == {}
    assert rig.fabric.mark(host) is None
    released = rig.machine(machine.machine_id)
    assert (released.state, released.block_ids) == ("released", ())
    assert rig.ledger.holders() == {}
    usage = rig.ledger.usage("u")
    assert sorted(u.block_id for u in usage) == sorted(record.block_ids)
    assert {(u.machine_id, u.server_name) for u in usage} == {(machine.machine_id, "")}
    assert all(u.ended_at >= u.started_at for u in usage)

    # Releasing again (a retry, a second stop) changes nothing.
    await rig.composer.release(machine.machine_id, reason="server stopped")
    assert len(rig.ledger.usage("u")) == len(usage)
    assert rig.machine(machine.machine_id).state == "released"


# ---------------------------------------------------------------------------
# 2-3. All-or-nothing: fabric failure and cancellation mid-compose
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["refused", "answer-lost"])
async def test_fabric_failure_mid_compose_undoes_everything(rig: Rig, fault: AttachFailure) -> None:
    # "answer-lost": the fabric did attach the 2nd GPU but we never heard: undo must detach it too.
    rig.fabric.faults.fail_attach(after=1, how=fault)

    with pytest.raises(ComposeFailed) as failed:
        await rig.compose("u", T4_PAIR_WITH_EXTRAS)

    message = str(failed.value)
    assert "GPU fabric" in message, message
    assert "try again" in message.lower(), message
    assert isinstance(failed.value.__cause__, FabricError)
    assert rig.fabric.faults.calls["attach"] == 2, "compose went on attaching after a failure"
    host, machine_id = rig.composed_for()
    assert rig.leftovers(machine_id, host) == []
    assert rig.attachments() == {}
    assert rig.machine(machine_id).failure == message

    # Nothing is left that would block the user's next start.
    rig.fabric.faults.heal()
    again = await rig.compose("u", T4_PAIR_WITH_EXTRAS)
    assert rig.machine(again.machine_id).state == "composed"


async def test_cancelled_compose_undoes_everything_and_stays_cancelled(rig: Rig) -> None:
    held = rig.fabric.faults.fail_attach(after=1, how="hang")  # only cancellation gets it out
    task = asyncio.create_task(rig.compose("u", T4_PAIR_WITH_EXTRAS))
    await asyncio.wait_for(held.reached.wait(), timeout=5)
    host, machine_id = rig.composed_for()
    assert len(rig.fabric.state.attached(host)) == 1  # there is something to undo
    assert rig.machine(machine_id).state == "claimed"

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    await eventually(lambda: not rig.leftovers(machine_id, host), what="the compose undone")
    assert rig.leftovers(machine_id, host) == []
    assert rig.attachments() == {}
    assert rig.machine(machine_id).failure == "The start was cancelled."


# ---------------------------------------------------------------------------
# 4-6. Refusals: quota, nothing fits, co-located hardware
# ---------------------------------------------------------------------------


async def test_quota_refuses_a_second_server_past_the_limit(rig: Rig) -> None:
    await rig.compose("u", ask("t4", 2), server="a", gpu_limit=2)
    held, attached = rig.ledger.holders(), rig.attachments()

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("u", ask("t4", 1), server="b", gpu_limit=2)

    message = str(refused.value)
    assert refused.value.status == 403
    assert "limit is 2 GPUs" in message, message
    assert "server 'a'" in message, message
    assert rig.ledger.holders() == held
    assert rig.attachments() == attached
    [machine_b] = rig.machines("u", "b")
    assert (machine_b.state, machine_b.block_ids) == ("failed", ())
    assert machine_b.failure == message
    # Another user is not charged for u's GPUs.
    await rig.compose("v", ask("t4", 2), gpu_limit=2)


async def test_a_cohorts_quota_refuses_a_model_and_a_count_before_anything_is_stored(
    rig: Rig,
) -> None:
    course = QuotaRule("cohort", "cs-101", models=frozenset({"t4"}), gpus_per_server=1)
    rig.ledger.policy.set_quota_rule(course, Actor("admin"))
    held, attached = rig.ledger.holders(), rig.attachments()

    for request, limit in ((ask("h100", 1), "models"), (ask("t4", 2), "gpus_per_server")):
        with pytest.raises(ComposeRefused) as refused:
            await rig.compose("u", request, groups=frozenset({"cs-101"}))
        assert refused.value.status == 403
        assert isinstance(refused.value.__cause__, QuotaExceeded)
        assert refused.value.__cause__.limit == limit
        assert "cs-101" in str(refused.value)

    assert rig.machines("u") == []  # nothing requested, so nothing to clean up
    assert (rig.ledger.holders(), rig.attachments()) == (held, attached)
    # Outside the cohort the course's rule does not apply.
    await rig.compose("v", ask("t4", 2))


MONDAY_10AM = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
T4_COURSE = Cohort(
    "cs-101",
    sessions=(Session(0, clock_time(9), clock_time(11)),),  # Mondays 09:00-11:00
    reserved_model="t4",
    reserved_gpus=6,
)


async def test_a_session_keeps_its_gpus_from_outsiders_and_gives_them_to_members(rig: Rig) -> None:
    rig.composer.clock = lambda: MONDAY_10AM
    rig.ledger.policy.set_cohort(T4_COURSE, Actor("admin"))
    members = frozenset({"cs-101"})
    assert len(rig.model_blocks(T4_MODEL)) == 8, "the inventory changed: this test needs 8 T4s"

    offer = await rig.composer.offer("v", frozenset(), within=None)
    assert offer.free["t4"].free == 2
    assert offer.kept["t4"] == "6 kept for cohort cs-101's session until 11:00"
    assert (await rig.composer.offer("m", members, within=None)).free["t4"].free == 8

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("v", ask("t4", 3))
    assert refused.value.status == 409
    assert "kept for cohort cs-101's session until 11:00" in str(refused.value)
    await rig.compose("v", ask("t4", 2))  # what the session leaves

    member = await rig.compose("m", ask("t4", 4), groups=members)
    assert rig.machine(member.machine_id).cohort == "cs-101"
    # 2 free, and the session still lacks 2 of its 6: nothing is left for outsiders.
    assert (await rig.composer.offer("w", frozenset(), within=None)).free["t4"].free == 0
    with pytest.raises(ComposeRefused):
        await rig.compose("w", ask("t4", 1))

    rig.composer.clock = lambda: MONDAY_10AM + timedelta(hours=1)  # the session is over
    await rig.compose("w", ask("t4", 1))


async def test_a_session_reserved_in_quarters_keeps_whole_gpus_and_says_in_what(rig: Rig) -> None:
    rig.composer.clock = lambda: MONDAY_10AM
    quarters = replace(T4_COURSE, reserved_gpus=22, reserved_share=4)  # 5.5 GPUs: 6 kept
    rig.ledger.policy.set_cohort(quarters, Actor("admin"))

    offer = await rig.composer.offer("v", frozenset(), within=None)
    assert offer.free["t4"].free == 2
    assert offer.kept["t4"] == (
        "6 kept for cohort cs-101's session (22 quarters reserved) until 11:00"
    )


async def test_no_fit_names_what_is_short_when_another_client_holds_a_device(rig: Rig) -> None:
    h100s = rig.model_blocks(H100_MODEL)
    assert len(h100s) == 4, "the inventory changed: this test needs exactly 4 H100"
    theirs = rig.hosts_in("rack-2")[-1]
    rig.fabric.state.add_resource_block(theirs, h100s[0])  # another client's composition

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("u", ask("h100", 4))

    assert refused.value.status == 409
    assert "Only 3 × NVIDIA H100 80GB" in str(refused.value), str(refused.value)
    assert rig.ledger.holders() == {}
    assert rig.attachments() == {h100s[0]: theirs}  # untouched
    [machine] = rig.machines("u")
    assert machine.state == "failed"


async def test_colocated_devices_only_for_their_owner_group(rig: Rig) -> None:
    outsider, owner = frozenset({"students"}), frozenset({"vision-lab"})

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("eve", ask("rtx6000", 1), groups=outsider)
    assert refused.value.status == 409
    assert rig.ledger.holders() == {}
    assert rig.attachments() == {}
    assert [m.state for m in rig.machines("eve")] == ["failed"]

    outsider_offer = await rig.composer.pool.offer("eve", outsider)
    owner_offer = await rig.composer.pool.offer("ann", owner)
    assert "rtx6000" not in outsider_offer.free
    assert "t4" in outsider_offer.free
    assert "rtx6000" in owner_offer.free
    assert owner_offer.free["rtx6000"].free == 2

    machine = await rig.compose("ann", ask("rtx6000", 2), groups=owner)
    assert [g.chassis for g in machine.gpus] == ["expansion-1"] * 2
    assert set(rig.fabric.state.attached(machine.host)) == {g.block_id for g in machine.gpus}
    assert rig.machine(machine.machine_id).state == "composed"


async def test_chassis_owners_are_worked_out_once_per_inventory(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    owner_of_chassis = Catalog.owner_of_chassis

    def counted(catalog: Catalog, chassis: str) -> str | None:
        asked.append(chassis)
        return owner_of_chassis(catalog, chassis)

    monkeypatch.setattr(Catalog, "owner_of_chassis", counted)
    pool = rig.composer.pool
    inventory = await pool.inventory(fresh=True)  # which syncs the owners into the ledger
    owned = {d.block_id for d in inventory.devices if d.chassis == "expansion-1"}

    for _ in range(3):  # as each spawn of a rush asks
        assert {b: g for b, g in pool.owners(inventory).items() if b in owned} == {
            b: "vision-lab" for b in owned
        }
    assert len(asked) == len(inventory.devices)

    # Another inventory is worked out afresh: here the expansion chassis' GPUs moved.
    moved = Inventory(
        hosts=inventory.hosts,
        devices=tuple(
            replace(d, chassis="rack-1") if d.block_id in owned else d for d in inventory.devices
        ),
        zones=inventory.zones,
    )
    assert not owned & set(pool.owners(moved))
    assert owned <= set(pool.owners(inventory))


async def test_the_offer_counts_only_what_the_quota_left_allows(rig: Rig) -> None:
    await rig.compose("u", ask("t4", 3), gpu_limit=4)
    offer = await rig.composer.offer("u", frozenset(), within=None)
    assert (offer.gpus_in_use, offer.quota_left) == (3, 1)
    assert offer.free["t4"].most_to_ask == 1
    assert offer.free["t4"].most_per_machine == 4
    unlimited = await rig.composer.pool.offer("u", frozenset())
    assert unlimited.free["t4"].most_to_ask == 4


async def test_a_server_with_a_live_machine_is_refused_a_second_one(rig: Rig) -> None:
    first = await rig.compose("u", ask("t4", 1))
    held, attached = rig.ledger.holders(), rig.attachments()

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("u", ask("t4", 1))

    assert refused.value.status == 409
    # The user's words, not the ledger's log line with a machine id in it.
    assert str(refused.value) == (
        "Your default server is already running or starting. Stop it first."
    )
    assert rig.ledger.holders() == held
    assert rig.attachments() == attached
    assert [m.id for m in rig.machines("u")] == [first.machine_id]


async def test_devices_given_to_another_group_underneath_are_a_refusal(rig: Rig) -> None:
    # Another hub on this ledger, with a newer catalog, gave the T4s to vision-lab;
    # this composer's placement (older catalog) still offers them to anyone.
    inventory = await rig.composer.pool.inventory()
    t4s = [d for d in inventory.devices if d.model == "NVIDIA T4"]
    rig.ledger.sync_devices([DeviceRecord.from_device(d, "vision-lab") for d in t4s])

    with pytest.raises(ComposeRefused) as refused:
        await rig.compose("eve", ask("t4", 1), groups=frozenset({"students"}))

    assert refused.value.status == 403
    assert str(refused.value) == (
        "Some of the devices chosen are reserved to another group. Choose others."
    )
    assert rig.ledger.holders() == {}
    assert rig.attachments() == {}
    assert [m.state for m in rig.machines("eve")] == ["failed"]


async def test_a_machine_ended_underneath_while_attaching_is_a_refusal_and_detached(
    rig: Rig,
) -> None:
    held = rig.fabric.faults.fail_attach(after=1, how="hang")
    compose = asyncio.ensure_future(rig.compose("u", ask("t4", 2)))
    await asyncio.wait_for(held.reached.wait(), timeout=5)
    host, machine_id = rig.composed_for()
    # An admin (or the reconciler) ends the machine while its GPUs are attached.
    rig.ledger.transition(machine_id, "stopping", "stopped by an admin")
    held.released.set()

    with pytest.raises(ComposeRefused) as refused:
        await compose

    assert refused.value.status == 409
    assert "ended while it was being set up" in str(refused.value)
    assert rig.leftovers(machine_id, host) == []
    assert rig.attachments() == {}


# ---------------------------------------------------------------------------
# 7. Unknown is not dead
# ---------------------------------------------------------------------------


async def test_release_keeps_devices_held_while_the_fabric_is_unreachable(rig: Rig) -> None:
    machine = await rig.compose("u", T4_PAIR_WITH_EXTRAS)
    machine_id, host = machine.machine_id, machine.host
    held = {b: machine_id for b in rig.machine(machine_id).block_ids}
    rig.fabric.faults.detaches_left = 1  # one detach goes through, then silence

    with pytest.raises(FabricError):
        await rig.composer.release(machine_id, reason="server stopped")

    stopping = rig.machine(machine_id)
    assert stopping.state == "stopping"
    assert rig.ledger.holders() == held  # the detached one too: we never heard it confirmed
    assert len(rig.fabric.state.attached(host)) == 3  # 2 GPUs, NIC, drive: 1 detached

    failures = rig.fabric.faults.errors_raised
    rig.composer.release_soon(machine_id, reason="server stopped")
    await eventually(lambda: rig.fabric.faults.errors_raised > failures, what="a background retry")
    assert rig.machine(machine_id).state == "stopping"
    assert rig.ledger.holders() == held

    rig.fabric.faults.heal()
    await eventually(lambda: rig.machine(machine_id).state == "released", what="released")
    assert rig.ledger.holders() == {}
    assert rig.attachments() == {}
    assert rig.fabric.mark(host) is None


# ---------------------------------------------------------------------------
# 8. Racing composes
# ---------------------------------------------------------------------------


async def test_racing_composes_never_share_a_device(rig: Rig) -> None:
    h100s = rig.model_blocks(H100_MODEL)
    assert len(h100s) == 4, "the inventory changed: this test needs exactly 4 H100"
    users = [f"user{i}" for i in range(10)]

    results = await asyncio.gather(
        *(rig.compose(user, ask("h100", 2)) for user in users), return_exceptions=True
    )

    won = [r for r in results if isinstance(r, ComposedMachine)]
    lost = [r for r in results if not isinstance(r, ComposedMachine)]
    assert len(won) == 2, results
    assert all(isinstance(e, ComposeRefused) and e.status == 409 for e in lost), lost
    assert sorted(g.block_id for m in won for g in m.gpus) == h100s
    assert len({m.host for m in won}) == 2

    expected_holders: dict[str, str] = {}
    for machine in won:
        gpus = {g.block_id for g in machine.gpus}
        assert set(rig.fabric.state.attached(machine.host)) == gpus
        mark = rig.fabric.mark(machine.host)
        assert mark is not None
        assert [m.machine for m in mark.machines] == [machine.machine_id]
        expected_holders.update(dict.fromkeys(gpus, machine.machine_id))
    assert rig.ledger.holders() == expected_holders
    assert set(rig.attachments()) == set(h100s)

    winners = {m.machine_id for m in won}
    for user in users:
        [machine] = rig.machines(user)
        assert machine.state == ("composed" if machine.id in winners else "failed")


# ---------------------------------------------------------------------------
# All-or-nothing (docs/architecture.md invariant 4) at the edges of the claim
# ---------------------------------------------------------------------------


async def test_concurrent_composes_in_one_hub_place_around_each_other(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    t4s = rig.model_blocks("NVIDIA T4")
    users = [f"user{i}" for i in range(len(t4s))]

    with caplog.at_level("INFO"):
        machines = await asyncio.gather(*(rig.compose(user, ask("t4", 1)) for user in users))

    assert sorted(g.block_id for m in machines for g in m.gpus) == sorted(t4s)
    # Each spawn placed around the claims in flight: none lost the compare-and-set.
    assert "lost a race" not in caplog.text
    for machine in machines:
        await rig.composer.release(machine.machine_id, reason="done")
    again = await rig.compose("late", ask("t4", 1))  # released devices are offered again
    assert again.gpus[0].block_id in t4s


async def test_unreachable_fabric_before_the_claim_leaves_no_live_machine(rig: Rig) -> None:
    rig.fabric.faults.unreachable = True

    with pytest.raises(ComposeFailed):
        await rig.compose("u", ask("t4", 1))

    assert rig.ledger.live_machine("u", "") is None
    rig.fabric.faults.heal()
    machine = await rig.compose("u", ask("t4", 1))  # not refused as "already starting"
    assert rig.machine(machine.machine_id).state == "composed"


class ThreadNotingLedger(Ledger):
    """Notes which thread each lifecycle write ran on."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.threads: set[int] = set()

    def request_machine(self, user: str, server: str, request: dict[str, Any]) -> str:
        self.threads.add(threading.get_ident())
        return super().request_machine(user, server, request)

    def advance(
        self,
        machine_id: str,
        *steps: tuple[str, str],
        failure: str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Machine:
        self.threads.add(threading.get_ident())
        return super().advance(machine_id, *steps, failure=failure, manifest=manifest)


async def test_an_sqlite_ledger_is_called_on_the_event_loop(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(ThreadNotingLedger)
    ledger = rig.ledger
    assert isinstance(ledger, ThreadNotingLedger)
    machine = await rig.compose("u", ask("t4", 1))
    await rig.composer.record(machine.machine_id, "launching", "starting notebook")
    assert rig.machine(machine.machine_id).state == "launching"
    assert ledger.threads == {threading.get_ident()}


async def test_compose_cancelled_during_the_claim_holds_nothing(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(HeldClaimLedger)
    ledger = rig.ledger
    assert isinstance(ledger, HeldClaimLedger)
    task = asyncio.create_task(rig.compose("u", ask("t4", 1)))
    try:
        await eventually(ledger.claim_entered.is_set, what="the claim to start")
        task.cancel()
    finally:
        ledger.claim_may_go.set()
    with pytest.raises(asyncio.CancelledError):
        await task

    await eventually(
        lambda: not ledger.holders() and ledger.live_machine("u", "") is None,
        what="the claim released",
        within=2.0,
    )


# ---------------------------------------------------------------------------
# Two hubs on one ledger and fabric: placement reads holders once per snapshot
# ---------------------------------------------------------------------------


@pytest.fixture
async def two_hubs(tmp_path: Path) -> AsyncIterator[tuple[Composer, Composer, Ledger]]:
    """Hubs A and B sharing a ledger and a fabric, each caching for a minute."""
    url = f"sqlite:///{tmp_path}/shared.sqlite"
    Ledger(url).upgrade()
    fabric = InProcessFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml")
    hubs = [
        Composer(
            ledger=Ledger(url),
            fabric=InProcessFabric(fabric.state),
            catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
            hub_id=f"hub-{name}",
            snapshot_ttl=60,
        )
        for name in "ab"
    ]
    yield hubs[0], hubs[1], Ledger(url)
    for hub in hubs:
        await hub.close()


async def compose_on(hub: Composer, user: str, request: MachineRequest) -> ComposedMachine:
    return await hub.compose(
        user=user,
        groups=frozenset(),
        server="",
        request=request,
        progress=ignore_progress,
    )


async def test_a_stale_holders_read_never_refuses_what_another_hub_freed(
    two_hubs: tuple[Composer, Composer, Ledger],
) -> None:
    a, b, ledger = two_hubs
    first = await compose_on(a, "alice", ask("h100", 2))
    await compose_on(a, "amir", ask("h100", 2))
    with pytest.raises(ComposeRefused):
        await compose_on(b, "bo", ask("h100", 2))  # B's cached read: every H100 held

    await a.release(first.machine_id, reason="done")
    again = await compose_on(b, "bea", ask("h100", 2))

    assert {g.block_id for g in again.gpus} == {g.block_id for g in first.gpus}
    assert {ledger.holders()[g.block_id] for g in again.gpus} == {again.machine_id}


async def test_a_stale_holders_read_never_makes_a_double_holder(
    two_hubs: tuple[Composer, Composer, Ledger],
) -> None:
    a, b, ledger = two_hubs
    await compose_on(b, "bo", ask("t4", 1))  # B reads holders while almost all is free
    t4s_left = [d for d in (await a.pool.inventory()).devices if d.model == "NVIDIA T4"][1:]
    taken = [await compose_on(a, f"a{i}", ask("t4", 1)) for i in range(len(t4s_left) - 1)]

    late = await compose_on(b, "bea", ask("t4", 1))  # B's read still shows them free

    holders = ledger.holders()
    assert holders[late.gpus[0].block_id] == late.machine_id
    assert late.gpus[0].block_id not in {m.gpus[0].block_id for m in taken}
    with pytest.raises(ComposeRefused):
        await compose_on(b, "bex", ask("t4", 1))  # and now every T4 is held


# ---------------------------------------------------------------------------
# 8. A hung fabric: nobody waits on it for long
# ---------------------------------------------------------------------------


async def test_the_offer_waits_briefly_then_shows_the_last_inventory_with_its_age(
    rig: Rig,
) -> None:
    rig.fabric.faults.hung = asyncio.Event()
    with pytest.raises(FabricUnreachable, match=r"within 0\.05 s"):
        await rig.composer.pool.offer("u", frozenset(), within=0.05)  # nothing read yet
    assert rig.fabric.faults.calls["inventory"] == 1

    rig.fabric.faults.heal()  # the read that outlived the form lands for the next one
    await rig.composer.pool.inventory()
    fresh = await rig.composer.pool.offer("u", frozenset(), within=0.05)
    assert fresh.inventory_age is None
    assert fresh.free["t4"].free == 8

    rig.fabric.faults.hung = asyncio.Event()
    calls = rig.fabric.faults.calls["inventory"]
    first, second = await asyncio.gather(
        rig.composer.pool.offer("u", frozenset(), within=0.05),
        rig.composer.pool.offer("v", frozenset(), within=0.05),
    )
    for aged in (first, second):
        assert aged.inventory_age is not None
        assert aged.inventory_age >= 0.05
        assert aged.free["t4"].free == 8
    assert rig.fabric.faults.calls["inventory"] == calls + 1, "one read serves every form"
    rig.fabric.faults.heal()


async def test_a_spawn_meeting_a_hung_fabric_is_refused_quickly_holding_nothing(
    rig: Rig,
) -> None:
    rig.composer.fabric_wait = 0.2
    rig.fabric.faults.hung = asyncio.Event()
    began = time.monotonic()
    with pytest.raises(ComposeFailed, match="not answering right now, so nothing was claimed"):
        await rig.compose("u", ask("t4", 1))
    assert time.monotonic() - began < 2
    assert rig.ledger.live_machine("u", "") is None
    assert rig.ledger.holders() == {}
    rig.fabric.faults.heal()


async def test_a_spawn_waits_past_fabric_wait_while_the_fabric_keeps_answering(rig: Rig) -> None:
    # A whole class at once keeps the hub so busy that one inventory read takes longer
    # than fabric_wait, though the fabric answers every request: that is no reason to refuse.
    rig.composer.fabric_wait = 0.1
    answering = rig.fabric.inventory

    async def slowly() -> Inventory:
        await asyncio.sleep(0.35)
        return await answering()

    rig.fabric.inventory = slowly  # type: ignore[method-assign]
    began = time.monotonic()
    machine = await rig.compose("u", ask("t4", 1))
    assert time.monotonic() - began >= 0.35
    assert rig.machine(machine.machine_id).state == "composed"


async def test_a_spawn_places_on_a_current_snapshot_without_a_turn_of_the_loop(
    make_rig: Callable[..., Rig],
) -> None:
    # In a rush each turn of the hub's loop is long (hundreds of spawn requests
    # share it): reading what is already cached must not cost turns.
    rig = make_rig(snapshot_ttl=60)
    rig.composer.fabric_wait = 5  # as in the hub: a spawn waits only so long for a read
    await rig.compose("u", ask("t4", 1))  # the inventory and the holders are read now
    for step in (
        rig.composer.pool.inventory(),
        rig.composer.pool.claimable("v", frozenset(), fresh=False),
    ):
        with pytest.raises(StopIteration):
            step.send(None)  # done at its first step: it never yielded to the loop
    assert rig.fabric.faults.calls["inventory"] == 1


async def test_time_the_hubs_loop_spends_on_other_requests_does_not_count_against_the_fabric(
    rig: Rig,
) -> None:
    # A class's 200 spawn requests keep the hub's loop busy for seconds at a stretch:
    # the fabric's answers wait unread in their sockets, and that is not its fault.
    rig.composer.fabric_wait = 0.5
    answering = rig.fabric.inventory
    answered_at = -math.inf

    async def answered_while_the_hub_was_busy() -> Inventory:
        nonlocal answered_at
        await asyncio.sleep(0)
        time.sleep(1.5)  # noqa: ASYNC251 (the point: the loop blocked on the hub's own work)
        await asyncio.sleep(0.01)  # the answer, read once the loop is free again
        inventory = await answering()
        answered_at = time.monotonic()
        return inventory

    rig.fabric.inventory = answered_while_the_hub_was_busy  # type: ignore[method-assign]
    rig.fabric.seconds_since_answer = lambda: time.monotonic() - answered_at  # type: ignore[method-assign]
    machine = await rig.compose("u", ask("t4", 1))
    assert rig.machine(machine.machine_id).state == "composed"


async def test_a_release_in_the_background_marks_stopping_and_keeps_devices_held(
    rig: Rig,
) -> None:
    machine = await rig.compose("u", ask("t4", 2))
    held = {b: machine.machine_id for b in rig.machine(machine.machine_id).block_ids}
    rig.fabric.faults.detaches_left = 0

    await rig.composer.release_in_background(machine.machine_id, reason="server stopped")

    assert rig.machine(machine.machine_id).state == "stopping"
    await eventually(lambda: rig.fabric.faults.errors_raised > 1, what="retries in the background")
    assert rig.ledger.holders() == held  # unknown is not dead
    rig.fabric.faults.heal()
    await eventually(lambda: rig.machine(machine.machine_id).state == "released", what="released")
    assert rig.ledger.holders() == {}
    assert rig.attachments() == {}


async def test_a_restart_waits_for_the_last_machine_to_be_given_back(rig: Rig) -> None:
    rig.composer.fabric_wait = 5
    first = await rig.compose("u", ask("t4", 2))
    await rig.composer.release_in_background(first.machine_id, reason="server stopped")
    assert rig.machine(first.machine_id).state == "stopping"

    second = await rig.compose("u", ask("t4", 2))  # not "already running or starting"
    assert rig.machine(first.machine_id).state == "released"
    assert rig.machine(second.machine_id).state == "composed"


async def test_a_restart_while_the_fabric_withholds_the_release_says_so(rig: Rig) -> None:
    rig.composer.fabric_wait = 0.2
    first = await rig.compose("u", ask("t4", 1))
    rig.fabric.faults.detaches_left = 0
    await rig.composer.release_in_background(first.machine_id, reason="server stopped")

    with pytest.raises(ComposeRefused, match="still giving the devices of its last machine"):
        await rig.compose("u", ask("t4", 1))
    assert rig.machine(first.machine_id).state == "stopping"
    rig.fabric.faults.heal()
    await eventually(lambda: rig.machine(first.machine_id).state == "released", what="released")
