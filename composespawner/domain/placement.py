"""Placement: which host and which devices make up a machine, or why none can.

Pure functions over immutable snapshots, no I/O: the spawner calls them, and so
will the trace benchmarks, unchanged. Two steps:

1. :func:`pool_for` narrows a fabric :class:`Inventory` to what one user may
   take right now (free on the fabric, held by nobody in the ledger, and for
   co-located devices owned by one of the user's groups), and the room left on
   each host this hub may compose on (cores, memory and device slots: several
   machines share a host, each with its own devices).
2. :func:`place` picks one zone (a rack's PCIe fabric: devices never compose
   across zones), a host there with room for the machine's share, and the
   devices, or returns a :class:`NoFit` whose ``reason`` a user can act on.

**How it packs.** A host already composed (one of our machines runs on it) is
always chosen before a fresh one, so fresh hosts stay empty for what needs a
whole host or many slots. Among the hosts that fit, the one the request fits
*best* wins, measured by the room the host keeps afterwards: the sum, over
cores, memory and slots, of the fraction of the host's capacity left free.
That sum is the fragmentation measure: the smaller it is, the less room is
stranded in a host too full for the next machine, and the larger the holes
that stay elsewhere (a host with much free room in every dimension takes a
big request; many hosts each a little free take none). It is the "sum of
normalised remainders" best fit of vector bin packing: cheap (no look-ahead
over the queue), and unlike a single dimension it does not fill a host's
cores while stranding its slots, or the other way round. Ties go to the zone
left with the *fewest* free GPUs of the asked model (best fit on GPUs, so large
free pools stay whole for large requests), then to the lowest system id. A
whole-host request takes a fresh host only. Within a zone GPUs come from as
few chassis as possible.

**Speed.** A decision reads a per-pool index (hosts and GPUs sorted out by
zone and model), built once for the pool: the decision itself looks at hosts
only in zones with enough GPUs, and at fresh hosts only when no composed host
fits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from heapq import heapify, heappop, heappush
from itertools import combinations
from math import inf
from operator import attrgetter

from composespawner.domain.hardware import Device, Host, Inventory, Share
from composespawner.domain.rooms import (
    DEFAULT_MAX_DEVICES,
    NO_ROOM,
    NO_USE,
    HostUse,
    OpenHost,
    Room,
    room_for,
)
from composespawner.domain.shares import OpenShare, SplitGpu, open_shares


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    """A request in fabric terms: which models, how many, which extras, what share."""

    gpu_models: frozenset[str]  # Processor.Model strings that are acceptable
    gpu_count: int
    label: str  # how to name the GPUs to a person, e.g. "NVIDIA T4 16GB"
    nic_speed_gbps: int = 0  # 0: no dedicated card
    scratch_gb: int = 0
    share: Share | None = None  # cores and memory of the host; None: the whole host
    size_label: str = "a whole host"  # how to name the share to a person
    # 1: whole GPUs; n > 1: 1/n of one GPU, time-sliced with the GPU's other holders.
    gpu_share: int = 1


@dataclass(frozen=True, slots=True)
class Pool:
    """What one user may take right now."""

    hosts: tuple[OpenHost, ...]
    devices: tuple[Device, ...]
    zones: tuple[str, ...]
    # The most of each any shareable host has: what tells "too big for any host" from
    # "busy" (nothing: no host says, so no size is too big).
    largest: Room = NO_ROOM
    open_shares: tuple[OpenShare, ...] = ()  # split GPUs a share of their size may join
    _indexes: dict[frozenset[str], _ZoneIndex] = field(
        default_factory=dict, compare=False, repr=False
    )

    def index(self, models: frozenset[str]) -> _ZoneIndex:
        """The pool sorted out for one ask's GPU models, built once per pool and models."""
        found = self._indexes.get(models)
        if found is None:
            found = self._indexes[models] = _ZoneIndex(self, models)
        return found


