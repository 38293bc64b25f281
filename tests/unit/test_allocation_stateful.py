"""Allocation under faults: a Hypothesis state machine over the real ledger, placement and composer.

Each example boots a hub (a :class:`Composer` over a real SQLite ledger, copied
from a file migrated once per run) in front of the strict in-process fabric
with faults on cue (tests/support/faulty.py), as :class:`CheckedFabric`, which
also records any call the composer should never make. Rules compose and
release machines, switch faults on and off, let another client take or disable
devices directly in the fabric's state, restart the hub between calls, and retry the releases that
could not finish. After every step the invariants of docs/architecture.md are read
off the ledger and the fabric's state (never the composer's own view).

Background retries are the one thing driven by a rule instead of by the clock:
the composer's ``release_soon`` is recorded (and every machine left ``stopping``
must have been handed to it, unless a hub restart orphaned it), and
``retry_pending_releases`` heals the fabric and then runs the real
``Composer.release_soon`` for every machine left ``stopping``. That keeps each
example deterministic, so Hypothesis can replay and shrink a failure.

Hypothesis switches rules off at random in each example (swarm testing), so
the initialize rule already composes a few machines and sets a fabric fault.

Every example counts itself (``EXAMPLES``); ``TestAllocation`` fails unless at
least ``SETTINGS.max_examples`` examples ran, and
``pytest --hypothesis-show-statistics`` reports the count ("200 passing") and
how often each outcome (composed, refused, failed, release not confirmed...)
came up.

``test_never_composes_on_a_host_another_client_took`` replays, step by step,
the shortest failing sequence the machine found.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from hypothesis import Phase, currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import CompositionTag, HostMark, Inventory
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.quotas import QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import FabricError
from composespawner.ledger import HOLDING, STATES, TERMINAL, Actor, Ledger, can_transition
from composespawner.ledger.models import (
    DeviceRow,
    DeviceShareRow,
    HostRoomRow,
    MachineEventRow,
    MachineRow,
)
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.reconcile import Reconciler, ServerView
from fabricsim.inventory import DeviceSpec, load_inventory
from fabricsim.state import FabricState
from harness.paths import HUB_CONFIG
from tests.support.faulty import AttachFailure, Faults, FaultyFabric
from tests.support.inprocess import InProcessFabric

T = TypeVar("T")

SETTINGS = settings(
    max_examples=200,
    stateful_step_count=20,
    deadline=None,
    # No .hypothesis/ directory in the work tree; a failure prints its steps.
    database=None,
    # The explain phase traces every line of a failing example: minutes here, for a hint.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)

HUB_ID = "hub-under-test"
OTHER_HUB = "someone-else"
CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")
INVENTORY = load_inventory(HUB_CONFIG / "fabric_inventory.toml")
DEVICES: dict[str, DeviceSpec] = {d.id: d for d in INVENTORY.devices}
HOST_BLOCKS = {h.block_id: h.id for h in INVENTORY.hosts}  # a host's own block → the host

USERS = ("u1", "u2", "u3", "u4")
GROUPS = {
    "u1": frozenset({"vision-lab"}),
    "u2": frozenset(),
    "u3": frozenset({"vision-lab", "physics"}),
    "u4": frozenset({"physics"}),
}
SERVERS = ("", "big", "small")
# A machine between two rules: compose and release run to completion inside one rule.
AT_REST = frozenset({"composed", "running", "stopping"})
ATTACHED = frozenset({"composed", "launching", "running"})
# How the k-th attach fails: no answer, the answer lost after it took effect, a failed task.
ATTACH_FAILURES: tuple[AttachFailure, ...] = ("no-answer", "answer-lost", "task-failed")
STEP_TIMEOUT = 20.0  # seconds for one rule's coroutine; a hang is a bug, not a slow machine

LOG = logging.getLogger("tests.allocation_stateful")


def _owner(block_id: str) -> str | None:
    device = DEVICES.get(block_id)
    return CATALOG.owner_of_chassis(device.chassis) if device else None


COLOCATED_MODELS = frozenset(
    m.id
    for m in CATALOG.gpu_models
    if m.fabric_models & {d.model for d in INVENTORY.devices if _owner(d.id)}
)


# ---------------------------------------------------------------------------
# Run bookkeeping: the migrated template ledger and the example counter
# ---------------------------------------------------------------------------


@dataclass
class Examples:
    finished: int = 0


EXAMPLES = Examples()


class TemplateLedger:
    """An SQLite ledger migrated once per run; each example works on a copy."""

    def __init__(self) -> None:
        self.dir: Path | None = None

    @property
    def path(self) -> Path:
        if self.dir is None:
            raise RuntimeError("TemplateLedger.create() was not called")
        return self.dir / "template.sqlite"

    def create(self) -> None:
        # tmpfs when there is one: an example commits a few hundred small transactions.
        shm = Path("/dev/shm")
        self.dir = Path(tempfile.mkdtemp(prefix="allocation-", dir=shm if shm.is_dir() else None))
        ledger = Ledger(f"sqlite:///{self.path}")
        try:
            ledger.upgrade()
        finally:
            ledger.close()  # the last close checkpoints the WAL into the file

    def remove(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir)
            self.dir = None


TEMPLATE = TemplateLedger()


# ---------------------------------------------------------------------------
# The fabric, with faults on cue (tests/support/faulty.py) and a record of misuse
# ---------------------------------------------------------------------------


@dataclass
class Watch:
    """What another client does behind the hub's back, and the hub's calls it should never make."""

    foreign: dict[str, str] = field(default_factory=dict)  # block → host, by the other client
    misuse: list[str] = field(default_factory=list)  # calls the composer should never make


class CheckedFabric(FaultyFabric):
    """The faulty in-process fake (tests/support/faulty.py), checking the composer's use of it.

    Put a machine on a host's mark only after the ledger placed it there, attach
    only to a host whose mark lists the machine that holds the device, never
    touch another client's host or mark, nothing after close(), and no call the
    strict fake refuses unless another client took or disabled something.
    """

    def __init__(self, state: FabricState, faults: Faults, ledger: Ledger, watch: Watch) -> None:
        super().__init__(state, faults)
        self.ledger = ledger
        self.watch = watch

    async def inventory(self) -> Inventory:
        self._note_after_close("inventory")
        return await super().inventory()

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        self._note_after_close("host_mark")
        return await super().host_mark(system_id)

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        self._note_after_close("join_host")
        machine = self.ledger.machine(tag.machine)
        if tag.hub != HUB_ID or machine is None or machine.host_id != system_id:
            self.watch.misuse.append(f"join_host({system_id}, {tag}) before the ledger placed it")
        before = self.mark(system_id)
        await super().join_host(system_id, tag)
        if before is not None and before.hub != HUB_ID and self.mark(system_id) != before:
            # Joining is conditional (a refusal is fine); overwriting is the misuse.
            self.watch.misuse.append(f"join_host({system_id}, {tag}) overwrote {before}")

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        self._note_after_close("leave_host")
        current = self.mark(system_id)
        if current is not None and current.hub != HUB_ID:
            self.watch.misuse.append(f"leave_host({system_id}) over another's mark {current}")
        await super().leave_host(system_id, tag)

    async def attach(self, system_id: str, block_id: str) -> None:
        self._note_after_close("attach")
        self._check_attach(system_id, block_id)
        await super().attach(system_id, block_id)

    async def detach(self, system_id: str, block_id: str) -> None:
        self._note_after_close("detach")
        self._check_detach(system_id, block_id)
        await super().detach(system_id, block_id)

    def refused(self, error: FabricError) -> None:
        if not (self.watch.foreign or self.state.disabled()):
            self.watch.misuse.append(f"the fabric refused with nobody else about: {error!r}")

    def _note_after_close(self, call: str) -> None:
        if self.closed:
            self.watch.misuse.append(f"{call} after close()")

    def _check_attach(self, system_id: str, block_id: str) -> None:
        mark = self.mark(system_id)
        holder = self.ledger.holders().get(block_id)
        machine = self.ledger.machine(holder) if holder else None
        split = self.ledger.holds().split.get(block_id)
        if mark is None or mark.hub != HUB_ID:
            self.watch.misuse.append(f"attach({system_id}, {block_id}) to a host not marked ours")
        elif split is not None:
            # A GPU held in shares: split for this host, for a holder the mark lists.
            if split.host_id != system_id or not self._share_holders(block_id) & _ids(mark):
                self.watch.misuse.append(f"attach({system_id}, {block_id}) not split for it")
        elif machine is None or machine.host_id != system_id or machine.id not in _ids(mark):
            self.watch.misuse.append(f"attach({system_id}, {block_id}) before the ledger gave it")

    def _share_holders(self, block_id: str) -> set[str]:
        query = sa.select(DeviceShareRow.machine_id).where(DeviceShareRow.block_id == block_id)
        with self.ledger.engine.connect() as connection:
            return set(connection.scalars(query))

    def _check_detach(self, system_id: str, block_id: str) -> None:
        mark = self.mark(system_id)
        attached_here = self.state.holder(block_id) == system_id
        if attached_here and (mark is None or mark.hub != HUB_ID):
            self.watch.misuse.append(f"detach({system_id}, {block_id}) from a host not ours")


def _ids(mark: HostMark) -> set[str]:
    return {m.machine for m in mark.machines}


# ---------------------------------------------------------------------------
# What the invariants read: the ledger and the fabric, at one moment
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    user: str
    server: str
    state: str
    host: str | None
    cores: int | None
    memory_gib: int | None


@dataclass(frozen=True, slots=True)
class HostRoom:
    cores: int
    memory_gib: int
    slots: int
    cores_held: int
    memory_gib_held: int
    slots_held: int
    machines: int


@dataclass(frozen=True)
class View:
    machines: dict[str, Row]
    holders: dict[str, str]  # block → machine id, from the ledger
    events: dict[str, list[tuple[str | None, str]]]  # machine id → (from, to), in order
    attached: dict[str, list[str]]  # host → device blocks attached, from the fabric
    marks: dict[str, HostMark]  # host → mark, every mark on the fabric
    rooms: dict[str, HostRoom]  # host → its room in the ledger
    # GPUs held in shares: block → (size, its host, holders counted, the machines with a
    # slot, leaving ones included: they hold it until they end)
    split: dict[str, tuple[int, str, int, set[str]]] = field(default_factory=dict)

    def held(self, machine_id: str) -> set[str]:
        """What a machine holds: whole blocks and its shares' GPUs."""
        whole = {b for b, m in self.holders.items() if m == machine_id}
        return whole | {b for b, (_, _, _, slots) in self.split.items() if machine_id in slots}

    def held_whole(self, machine_id: str) -> set[str]:
        return {b for b, m in self.holders.items() if m == machine_id}

    def holders_of(self, block: str) -> set[str]:
        """Every machine holding ``block``: its one whole holder, or its shares' holders."""
        whole = {self.holders[block]} if block in self.holders else set()
        return whole | (self.split[block][3] if block in self.split else set())

    def share_of(self, machine_id: str) -> float:
        """The GPUs a machine's shares count for."""
        return sum(1 / size for size, _, _, slots in self.split.values() if machine_id in slots)

    def ours(self) -> dict[str, HostMark]:
        return {h: t for h, t in self.marks.items() if t.hub == HUB_ID}

    def live(self) -> list[Row]:
        """Live machines, by (user, server): unique among them, unlike their random ids."""
        # Rules pick machines by index: the order must be the same when Hypothesis replays.
        live = [m for m in self.machines.values() if m.state not in TERMINAL]
        return sorted(live, key=lambda m: (m.user, m.server))


