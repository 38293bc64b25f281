"""A GPU held in shares, as placement sees it: pure values and the one rule of who may join.

A GPU may be split into ``size`` holder slots (4: quarters), each held by one
machine; its holders time-slice it on the host it is attached to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from composespawner.domain.hardware import Device, Inventory
from composespawner.domain.rooms import OpenHost


@dataclass(frozen=True, slots=True)
class OpenShare:
    """A GPU split into shares of one size, on a host of ours, with holder slots free."""

    gpu: Device
    host_id: str  # the ComputerSystem it is attached to (or being attached to)
    size: int  # holder slots in all: 4 for quarters
    free: int  # holder slots not held


@dataclass(frozen=True, slots=True)
class SplitGpu:
    """What the ledger says of a GPU held in shares: where, in what size, by how many."""

    host_id: str
    size: int
    holders: int
    closing: bool = False  # its last holder left: it is being detached, nobody may join


def open_shares(
    inventory: Inventory,
    split: Mapping[str, SplitGpu],
    hosts: Sequence[OpenHost],
    owners: Mapping[str, str],
    allowed_owners: tuple[str | None, ...],
) -> tuple[OpenShare, ...]:
    """The split GPUs a share may join: a slot free, not closing, on a host in the pool,
    and (co-located) the user's to use."""
    if not split:
        return ()
    open_hosts = {h.host.system_id for h in hosts}
    found = []
    for device in inventory.devices:
        where = split.get(device.block_id)
        if (
            where is not None
            and not where.closing
            and where.holders < where.size
            and where.host_id in open_hosts
            and owners.get(device.block_id) in allowed_owners
        ):
            found.append(OpenShare(device, where.host_id, where.size, where.size - where.holders))
    return tuple(found)