@dataclass(frozen=True, slots=True)
class Plan:
    zone: str
    host: Host
    gpus: tuple[Device, ...]
    nic: Device | None = None
    drives: tuple[Device, ...] = ()
    share: Share | None = None  # None: the whole host
    fresh: bool = True  # no machine of ours was on the host when it was placed
    capacity: Room = NO_ROOM  # the host's
    need: Room = NO_ROOM  # what the machine takes of it: cores, memory, a slot per device
    gpu_share: int = 1  # n > 1: the machine holds 1/n of its one GPU
    joins: bool = False  # the GPU is split already, attached to the host: no slot, no attach

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.gpus + ((self.nic,) if self.nic else ()) + self.drives

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(d.block_id for d in self.devices)


@dataclass(frozen=True, slots=True)
class NoFit:
    reason: str  # for the user: what is short and what to do


def pool_for(
    inventory: Inventory,
    *,
    held: Collection[str],
    owners: Mapping[str, str],
    groups: Collection[str],
    hub: str | None = None,
    use: Mapping[str, HostUse] | None = None,
    max_devices: int = DEFAULT_MAX_DEVICES,
    split: Mapping[str, SplitGpu] | None = None,
) -> Pool:
    """The hosts and devices a user may take: free, unheld, and theirs if co-located.

    ``hub``: this hub's identity; a host it marked takes more machines (the room
    its live machines hold there, ``use`` by system id, is not free). A host
    anyone else composed is never in the pool. ``max_devices``: the slots of a
    host whose fabric does not say. ``split``: GPUs the ledger holds in shares
    (block id → where, what size, how many holders): those with a slot free, on
    a host in the pool, are the pool's open shares (they are in ``held`` too, so
    no whole claim takes them).
    """
    # Unowned devices are for everyone. The tuple is built once and the owner looked
    # up only for owned devices: per device, the two were half the cost of this scan.
    allowed_owners = (None, *groups)
    usable = [
        d
        for d in inventory.devices
        if d.state == "free"
        and d.block_id not in held
        and (d.block_id not in owners or owners[d.block_id] in allowed_owners)
    ]
    use = use or {}
    hosts = []
    for h, fresh in _hosts_as_fresh(inventory, max_devices):
        # A host whose own block the ledger holds is a whole-host machine's of old.
        if h.state != "enabled" or h.block_id in held or not _ours_to_compose(h, hub):
            continue
        held_here = use.get(h.system_id)
        if held_here is None and h.mark is None:
            hosts.append(fresh)  # nothing on it
            continue
        held_here, total = held_here or NO_USE, fresh.total
        free = Room(
            total.cores - held_here.cores,
            total.memory_gib - held_here.memory_gib,
            total.slots - max(held_here.slots, len(h.attached)),
        )
        machines = max(held_here.machines, len(h.mark.machines) if h.mark else 0)
        hosts.append(OpenHost(h, total, free, machines))
    cores, memory = inventory.largest_host()
    return Pool(
        hosts=tuple(hosts),
        devices=tuple(usable),
        zones=inventory.zones,
        largest=Room(cores, memory, 0),
        open_shares=open_shares(inventory, split or {}, hosts, owners, allowed_owners),
    )


def _hosts_as_fresh(inventory: Inventory, max_devices: int) -> list[tuple[Host, OpenHost]]:
    """Each host, and the host as an empty one: worked out once per snapshot, since most
    hosts of a pool are empty and every spawn builds its pool from the same snapshot."""
    key = ("hosts-as-fresh", max_devices)
    found = inventory.derived.get(key)
    if found is None:
        found = []
        for h in inventory.hosts:
            room = Room(h.cpus, h.memory_gib, h.max_devices or max_devices)
            found.append((h, OpenHost(h, room, room, 0)))
        inventory.derived[key] = found
    return found


def _ours_to_compose(host: Host, hub: str | None) -> bool:
    """Fresh (unmarked, nothing attached), or marked by this hub."""
    if host.mark is None:
        return not host.attached
    return hub is not None and host.mark.hub == hub