def read_view(ledger: Ledger, fabric: InProcessFabric) -> View:
    with ledger.engine.connect() as connection:
        rows = connection.execute(
            sa.select(
                MachineRow.id,
                MachineRow.user_name,
                MachineRow.server_name,
                MachineRow.state,
                MachineRow.host_id,
                MachineRow.cores,
                MachineRow.memory_gib,
            )
        )
        machines = {r[0]: Row(*r) for r in rows}
        room_rows = connection.execute(sa.select(HostRoomRow))
        rooms = {
            r.host_id: HostRoom(
                r.cores,
                r.memory_gib,
                r.slots,
                r.cores_held,
                r.memory_gib_held,
                r.slots_held,
                r.machines,
            )
            for r in room_rows
        }
        events: dict[str, list[tuple[str | None, str]]] = {}
        query = sa.select(
            MachineEventRow.machine_id, MachineEventRow.from_state, MachineEventRow.to_state
        ).order_by(MachineEventRow.id)
        for machine_id, from_state, to_state in connection.execute(query):
            events.setdefault(machine_id, []).append((from_state, to_state))
        split: dict[str, tuple[int, str, int, set[str]]] = {}
        gpus_split = sa.select(
            DeviceRow.block_id, DeviceRow.share_size, DeviceRow.share_host, DeviceRow.share_holders
        ).where(DeviceRow.share_size.is_not(None))
        for block, size, host, holders in connection.execute(gpus_split):
            split[block] = (size, host, holders, set())
        for block, machine_id in connection.execute(
            sa.select(DeviceShareRow.block_id, DeviceShareRow.machine_id)
        ):
            assert block in split, f"{machine_id} holds a share of {block}, which is not split"
            split[block][3].add(machine_id)
    hosts = [h.id for h in INVENTORY.hosts]
    marks = {h: t for h in hosts if (t := fabric.mark(h)) is not None}
    return View(
        machines=machines,
        holders=ledger.holders(),
        events=events,
        attached={h: list(fabric.state.attached(h)) for h in hosts},
        marks=marks,
        rooms=rooms,
        split=split,
    )


