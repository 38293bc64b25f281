"""Room on a shared host: what it has, what its machines hold, what is left.

Several machines share one compute host, each with its own devices and a
share of the host's CPU cores and memory; a host takes only so many devices
(its slots). Plain data and one pure decision (:func:`room_for`): placement
packs by them, and the ledger claims them compare-and-set.
"""

from __future__ import annotations

from dataclasses import dataclass

from composespawner.domain.hardware import Host, Share

# Devices one host takes where neither the fabric nor the catalog says.
DEFAULT_MAX_DEVICES = 16


@dataclass(frozen=True, slots=True)
class Room:
    """Cores, memory and device slots: a host's capacity, what is free or what is held."""

    cores: int
    memory_gib: int
    slots: int

    def fits(self, need: Room) -> bool:
        return (
            need.cores <= self.cores
            and need.memory_gib <= self.memory_gib
            and need.slots <= self.slots
        )

    def __sub__(self, other: Room) -> Room:
        return Room(
            self.cores - other.cores, self.memory_gib - other.memory_gib, self.slots - other.slots
        )


NO_ROOM = Room(0, 0, 0)


@dataclass(frozen=True, slots=True)
class HostUse:
    """What the ledger's live machines hold on one host."""

    cores: int
    memory_gib: int
    slots: int
    machines: int


NO_USE = HostUse(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class OpenHost:
    """A host this hub may compose on, and the room it has left."""

    host: Host
    total: Room
    free: Room
    machines: int  # our live machines on it; 0: a fresh host, composing takes it

    @property
    def fresh(self) -> bool:
        return self.machines == 0


def room_for(share: Share | None, open_host: OpenHost, slots: int) -> Room | None:
    """What a machine of ``share`` (None: the whole host) takes of a host, or None if it
    does not fit there."""
    if share is None or not open_host.host.shareable:
        need = Room(open_host.total.cores, open_host.total.memory_gib, slots)
        return need if open_host.fresh and open_host.free.fits(need) else None
    need = Room(share.cores, share.memory_gib, slots)
    return need if open_host.free.fits(need) else None