def place(pool: Pool, ask: DeviceAsk) -> Plan | NoFit:
    """The machine's zone, host and devices (see the module's docstring), or why none fit."""
    if ask.gpu_share > 1:
        return _place_share(pool, ask)
    index = pool.index(ask.gpu_models)
    gpus_by_zone = index.gpus_for(ask.share)
    # Slots at least: the GPUs, a NIC, one drive. The extras themselves are picked
    # only for the zones tried, best first: picking drives is the costly step.
    least = ask.gpu_count + (1 if ask.nic_speed_gbps else 0) + (1 if ask.scratch_gb > 0 else 0)
    extras: dict[str, tuple[Device | None, tuple[Device, ...]] | None] = {}
    # Composed hosts first, fresh ones only if none fits: see "How it packs".
    for fresh in (False, True):
        heap: list[tuple[float, int, str, int, str, int, OpenHost]] = []
        for zone in index.zones:
            left = _gpus_left(gpus_by_zone.get(zone, []), ask.gpu_count)
            best = None if left is None else _best_host(index.rooms(zone, fresh), ask.share, least)
            if best is not None and left is not None:
                heap.append(
                    (best[0], left, best[1].host.system_id, len(heap), zone, least, best[1])
                )
        heapify(heap)
        while heap:
            _, left, _, _, zone, slots, chosen = heappop(heap)
            if zone not in extras:
                extras[zone] = _pick_extras(index, ask, zone)
            picked = extras[zone]
            if picked is None:
                continue
            nic, drives = picked
            exact = ask.gpu_count + (nic is not None) + len(drives)
            if exact != slots:  # more drives than one: the zone's best host for that many
                best = _best_host(index.rooms(zone, fresh), ask.share, exact)
                if best is not None:
                    entry = (best[0], left, best[1].host.system_id, len(heap) + 1, zone, exact)
                    heappush(heap, (*entry, best[1]))
                continue
            gpus = _pick_gpus(gpus_by_zone.get(zone, []), ask.gpu_count)
            need = room_for(ask.share, chosen, slots)
            assert gpus is not None, "the zone was ranked for having enough"
            assert need is not None, "the host was ranked for having room"
            return Plan(
                zone, chosen.host, gpus, nic, drives, ask.share, chosen.fresh, chosen.total, need
            )
    return NoFit(_why_not(pool, index, ask))


def _place_share(pool: Pool, ask: DeviceAsk) -> Plan | NoFit:
    """A share of one GPU: it joins a split GPU of its model and size that has a slot
    free, the one with the fewest free (so a GPU fills before another is split), on
    the host it fits best; else it splits a free GPU, placed as a one-GPU machine
    is (best fit: the zone with the fewest free GPUs of the model gives it, so the
    large free pools stay whole for whole-GPU machines)."""
    index = pool.index(ask.gpu_models)
    hosts = {h.host.system_id: h for h in pool.hosts}
    joinable = [
        s
        for s in pool.open_shares
        if s.size == ask.gpu_share and s.gpu.model in ask.gpu_models and s.host_id in hosts
    ]
    best: tuple[tuple[int, float, str, str], Plan] | None = None
    for open_share in joinable:
        plan = _join(index, ask, open_share, hosts[open_share.host_id])
        if plan is None:
            continue
        free, total = hosts[open_share.host_id].free, plan.capacity
        left = (free.cores - plan.need.cores) / (total.cores or 1) + (
            free.memory_gib - plan.need.memory_gib
        ) / (total.memory_gib or 1)
        key = (open_share.free, left, open_share.host_id, open_share.gpu.block_id)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is not None:
        return best[1]
    opened = place(pool, replace(ask, gpu_share=1))
    if isinstance(opened, NoFit):
        return opened
    if not opened.host.shareable:
        # A host composed whole for one machine would hold the GPU for one holder only.
        return NoFit(
            f"No host that can be shared has room for a share of a {ask.label} right now:"
            " ask for a whole GPU, or try again when a server stops."
        )
    return replace(opened, gpu_share=ask.gpu_share)