def device_blocks(blocks: Iterable[str]) -> set[str]:
    return {b for b in blocks if b not in HOST_BLOCKS}


def gpus(blocks: Iterable[str]) -> int:
    return sum(1 for b in blocks if b in DEVICES and DEVICES[b].kind == "gpu")


def check_one_holder(view: View, state: FabricState) -> None:
    """Invariant 1: one holder per block, in the ledger and on the fabric."""
    seen = Counter(b for blocks in view.attached.values() for b in blocks)
    assert all(n == 1 for n in seen.values()), f"attached to two hosts: {seen}"
    for host, blocks in view.attached.items():
        for block in blocks:
            assert state.holder(block) == host, (
                f"{block} on {host} but held by {state.holder(block)}"
            )
    for block, machine_id in view.holders.items():
        assert machine_id in view.machines, f"{block} held by unknown machine {machine_id}"
    # Invariant 12: never whole and in shares; never more holders than slots.
    for block, (size, _, counted, slots) in view.split.items():
        assert block not in view.holders, f"{block} held whole and in shares"
        assert 0 <= counted <= size, f"{block}: {counted} holders of {size} slots"
        staying = {m for m in slots if view.machines[m].state not in ("stopping", *TERMINAL)}
        assert len(staying) <= counted, f"{block}: {sorted(staying)} hold it, {counted} counted"


