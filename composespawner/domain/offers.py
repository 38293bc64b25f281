"""What the spawn form may offer one user, read off the pool placement would use.

Pure, as placement is: :func:`availability` of whole GPUs per model, :func:`shares_free`
of shares of one GPU, :func:`sizes_free` of each size, and the pool without what
cohorts' sessions keep (:func:`keep_back`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from composespawner.domain.hardware import Device, Inventory, Share
from composespawner.domain.placement import Pool


@dataclass(frozen=True, slots=True)
class Availability:
    """What the spawn form may offer of one GPU model to one user right now."""

    free: int  # free GPUs of the model a machine could get: in a zone with a host with room
    most_per_machine: int  # the largest count one machine could get (the catalog's cap at most)
    most_to_ask: int  # what the user may ask for: most_per_machine within their quota left
    why_none: str = ""  # for a person, when most_to_ask is 0: what is short and what to do


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
    return Pool(
        hosts=pool.hosts,
        devices=devices,
        zones=pool.zones,
        largest=pool.largest,
        open_shares=pool.open_shares,
    )


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
    quota_left: float | None = None,
) -> Availability:
    """How many GPUs of ``models`` one machine could get, and how many the user may ask for.

    A GPU counts only in a zone with a host that has a free slot: one stranded
    in a rack whose hosts are all full cannot be composed into anything; one
    machine gets no more than a host there has slots for. ``quota_left``: GPUs
    the user may still take (None: no limit).
    """
    gpus = [d for d in pool.devices if d.kind == "gpu" and d.model in models]
    slots: dict[str, int] = {}  # zone -> the most free slots on one host there
    for open_host in pool.hosts:
        if open_host.free.cores > 0 and open_host.free.memory_gib > 0:
            for zone in open_host.host.zones:
                slots[zone] = max(slots.get(zone, 0), open_host.free.slots)
    reachable = [d for d in gpus if any(slots.get(z, 0) > 0 for z in d.zones)]
    per_zone = [
        min(sum(1 for d in reachable if zone in d.zones), most) for zone, most in slots.items()
    ]
    most = min(max(per_zone, default=0), per_machine_cap)
    # Whole GPUs only: a quota with a quarter left has none to give whole.
    to_ask = most if quota_left is None else max(min(most, int(quota_left + 1e-9)), 0)
    return Availability(
        free=len(reachable),
        most_per_machine=most,
        most_to_ask=to_ask,
        why_none="" if to_ask else _why_none(label, gpus, quota_left),
    )


def _why_none(label: str, gpus: list[Device], quota_left: float | None) -> str:
    if quota_left is not None and quota_left < 1:
        return "Your GPU quota is used up: stop one of your servers to free some."
    if not gpus:
        return f"No {label} is free right now: choose another model or try again later."
    return (
        f"No free host in a rack with free {label} GPUs right now:"
        " choose another model or try again when a server stops."
    )


def sizes_free(pool: Pool, shares: Mapping[str, Share | None]) -> dict[str, int]:
    """Per size id: how many more CPU-only machines of that size fit now, on all hosts."""
    counts = {}
    for size_id, share in shares.items():
        if share is None:
            counts[size_id] = sum(1 for h in pool.hosts if h.fresh and h.free == h.total)
            continue
        counts[size_id] = sum(
            min(h.free.cores // share.cores, h.free.memory_gib // share.memory_gib)
            for h in pool.hosts
            if h.free.cores > 0 and h.free.memory_gib > 0
        )
    return counts


def shares_free(pool: Pool, models: frozenset[str], size: int) -> int:
    """How many shares of ``size`` (1/size of a GPU) of ``models`` new servers could get
    now: the free slots of split GPUs on hosts with room left, and ``size`` for each
    free GPU a one-GPU machine could get."""
    roomy = {h.host.system_id for h in pool.hosts if h.free.cores > 0 and h.free.memory_gib > 0}
    joinable = sum(
        s.free
        for s in pool.open_shares
        if s.size == size and s.gpu.model in models and s.host_id in roomy
    )
    return joinable + size * availability(pool, models, label="", per_machine_cap=1).free