def _join(index: _ZoneIndex, ask: DeviceAsk, share: OpenShare, open_host: OpenHost) -> Plan | None:
    """A plan that joins ``share`` on its host, if the host has room for the machine (and
    its extras from the host's zone): the GPU itself takes no slot, it has one already."""
    zones = sorted(share.gpu.zones & open_host.host.zones)
    for zone in zones:
        picked = _pick_extras(index, ask, zone)
        if picked is None:
            continue
        nic, drives = picked
        need = room_for(ask.share, open_host, (nic is not None) + len(drives))
        if need is None:
            return None
        return Plan(
            zone,
            open_host.host,
            (share.gpu,),
            nic,
            drives,
            ask.share,
            open_host.fresh,
            open_host.total,
            need,
            gpu_share=share.size,
            joins=True,
        )
    return None


def _best_host(
    rooms: list[_HostRoom], share: Share | None, slots: int
) -> tuple[float, OpenHost] | None:
    """The host ``share`` fits best (the least room left, see "How it packs"), and that room.

    The hot loop of a decision: it runs over the precomputed figures of each
    host, not over their objects.
    """
    best_left = inf
    best = None
    if share is not None:
        cores, memory = share.cores, share.memory_gib
        for free_cores, free_memory, free_slots, per_core, per_gib, per_slot, whole, host in rooms:
            if free_cores >= cores and free_memory >= memory and free_slots >= slots and not whole:
                left = (
                    (free_cores - cores) * per_core
                    + (free_memory - memory) * per_gib
                    + (free_slots - slots) * per_slot
                )
                if left < best_left:
                    best_left, best = left, host
    # A whole host, asked for or because the host cannot be shared: an empty one.
    for _, _, free_slots, _, _, per_slot, whole, host in rooms:
        if (
            (share is None or whole)
            and free_slots >= slots
            and host.fresh
            and host.free == host.total
        ):
            left = (free_slots - slots) * per_slot
            if left < best_left:
                best_left, best = left, host
    return None if best is None else (best_left, best)


# A host's free cores, memory and slots, the reciprocals of its capacity, whether a
# machine takes it whole, and the host: what _best_host reads of each host.
_HostRoom = tuple[int, int, int, float, float, float, bool, OpenHost]


def _host_room(open_host: OpenHost) -> _HostRoom:
    free, total = open_host.free, open_host.total
    return (
        free.cores,
        free.memory_gib,
        free.slots,
        1 / (total.cores or 1),
        1 / (total.memory_gib or 1),
        1 / (total.slots or 1),
        not open_host.host.shareable,
        open_host,
    )


def _gpus_left(gpus: list[Device], count: int) -> int | None:
    """Free GPUs a zone keeps once ``count`` are picked there; None if it has too few."""
    if len(gpus) < count:
        return None
    if count >= 0:
        return len(gpus) - count  # _pick_gpus then picks exactly ``count``
    return len(gpus) - len(_pick_gpus(gpus, count) or ())