def check_ours_attached(view: View) -> None:
    """Invariant 2: attached machines have their devices on their host, whose mark lists
    them; our hosts carry only devices their listed machines hold."""
    for m in view.live():
        if m.state not in ATTACHED:
            continue
        assert m.host is not None, f"{m} is attached but has no host"
        mark = view.marks.get(m.host)
        tag = CompositionTag(hub=HUB_ID, machine=m.id, owner=f"{m.user}/{m.server}")
        assert mark is not None, f"{m}: host not marked"
        assert tag in mark.machines, f"{m}: host marked {mark}"
        held = device_blocks(view.held(m.id))
        assert held <= set(view.attached[m.host]), (
            f"{m}: ledger holds {sorted(held)}, fabric has {view.attached[m.host]} attached"
        )
    for host, mark in view.ours().items():
        listed = _ids(mark)
        for machine_id in listed:
            owner = view.machines.get(machine_id)
            assert owner is not None, f"{host} marked for unknown machine {machine_id}"
            assert owner.state not in TERMINAL, f"{host} marked for {owner}"
            assert owner.host == host, f"{host} marked for {owner}, placed elsewhere"
        strays = [b for b in view.attached[host] if not view.holders_of(b) & listed]
        assert not strays, f"{host} ({mark}) has {strays} attached, not held by {listed}"
    for block, machine_id in view.holders.items():
        state = view.machines[machine_id].state
        assert state in HOLDING, f"{block} held by {machine_id}, which is {state}"


def check_host_room(view: View) -> None:
    """Invariant 10: no host over capacity, and what the ledger says is held of a host is
    what its live machines hold: their cores and memory, a slot for each device."""
    for host, room in view.rooms.items():
        assert 0 <= room.cores_held <= room.cores, f"{host}: {room}"
        assert 0 <= room.memory_gib_held <= room.memory_gib, f"{host}: {room}"
        assert 0 <= room.slots_held <= room.slots, f"{host}: {room}"
        on_it = [m for m in view.live() if m.host == host and m.cores is not None]
        held = (
            sum(m.cores or 0 for m in on_it),
            sum(m.memory_gib or 0 for m in on_it),
            sum(len(device_blocks(view.held_whole(m.id))) for m in on_it)
            + sum(1 for _, where, _, _ in view.split.values() if where == host),  # a slot each
            len(on_it),
        )
        assert held == (room.cores_held, room.memory_gib_held, room.slots_held, room.machines), (
            f"{host}: its machines hold {held}, the ledger's room says {room}"
        )
    for m in view.live():
        if m.cores is not None and m.state != "requested":
            assert m.host in view.rooms, f"{m} holds room on a host the ledger has no room for"


def check_nothing_stray(view: View, foreign: Mapping[str, str]) -> None:
    """Invariants 2 and 8: a device attached anywhere, tagged host or not, is the other
    client's or held in the ledger by a live machine composed on that very host."""
    for host, blocks in view.attached.items():
        for block in blocks:
            if foreign.get(block) == host:
                continue
            holders = [view.machines[m] for m in view.holders_of(block)]
            assert holders, f"{block} attached to {host}, held by nobody"
            for holder in holders:
                assert holder.host == host, f"{block} attached to {host}, held by {holder}"
                assert holder.state not in TERMINAL, f"{block} attached to {host} for {holder}"


def check_colocated(view: View) -> None:
    """Invariant 3: co-located devices go only to their owner group's users."""
    for block, machine_id in view.holders.items():
        group, user = _owner(block), view.machines[machine_id].user
        assert group is None or group in GROUPS[user], f"{block} ({group}) held by {user}"
    for host in view.ours():
        for block in view.attached[host]:
            holders = [view.machines[m] for m in view.holders_of(block)]
            group = _owner(block)
            assert holders, f"{block} on our {host}, held by nobody"
            for holder in holders:
                assert group is None or group in GROUPS[holder.user], f"{block} on {holder}"


def check_quota(view: View, limits: Mapping[str, int | None]) -> None:
    """Invariant 4: a user's live GPUs never exceed their limit."""
    for user, limit in limits.items():
        mine = [m for m in view.live() if m.user == user]
        held = gpus(b for m in mine for b in view.held_whole(m.id))
        held += sum(view.share_of(m.id) for m in mine)  # a quarter counts a quarter
        assert limit is None or held <= limit, f"{user} holds {held} > {limit}"


def check_lifecycle(view: View) -> None:
    """Invariant 5 (and 7): legal states, terminal holds nothing, the event log is a legal path."""
    for m in view.machines.values():
        assert m.state in STATES, f"{m}: unknown state"
        assert m.state in TERMINAL or m.state in AT_REST, f"{m} left mid-way between steps"
        if m.state in TERMINAL:
            assert not view.held(m.id), f"{m} holds {view.held(m.id)}"
        path = view.events.get(m.id, [])
        assert path[:1] == [(None, "requested")], f"{m}: events begin {path[:1]}"
        for (_, before), (after_from, after) in itertools.pairwise(path):
            assert after_from == before, f"{m}: {path}"
            assert can_transition(before, after), f"{m}: {path}"
        assert path[-1][1] == m.state, f"{m}: last event {path[-1]}"


