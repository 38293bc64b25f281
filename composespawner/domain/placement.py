"""Placement: which host and which devices make up a machine, or why none can.

Pure functions over immutable snapshots, no I/O: the spawner calls them, and so
will the trace benchmarks, unchanged. Two steps:

1. :func:`pool_for` narrows a fabric :class:`Inventory` to what one user may
   take right now (free on the fabric, held by nobody in the ledger, and for
   co-located devices owned by one of the user's groups).
2. :func:`place` picks one zone (a rack's PCIe fabric: devices never compose
   across zones), a free host there and the devices, or returns a
   :class:`NoFit` whose ``reason`` a user can act on.

Among zones that fit, the one left with the *fewest* free GPUs of the asked
model wins (best fit), so large free pools stay whole for large requests.
Within a zone GPUs come from as few chassis as possible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from operator import attrgetter

from composespawner.domain.hardware import Device, Host, Inventory


@dataclass(frozen=True, slots=True)
class DeviceAsk:
    """A request in fabric terms: which models, how many, which extras."""

    gpu_models: frozenset[str]  # Processor.Model strings that are acceptable
    gpu_count: int
    label: str  # how to name the GPUs to a person, e.g. "NVIDIA T4 16GB"
    nic_speed_gbps: int = 0  # 0: no dedicated card
    scratch_gb: int = 0


@dataclass(frozen=True, slots=True)
class Pool:
    """What one user may take right now."""

    hosts: tuple[Host, ...]
    devices: tuple[Device, ...]
    zones: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    zone: str
    host: Host
    gpus: tuple[Device, ...]
    nic: Device | None = None
    drives: tuple[Device, ...] = ()

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.gpus + ((self.nic,) if self.nic else ()) + self.drives

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(d.block_id for d in self.devices)


@dataclass(frozen=True, slots=True)
class NoFit:
    reason: str  # for the user: what is short and what to do


@dataclass(frozen=True, slots=True)
class Availability:
    """What the spawn form may offer of one GPU model to one user right now."""

    free: int  # free GPUs of the model a machine could get: in a zone with a free host
    most_per_machine: int  # the largest count one machine could get (the catalog's cap at most)
    most_to_ask: int  # what the user may ask for: most_per_machine within their quota left
    why_none: str = ""  # for a person, when most_to_ask is 0: what is short and what to do


def pool_for(
    inventory: Inventory,
    *,
    held: Collection[str],
    owners: Mapping[str, str],
    groups: Collection[str],
) -> Pool:
    """The hosts and devices a user may take: free, unheld, and theirs if co-located."""
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
    hosts = [
        h
        for h in inventory.hosts
        if h.state == "enabled" and not h.attached and h.tag is None and h.block_id not in held
    ]
    return Pool(hosts=tuple(hosts), devices=tuple(usable), zones=inventory.zones)


def keep_back(pool: Pool, holdback: Mapping[frozenset[str], int]) -> Pool:
    """``pool`` without ``n`` free GPUs of each model set: what cohorts' sessions keep.

    Which GPUs does not matter to the claim (it counts them); the last in
    block order go, so the choice is the same on every hub.
    """
    if not holdback:
        return pool
    dropped: set[str] = set()
    for models, count in holdback.items():
        matching = [d.block_id for d in pool.devices if d.kind == "gpu" and d.model in models]
        dropped.update(sorted(matching)[-count:] if count > 0 else ())
    devices = tuple(d for d in pool.devices if d.block_id not in dropped)
    return Pool(hosts=pool.hosts, devices=devices, zones=pool.zones)


def visible_models(
    inventory: Inventory, owners: Mapping[str, str], groups: Collection[str]
) -> frozenset[str]:
    """Fabric GPU models a user may ever use here, busy or not."""
    return frozenset(
        d.model
        for d in inventory.devices
        if d.kind == "gpu" and owners.get(d.block_id, None) in (None, *groups)
    )


def availability(
    pool: Pool,
    models: frozenset[str],
    *,
    label: str,
    per_machine_cap: int,
    quota_left: int | None = None,
) -> Availability:
    """How many GPUs of ``models`` one machine could get, and how many the user may ask for.

    A GPU counts only in a zone with a free host: one stranded in a rack whose
    hosts are all busy cannot be composed into anything. ``quota_left``: GPUs the
    user may still take (None: no limit).
    """
    gpus = [d for d in pool.devices if d.kind == "gpu" and d.model in models]
    zones_with_host = {z for h in pool.hosts for z in h.zones}
    reachable = [d for d in gpus if d.zones & zones_with_host]
    per_zone = [sum(1 for d in reachable if zone in d.zones) for zone in zones_with_host]
    most = min(max(per_zone, default=0), per_machine_cap)
    to_ask = most if quota_left is None else max(min(most, quota_left), 0)
    return Availability(
        free=len(reachable),
        most_per_machine=most,
        most_to_ask=to_ask,
        why_none="" if to_ask else _why_none(label, gpus, quota_left),
    )


def _why_none(label: str, gpus: list[Device], quota_left: int | None) -> str:
    if quota_left is not None and quota_left <= 0:
        return "Your GPU quota is used up: stop one of your servers to free some."
    if not gpus:
        return f"No {label} is free right now: choose another model or try again later."
    return (
        f"No free host in a rack with free {label} GPUs right now:"
        " choose another model or try again when a server stops."
    )


def place(pool: Pool, ask: DeviceAsk) -> Plan | NoFit:
    index = _ZoneIndex(pool, ask.gpu_models)
    # Best fit looks only at GPU counts, so rank the zones by what they keep and
    # pick devices in rank order: the first zone that also has the NIC and drives
    # is the best-fitting plan, and the picks run for it alone, not for every zone.
    ranked = sorted(
        (left, zone)
        for zone in index.zones
        if (left := _gpus_left(index.gpus.get(zone, []), ask.gpu_count)) is not None
    )
    for _, zone in ranked:
        plan = _plan_in_zone(index, ask, zone)
        if plan is not None:
            return plan
    return NoFit(_why_not(index, ask))


def _gpus_left(gpus: list[Device], count: int) -> int | None:
    """Free GPUs a zone keeps once ``count`` are picked there; None if it has too few."""
    if len(gpus) < count:
        return None
    if count >= 0:
        return len(gpus) - count  # _pick_gpus then picks exactly ``count``
    return len(gpus) - len(_pick_gpus(gpus, count) or ())


class _ZoneIndex:
    """The pool sorted out by zone once per decision.

    Every step of a decision asks "which free things of this kind are in this
    zone"; scanning the whole pool for each zone and kind made one decision over
    2,000 devices cost milliseconds. Lists are in block id order, as the picks
    below expect; NICs and drives are sorted out only if a step asks for them.
    """

    def __init__(self, pool: Pool, models: frozenset[str]) -> None:
        self._pool = pool
        self.hosts: dict[str, Host] = {}  # zone -> its free host with the lowest system id
        for host in pool.hosts:
            for zone in host.zones:
                first = self.hosts.get(zone)
                if first is None or host.system_id < first.system_id:
                    self.hosts[zone] = host
        self.zones = sorted(self.hosts)
        self.gpus = _by_zone([d for d in pool.devices if d.kind == "gpu" and d.model in models])
        self._extras: dict[str, dict[str, list[Device]]] = {}

    def extras(self, zone: str, kind: str) -> list[Device]:
        """Free NICs or drives in a zone."""
        if kind not in self._extras:
            self._extras[kind] = _by_zone([d for d in self._pool.devices if d.kind == kind])
        return self._extras[kind].get(zone, [])


def _by_zone(devices: list[Device]) -> dict[str, list[Device]]:
    """Devices per zone, each list in block id order (a device may sit in several zones)."""
    devices.sort(key=_block_id)
    grouped: dict[str, list[Device]] = defaultdict(list)
    for device in devices:
        for zone in device.zones:
            grouped[zone].append(device)
    return grouped


_block_id = attrgetter("block_id")


def _plan_in_zone(index: _ZoneIndex, ask: DeviceAsk, zone: str) -> Plan | None:
    nic = _pick_nic(index.extras(zone, "nic"), ask.nic_speed_gbps) if ask.nic_speed_gbps else None
    if ask.nic_speed_gbps and nic is None:
        return None
    drives = _pick_drives(index.extras(zone, "nvme"), ask.scratch_gb) if ask.scratch_gb else ()
    gpus = _pick_gpus(index.gpus.get(zone, []), ask.gpu_count)
    if drives is None or gpus is None:
        return None
    return Plan(zone=zone, host=index.hosts[zone], gpus=gpus, nic=nic, drives=drives)


def _pick_gpus(gpus: list[Device], count: int) -> tuple[Device, ...] | None:
    """Fewest chassis: the tightest chassis that holds them all, else the fullest first."""
    if len(gpus) < count:
        return None
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


def _why_not(index: _ZoneIndex, ask: DeviceAsk) -> str:
    zones = index.zones
    if not zones:
        return "Every compute host is in use right now. Try again when a server stops."
    most = max(len(index.gpus.get(z, [])) for z in zones)
    if most == 0:
        return f"No {ask.label} is free right now. Choose another GPU model or try again later."
    if most < ask.gpu_count:
        return (
            f"Only {most} × {ask.label} can be combined in one machine right now (you asked for"
            f" {ask.gpu_count}). Ask for {most}, choose another model, or try again later."
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
        " scratch space you chose right now. Ask for fewer extras or try again later."
    )


def place_more(pool: Pool, zone: str, ask: DeviceAsk) -> tuple[Device, ...] | NoFit:
    """GPUs to add to a running machine in ``zone``: devices never compose across zones."""
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