class _ZoneIndex:
    """The pool sorted out by zone, for one ask's GPU models.

    Every step of a decision asks "which free things of this kind are in this
    zone"; scanning the whole pool for each zone and kind made one decision over
    2,000 devices cost milliseconds. Lists are in block id order, as the picks
    below expect; NICs and drives are sorted out only if a step asks for them.
    """

    def __init__(self, pool: Pool, models: frozenset[str]) -> None:
        self._pool = pool
        self._rooms: dict[tuple[str, bool], list[_HostRoom]] = defaultdict(list)
        for open_host in sorted(pool.hosts, key=_system_id):
            room = _host_room(open_host)
            for zone in open_host.host.zones:
                self._rooms[zone, open_host.fresh].append(room)
        self.zones = sorted({zone for zone, _ in self._rooms})
        self.gpus = _by_zone([d for d in pool.devices if d.kind == "gpu" and d.model in models])
        self._named: dict[str, list[Device]] | None = None
        self._extras: dict[str, dict[str, list[Device]]] = {}

    def gpus_for(self, share: Share | None) -> dict[str, list[Device]]:
        """The free GPUs per zone a machine of ``share`` may get.

        A notebook on a shared host is limited to its own GPUs by their UUIDs: a
        GPU the fabric names no UUID for goes only to a machine with a host of its
        own (``share`` None).
        """
        if share is None:
            return self.gpus
        if self._named is None:
            self._named = {z: [g for g in gpus if g.uuid] for z, gpus in self.gpus.items()}
        return self._named

    def rooms(self, zone: str, fresh: bool) -> list[_HostRoom]:
        """The hosts of a zone, composed or fresh, as :func:`_best_host` reads them."""
        return self._rooms.get((zone, fresh), [])

    def extras(self, zone: str, kind: str) -> list[Device]:
        """Free NICs or drives in a zone."""
        if kind not in self._extras:
            self._extras[kind] = _by_zone([d for d in self._pool.devices if d.kind == kind])
        return self._extras[kind].get(zone, [])


def _system_id(open_host: OpenHost) -> str:
    return open_host.host.system_id


def _by_zone(devices: list[Device]) -> dict[str, list[Device]]:
    """Devices per zone, each list in block id order (a device may sit in several zones)."""
    devices.sort(key=_block_id)
    grouped: dict[str, list[Device]] = defaultdict(list)
    for device in devices:
        for zone in device.zones:
            grouped[zone].append(device)
    return grouped


_block_id = attrgetter("block_id")


def _pick_extras(
    index: _ZoneIndex, ask: DeviceAsk, zone: str
) -> tuple[Device | None, tuple[Device, ...]] | None:
    """The NIC and drives the ask wants from ``zone``; None if the zone lacks them."""
    nic = _pick_nic(index.extras(zone, "nic"), ask.nic_speed_gbps) if ask.nic_speed_gbps else None
    if ask.nic_speed_gbps and nic is None:
        return None
    drives = _pick_drives(index.extras(zone, "nvme"), ask.scratch_gb) if ask.scratch_gb else ()
    return None if drives is None else (nic, drives)


def _pick_gpus(gpus: list[Device], count: int) -> tuple[Device, ...] | None:
    """Fewest chassis: the tightest chassis that holds them all, else the fullest first."""
    if len(gpus) < count:
        return None
    if count == 0:
        return ()
    by_chassis: dict[str, list[Device]] = defaultdict(list)
    for gpu in gpus:
        by_chassis[gpu.chassis].append(gpu)
    fitting = [g for g in by_chassis.values() if len(g) >= count]
    if fitting:
        return tuple(min(fitting, key=len)[:count])
    spread = sorted(by_chassis.values(), key=len, reverse=True)
    return tuple(d for group in spread for d in group)[:count]


def _pick_nic(nics: list[Device], speed: int) -> Device | None:
    """A free card of exactly that speed (None if none is wanted or none is free)."""
    if speed == 0:
        return None
    return next((n for n in nics if n.speed_gbps == speed), None)


def _pick_drives(drives: list[Device], size_gb: int) -> tuple[Device, ...] | None:
    """Fewest drives whose capacity covers the size, wasting as little as possible."""
    if size_gb <= 0:
        return ()
    for n in range(1, min(len(drives), 4) + 1):
        sets = [c for c in combinations(drives, n) if _capacity(c) >= size_gb]
        if sets:
            return min(sets, key=lambda c: (_capacity(c), [d.block_id for d in c]))
    return None


def _capacity(drives: Iterable[Device]) -> int:
    return sum(d.capacity_gb or 0 for d in drives)