def check_agreement(view: View) -> None:
    """Invariant 6: with no release pending, ledger and fabric agree in both directions."""
    if any(m.state == "stopping" for m in view.machines.values()):
        return
    in_ledger = {(b, m.host) for m in view.live() for b in device_blocks(view.held(m.id))}
    for block, (_, host, counted, slots) in view.split.items():
        assert slots, f"{block} split with no holder and no release pending"
        assert counted == len(slots), f"{block}: {counted} counted, {sorted(slots)} hold it"
        assert {view.machines[m].host for m in slots} == {host}, f"{block} split on {host}"
    on_fabric = {(b, host) for host in view.ours() for b in view.attached[host]}
    assert in_ledger == on_fabric, f"ledger {sorted(in_ledger)} vs fabric {sorted(on_fabric)}"
    machines_on_hosts: dict[str, set[str]] = {}
    for m in view.live():
        machines_on_hosts.setdefault(m.host or "", set()).add(m.id)
    marked = {host: _ids(mark) for host, mark in view.ours().items()}
    assert machines_on_hosts == marked, f"ledger {machines_on_hosts} vs marks {marked}"
    held_hosts = {HOST_BLOCKS[b]: m for b, m in view.holders.items() if b in HOST_BLOCKS}
    assert not held_hosts, f"shared hosts' own blocks held: {held_hosts}"


# ---------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------


gpu_asks = st.builds(
    MachineRequest,
    gpu_model=st.sampled_from([m.id for m in CATALOG.gpu_models]),
    gpu_count=st.integers(1, CATALOG.max_gpus_per_machine),
    network=st.sampled_from([n.id for n in CATALOG.networks]),
    scratch_gb=st.sampled_from(CATALOG.scratch_gb),
    size=st.sampled_from([s.id for s in CATALOG.sizes]),
)
# A course's day: mostly CPU-only servers in a share of a host.
cpu_asks = st.builds(
    MachineRequest,
    gpu_model=st.none(),
    gpu_count=st.just(0),
    network=st.just(CATALOG.networks[0].id),
    scratch_gb=st.just(0),
    size=st.sampled_from([s.id for s in CATALOG.sizes]),
)
# A course's quarters and halves of a T4 (the demo catalog's shares).
share_asks = st.builds(
    MachineRequest,
    gpu_model=st.just("t4"),
    gpu_count=st.just(1),
    network=st.just(CATALOG.networks[0].id),
    scratch_gb=st.just(0),
    size=st.sampled_from([s.id for s in CATALOG.sizes if not s.whole_host]),
    gpu_share=st.sampled_from(next(m.shares for m in CATALOG.gpu_models if m.id == "t4")),
)
asks = st.one_of(gpu_asks, cpu_asks, share_asks)
# (user, server, request, and whether the notebook then starts: composed → running)
a_compose = st.tuples(st.sampled_from(USERS), st.sampled_from(SERVERS), asks, st.booleans())
composes = st.lists(a_compose, min_size=1, max_size=3)
first_composes = st.lists(a_compose, max_size=4)
# One branch in three heals; the others switch a fault on.
fabric_changes = st.one_of(
    st.just("heal"),
    st.sampled_from(["unreachable", "stale-etags"]),
    st.tuples(st.integers(1, 4), st.sampled_from(ATTACH_FAILURES)),
)
OTHER_CLIENT_ACTIONS = ("takes", "disables", "lets-go")
limits = st.fixed_dictionaries({u: st.none() | st.integers(0, 8) for u in USERS})


def note(outcome: str) -> None:
    """Count an outcome for --hypothesis-show-statistics; a no-op outside Hypothesis."""
    if currently_in_test_context():
        event(outcome)


def _ignore_progress(message: str) -> None:
    del message


class ModelHub:
    """The hub's servers as the model has them: a strict fake of the hub's API."""

    def __init__(self, views: list[ServerView]) -> None:
        self.views = views

    async def servers(self) -> list[ServerView]:
        return self.views

    async def stop_server(self, user: str, server: str) -> None:
        raise AssertionError(f"the reconciler stopped {user}/{server}, which still has a machine")


class AllocationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=TEMPLATE.path.parent))
        shutil.copyfile(TEMPLATE.path, self.dir / "ledger.sqlite")
        self.url = f"sqlite:///{self.dir / 'ledger.sqlite'}"
        self.state = FabricState(INVENTORY, epoch="stateful")
        self.faults = Faults()  # outlive hub restarts, as the fabric does
        self.watch = Watch()
        self.loop = asyncio.new_event_loop()
        self.limits: dict[str, int | None] = {}
        self.snapshot_ttl = 0.0
        self.hub: Composer | None = None
        self.release_later: dict[str, bool] = {}  # machine id → failed, from release_soon
        self.orphans: set[str] = set()  # left stopping by a hub that died: the reconciler's

    # -- the hub -----------------------------------------------------------

    @property
    def composer(self) -> Composer:
        assert self.hub is not None, "no hub booted"
        return self.hub

    @property
    def ledger(self) -> Ledger:
        return self.composer.ledger

    @property
    def fabric_view(self) -> InProcessFabric:
        """The fabric's state as a client sees it (marks included), across hub restarts."""
        return InProcessFabric(self.state)

    def boot(self) -> None:
        ledger = Ledger(self.url, timeout=10.0)
        self.hub = Composer(
            ledger=ledger,
            fabric=CheckedFabric(self.state, self.faults, ledger, self.watch),
            catalog=CATALOG,
            hub_id=HUB_ID,
            snapshot_ttl=self.snapshot_ttl,
            log=LOG,
        )
        # Background retries run when retry_pending_releases says (see the module doc).
        self.hub.release_soon = self._note_release_soon  # type: ignore[method-assign]

    def _note_release_soon(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        del reason
        self.release_later[machine_id] = failed

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_TIMEOUT))

    def attempt(self, coroutine: Coroutine[Any, Any, T]) -> tuple[T | None, Exception | None]:
        """Run a composer call to the end: its result, or the refusal or failure it raised."""
        try:
            return self.run(coroutine), None
        except (ComposeRefused, ComposeFailed, FabricError) as e:
            return None, e

    def live(self) -> list[Row]:
        return read_view(self.ledger, self.fabric_view).live() if self.hub else []

    # Hypothesis switches rules off at random per example (swarm testing): starting
    # with machines and a fabric condition gives every example something to work on.
    @initialize(
        ttl=st.sampled_from([0.0, 60.0]),
        limits=limits,
        composes=first_composes,
        then=fabric_changes,
    )
    def start_hub(
        self,
        ttl: float,
        limits: dict[str, int | None],
        composes: list[tuple[str, str, MachineRequest, bool]],
        then: str | tuple[int, AttachFailure] = "heal",
    ) -> None:
        # 60 s: every step of an example sees the first snapshot unless something refreshes it.
        self.snapshot_ttl, self.limits = ttl, limits
        self.boot()
        for user, limit in limits.items():
            if limit is not None:
                rule = QuotaRule("user", user, gpus_held=limit)
                self.hub.ledger.policy.set_quota_rule(rule, Actor("test-admin"))
        self.compose_each(composes)
        self.fabric(then)

    # -- users -------------------------------------------------------------

    # Few rules, each doing more: Hypothesis picks rules uniformly, and releases
    # under a fault need a compose, a fault and a release in one short example.
    @rule(composes=composes)
    def compose(self, composes: list[tuple[str, str, MachineRequest, bool]]) -> None:
        self.compose_each(composes)

    def compose_each(self, composes: list[tuple[str, str, MachineRequest, bool]]) -> None:
        for user, server, request, launch in composes:
            made = self._compose_one(user, server, request)
            if made is not None and launch:
                # What the spawner does around its launcher's start().
                self.ledger.transition(made.machine_id, "launching", "starting notebook")
                self.ledger.transition(made.machine_id, "running", "notebook started")

    @rule(composes=st.lists(a_compose, min_size=2, max_size=4, unique_by=lambda c: (c[0], c[1])))
    def compose_together(self, composes: list[tuple[str, str, MachineRequest, bool]]) -> None:
        """Several servers start at once: their claims race for the same hosts' room."""

        async def one(
            user: str, server: str, request: MachineRequest
        ) -> tuple[ComposedMachine | None, Exception | None]:
            try:
                made = await self.composer.compose(
                    user=user,
                    groups=GROUPS[user],
                    server=server,
                    request=request,
                    progress=_ignore_progress,
                )
            except (ComposeRefused, ComposeFailed, FabricError) as e:
                return None, e
            return made, None

        busy = {(m.user, m.server) for m in self.live()}
        errors = self.faults.errors_raised

        async def together() -> list[tuple[ComposedMachine | None, Exception | None]]:
            return await asyncio.gather(*(one(u, s, r) for u, s, r, _ in composes))

        results = self.run(together())
        for (user, server, request, _), (made, error) in zip(composes, results, strict=True):
            if made is not None:
                note("compose together: composed")
                assert (user, server) not in busy, f"composed over live {user}/{server}"
                self._check_composed(made, user, server, request)
            elif isinstance(error, ComposeRefused):
                note(f"compose together: refused {error.status}")
                assert error.status in (403, 409), repr(error)
            else:
                note("compose together: failed")
                assert self.faults.errors_raised > errors, f"{error!r} with no fabric error"

    def _compose_one(
        self, user: str, server: str, request: MachineRequest
    ) -> ComposedMachine | None:
        before = self.ledger.live_machine(user, server)
        errors = self.faults.errors_raised
        made, error = self.attempt(
            self.composer.compose(
                user=user,
                groups=GROUPS[user],
                server=server,
                request=request,
                progress=_ignore_progress,
            )
        )
        after = self.ledger.live_machine(user, server)
        if isinstance(error, ComposeRefused):
            note(f"compose: refused {error.status}")
            assert error.status in (403, 409), repr(error)
            assert str(error), repr(error)
            assert (after and after.id) == (before and before.id), f"refusal changed {after}"
        elif isinstance(error, ComposeFailed):
            note(f"compose: failed ({type(error.__cause__).__name__})")
            assert self.faults.errors_raised > errors, f"{error!r} with no fabric error"
            assert str(error), repr(error)
            assert before is None, f"{error!r} over live {before}"
            assert after is None or after.state == "stopping", f"after {error!r}: {after}"
        else:
            assert error is None, f"compose raised {error!r}"
            assert made is not None
            note("compose: composed")
            assert before is None, f"composed over live {before}"
            self._check_composed(made, user, server, request)
        return made

    def _check_composed(
        self, made: ComposedMachine, user: str, server: str, request: MachineRequest
    ) -> None:
        model = CATALOG.gpu_model(request.gpu_model) if request.gpu_model else None
        network = CATALOG.network(request.network)
        assert network is not None
        assert len(made.gpus) == request.gpu_count
        assert model is not None or not made.gpus, made.gpus
        assert all(g.model in model.fabric_models for g in made.gpus if model), made.gpus
        size = request.share_of(CATALOG)
        expected = None if size.whole_host else (size.cores, size.memory_gib)
        assert (made.share and (made.share.cores, made.share.memory_gib)) == expected, made
        assert (made.nic.speed_gbps if made.nic else 0) == network.speed_gbps, made.nic
        assert sum(d.capacity_gb or 0 for d in made.drives) >= request.scratch_gb, made.drives
        machine = self.ledger.machine(made.machine_id)
        assert machine is not None
        assert machine.state == "composed", machine
        assert (machine.user_name, machine.server_name) == (user, server), machine
        assert machine.host_id == made.host, machine
        blocks = {d.block_id for d in (*made.gpus, *made.drives)}
        blocks |= {made.nic.block_id} if made.nic else set()
        assert blocks <= set(self.state.attached(made.host)), self.state.attached(made.host)
        mark = self.fabric_view.mark(made.host)
        if mark is not None and len(mark.machines) > 1:
            note("compose: on a host shared with other machines")

    @rule(pick=st.integers(0, 63), failed=st.booleans())
    def release(self, pick: int, failed: bool) -> None:
        live = self.live()
        if not live:
            return
        machine = self.ledger.machine(live[pick % len(live)].id)
        assert machine is not None
        errors = self.faults.errors_raised
        _, error = self.attempt(
            self.composer.release(machine.id, reason="server stopped", failed=failed)
        )
        after = self.ledger.machine(machine.id)
        assert after is not None
        if error is None:
            note(f"release: {machine.state} -> ended")
            assert not after.block_ids, after
            assert after.state == ("failed" if failed else "released"), after
        else:
            note(f"release: not confirmed ({type(error).__name__})")
            assert isinstance(error, FabricError), f"release raised {error!r}"
            assert self.faults.errors_raised > errors, f"{error!r} with no fabric error"
            assert after.state == "stopping", after
            assert after.block_ids == machine.block_ids, f"{after} let go of devices"
            # What the spawner does when a release is not confirmed.
            self.composer.release_soon(machine.id, reason="server stopped", failed=failed)

    @rule(user=st.sampled_from(USERS))
    def offer(self, user: str) -> None:
        errors = self.faults.errors_raised
        offer, error = self.attempt(self.composer.pool.offer(user, GROUPS[user]))
        if offer is None:
            assert isinstance(error, FabricError), f"offer raised {error!r}"
            assert self.faults.errors_raised > errors, f"{error!r} with no fabric error"
            return
        shown = set(offer.free) & COLOCATED_MODELS
        owners = {CATALOG.owner_of_chassis(d.chassis) for d in INVENTORY.devices} - {None}
        assert not shown or owners & GROUPS[user], f"{user} was offered {shown}"
        view = read_view(self.ledger, self.fabric_view)
        mine = [m for m in view.live() if m.user == user]
        held = gpus(b for m in mine for b in view.held_whole(m.id))
        held += sum(view.share_of(m.id) for m in mine)  # a quarter counts a quarter
        assert offer.gpus_in_use == held, (offer, held)

    # -- the fabric misbehaves ---------------------------------------------

    @rule(change=fabric_changes)
    def fabric(self, change: str | tuple[int, AttachFailure]) -> None:
        """'heal', 'unreachable', 'stale-etags', or (k, how): the k-th attach from now fails."""
        if change == "heal":
            self.faults.heal()
        elif change == "unreachable":
            self.faults.unreachable = True
        elif change == "stale-etags":
            self.faults.stale_etags = True
        else:
            assert isinstance(change, tuple)
            k, how = change
            self.faults.fail_attach(after=k - 1, how=how)

    @rule(action=st.sampled_from(OTHER_CLIENT_ACTIONS), pick=st.integers(0, 255))
    def other_client(self, action: str, pick: int) -> None:
        """Someone else composes or reserves a free device behind our back, or lets all go."""
        if action == "lets-go":
            self.other_client_lets_go()
            return
        free = [d for d in INVENTORY.devices if self._free_on_fabric(d.id)]
        if not free:
            return
        device = free[pick % len(free)]
        if action == "disables":
            self.state.set_disabled([*self.state.disabled(), device.id])
            return
        hosts = [h.id for h in INVENTORY.hosts if self._theirs_or_bare(h.id, device)]
        if hosts:
            self.other_client_composes(hosts[pick % len(hosts)], device.id)

    def other_client_composes(self, host: str, block_id: str) -> None:
        self.state.add_resource_block(host, block_id)
        if self.fabric_view.mark(host) is None:
            tag = CompositionTag(hub=OTHER_HUB, machine="theirs", owner="someone/else")
            self.fabric_view.set_mark(host, HostMark.of(tag))
        self.watch.foreign[block_id] = host

    def _free_on_fabric(self, block_id: str) -> bool:
        return self.state.holder(block_id) is None and self.state.is_enabled(block_id)

    def _theirs_or_bare(self, host: str, device: DeviceSpec) -> bool:
        spec = INVENTORY.host(host)
        mark = self.fabric_view.mark(host)
        if spec is None or not set(spec.zones) & set(device.zones):
            return False
        if mark is None:
            return not self.state.attached(host)
        return mark.hub == OTHER_HUB

    def other_client_lets_go(self) -> None:
        for block, host in self.watch.foreign.items():
            self.state.remove_resource_block(host, block)
        for host in [h.id for h in INVENTORY.hosts]:
            mark = self.fabric_view.mark(host)
            if mark is not None and mark.hub == OTHER_HUB:
                self.fabric_view.set_mark(host, None)
        self.state.set_disabled(())
        self.watch.foreign.clear()

    # -- the hub -----------------------------------------------------------

    @rule()
    def restart_hub(self) -> None:
        """The hub process dies between calls: no close(), its background work is gone."""
        self.orphans = {m.id for m in self.live() if m.state == "stopping"}
        self.release_later.clear()
        old = self.composer.ledger
        self.hub = None
        old.close()  # its connections died with the process
        self.boot()
        self.reconcile()  # the reconciler's pass at hub start

    @rule()
    def retry_pending_releases(self) -> None:
        """The fabric is back: every release left pending runs to the end.

        The composer's real release_soon takes both the releases this hub put off
        and those a dead hub left behind (the reconciler's job, stood in for here).
        """
        self.faults.heal()
        stopping = [m.id for m in self.live() if m.state == "stopping"]
        note(f"retry: {min(len(stopping), 3)}{'+' if len(stopping) > 3 else ''} pending")
        self.run(self._release_in_background(stopping))
        self.release_later.clear()
        self.orphans.clear()

    @rule()
    def reconcile(self) -> None:
        """The real reconciler, under whatever faults are on; every server alive.

        Its repairs must never break an invariant, whatever the fabric does.
        """
        servers = [
            ServerView(m.user, m.server, None, m.id) for m in self.live() if m.state != "stopping"
        ]
        report = self.run(Reconciler(self.composer, ModelHub(servers), grace=0.0).run_once())
        if not report.fabric_reachable:
            event("reconcile: fabric unreachable, nothing done")
        for kind in sorted({a.kind for a in report.actions}) or ["nothing to do"]:
            event(f"reconcile: {kind}")
        finished = {m.id for m in self.live()}
        self.orphans &= finished

    async def _release_in_background(self, machine_ids: list[str]) -> None:
        """The composer's real release_soon, then wait for the ledger to show them ended."""
        for machine_id in machine_ids:
            failed = self.release_later.get(machine_id, False)
            Composer.release_soon(self.composer, machine_id, reason="retry", failed=failed)
        deadline = time.monotonic() + STEP_TIMEOUT / 2
        while True:
            machines = [self.ledger.machine(m) for m in machine_ids]
            left = [m for m in machines if m is None or m.state not in TERMINAL]
            if not left:
                return
            assert time.monotonic() < deadline, f"releases did not finish: {left}"
            await asyncio.sleep(0.005)

    # -- invariants ----------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        assert not self.watch.misuse, self.watch.misuse
        view = read_view(self.ledger, self.fabric_view)
        check_one_holder(view, self.state)
        check_ours_attached(view)
        check_host_room(view)
        check_nothing_stray(view, self.watch.foreign)
        check_colocated(view)
        check_quota(view, self.limits)
        check_lifecycle(view)
        check_agreement(view)
        stopping = {m.id for m in view.live() if m.state == "stopping"}
        forgotten = stopping - set(self.release_later) - self.orphans
        assert not forgotten, f"left stopping with no release pending: {forgotten}"

    def teardown(self) -> None:
        try:
            if self.hub is not None:
                self.loop.run_until_complete(self.hub.close())
            pending = asyncio.all_tasks(self.loop)
            if pending:
                gathered = asyncio.gather(*pending, return_exceptions=True)
                self.loop.run_until_complete(gathered)
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir)
        EXAMPLES.finished += 1