def _why_not(pool: Pool, index: _ZoneIndex, ask: DeviceAsk) -> str:
    share = ask.share
    largest = Room(pool.largest.cores, pool.largest.memory_gib, 0)
    too_big = not largest.fits(Room(share.cores, share.memory_gib, 0)) if share else False
    if too_big and largest.cores > 0:
        return (
            f"{ask.size_label} is more than any host here has (the largest has"
            f" {pool.largest.cores} cores and {pool.largest.memory_gib} GiB):"
            " choose a smaller size."
        )
    zones = index.zones
    if not zones:
        return "Every compute host is in use right now. Try again when a server stops."
    most = max(len(index.gpus_for(ask.share).get(z, [])) for z in zones)
    if ask.gpu_count and most == 0:
        return f"No {ask.label} is free right now. Choose another GPU model or try again later."
    if most < ask.gpu_count:
        return (
            f"Only {most} × {ask.label} can be combined in one machine right now (you asked for"
            f" {ask.gpu_count}). Ask for {most}, choose another model, or try again later."
        )
    rooms = [r for z in zones for fresh in (False, True) for r in index.rooms(z, fresh)]
    if _best_host(rooms, share, ask.gpu_count) is None:
        roomiest = max(pool.hosts, key=lambda h: (h.free.cores, h.free.memory_gib), default=None)
        room = (
            f" (the most free on one host: {roomiest.free.cores} cores,"
            f" {roomiest.free.memory_gib} GiB, {roomiest.free.slots} device slots)"
            if roomiest
            else ""
        )
        return (
            f"No compute host has room for {ask.size_label} with {ask.gpu_count} GPUs right"
            f" now{room}. Choose a smaller size or fewer GPUs, or try again when a server stops."
        )
    if ask.nic_speed_gbps and not any(
        _pick_nic(index.extras(z, "nic"), ask.nic_speed_gbps) is not None for z in zones
    ):
        return (
            f"No {ask.nic_speed_gbps} Gb/s network card is free next to {ask.label} GPUs"
            " right now. Choose another network option or try again later."
        )
    if ask.scratch_gb and not any(
        _pick_drives(index.extras(z, "nvme"), ask.scratch_gb) is not None for z in zones
    ):
        return (
            f"Not enough free scratch NVMe for {ask.scratch_gb} GB next to {ask.label} GPUs"
            " right now. Choose a smaller scratch size or try again later."
        )
    return (
        f"No single rack has {ask.gpu_count} × {ask.label} together with the network card and"
        f" scratch space you chose and a host with room for {ask.size_label} right now. Ask for"
        " fewer extras or a smaller size, or try again later."
    )


def place_more(pool: Pool, zone: str, ask: DeviceAsk, *, slots: int) -> tuple[Device, ...] | NoFit:
    """GPUs to add to a running machine in ``zone`` on a host with ``slots`` free:
    devices never compose across zones, and a machine never spans hosts."""
    if slots < ask.gpu_count:
        return NoFit(
            f"Your machine's host has room for {slots} more"
            f" device{'' if slots == 1 else 's'} only: its other slots hold other servers'"
            f" devices. Ask for {slots}, or stop this server and start one with"
            f" {ask.gpu_count} more GPUs (a new server goes to a host with room)."
            if slots
            else "Your machine's host is full: every slot holds a device. Stop this server"
            " and start one with the GPUs you need (a new server goes to a host with room)."
        )
    gpus = _by_zone([d for d in pool.devices if d.kind == "gpu" and d.model in ask.gpu_models])
    picked = _pick_gpus(gpus.get(zone, []), ask.gpu_count)
    if picked is not None:
        return picked
    free = len(gpus.get(zone, []))
    return NoFit(
        f"Only {free} more {ask.label} {'is' if free == 1 else 'are'} free in your machine's"
        f" rack ({zone}) right now, and devices join a machine only from its own rack."
        " Ask for fewer, or try again when a server there stops."
    )