@pytest.fixture(scope="module", autouse=True)
def template_ledger() -> Iterator[Path]:
    TEMPLATE.create()
    try:
        yield TEMPLATE.path
    finally:
        TEMPLATE.remove()


# A passing run takes about 20 s; a failing one shrinks for up to 5 minutes first
# (Hypothesis' own limit), and the shrunk steps are the useful part of the report.
@pytest.mark.timeout(600)
class TestAllocation(AllocationMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = SETTINGS

    def runTest(self) -> None:
        before = EXAMPLES.finished
        super().runTest()
        ran = EXAMPLES.finished - before
        assert ran >= SETTINGS.max_examples, f"only {ran} examples ran"

    # Keeps pytest --hypothesis-show-statistics reporting this test.
    runTest.is_hypothesis_test = True  # type: ignore[attr-defined]


def test_never_composes_on_a_host_another_client_took() -> None:
    """The machine's finding, replayed: a host taken after our snapshot is not ours to tag.

    The hub's inventory snapshot (cached ``snapshot_ttl`` seconds) shows host-05
    bare; another client then composes a NIC into it and tags it. Placement
    picks host-05 from the snapshot, and the compose must not tag over the
    other client's tag nor add our GPU beside their NIC.
    """
    machine = AllocationMachine()
    try:
        machine.start_hub(ttl=60.0, limits=dict.fromkeys(USERS), composes=[])
        machine.offer(user="u1")  # the snapshot: every host bare
        machine.other_client_composes("host-05", "r2-nic100-1")
        h100 = MachineRequest(gpu_model="h100", gpu_count=1, network="shared", scratch_gb=0)
        machine.compose(composes=[("u1", "", h100, False)])
        machine.invariants_hold()
    finally:
        machine.teardown()
