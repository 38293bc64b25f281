"""What the ledger hands out: plain frozen values, detached from any session.

Callers in other threads (the spawner runs the ledger through
``asyncio.to_thread``) can keep and pass these around freely; they never touch
a database session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

from composespawner.domain.hardware import Device, Host
from composespawner.domain.rooms import HostUse, Room
from composespawner.domain.shares import SplitGpu

# Hosts are holdable too: a machine on a host that cannot be shared (a whole system
# composed for it), or one from before hosts were shared, holds the host's own block.
HoldableKind = Literal["gpu", "nic", "nvme", "host"]
HOLDABLE_KINDS: tuple[HoldableKind, ...] = ("gpu", "nic", "nvme", "host")


def utcnow() -> datetime:
    return datetime.now(UTC)


def server_label(server: str) -> str:
    """How a user sees a server name: '' is their default server."""
    return f"server {server!r}" if server else "default server"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One holdable block as the ledger knows it (from the fabric inventory)."""

    block_id: str
    kind: HoldableKind
    model: str
    zones: frozenset[str]
    chassis: str
    owner_group: str | None = None  # set for co-located devices: only this group may hold it

    @classmethod
    def from_device(cls, device: Device, owner_group: str | None = None) -> DeviceRecord:
        return cls(
            device.block_id, device.kind, device.model, device.zones, device.chassis, owner_group
        )

    @classmethod
    def from_host(cls, host: Host, chassis: str = "") -> DeviceRecord:
        model = f"{host.cpus} CPUs, {host.memory_gib} GiB"
        return cls(host.block_id, "host", model, host.zones, chassis)


@dataclass(frozen=True, slots=True)
class Machine:
    """One composed (or being composed) machine serving one user's server."""

    id: str
    user_name: str
    server_name: str  # '' is the user's default server
    state: str
    host_id: str | None
    zone: str | None
    request: dict[str, Any] = field(hash=False)  # the validated request, as submitted
    failure: str | None  # the user-facing reason it failed
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    block_ids: tuple[str, ...] = ()  # blocks held now, sorted; empty once terminal
    # Of block_ids, the GPUs it holds a share of (time-sliced with their other holders).
    shared: tuple[str, ...] = ()
    gpu_share: int = 1  # the shares' size: 4 for a quarter; 1 when it holds none
    cohort: str | None = None  # the cohort reservation its GPUs were claimed under
    cores: int | None = None  # its share of its host (None: the whole host, from before)
    memory_gib: int | None = None


@dataclass(frozen=True, slots=True)
class HostRecord:
    """A compute host as the ledger keeps it: its system, its own block, what it has.

    ``capacity`` is the host's as the fabric (or the catalog) says; the ledger
    takes a change of it only while no machine is on the host.
    """

    host_id: str  # the ComputerSystem Id machines name
    block_id: str
    capacity: Room


class Holds(NamedTuple):
    """What placement reads of the ledger (see ``Ledger.holds``)."""

    held: dict[str, str]  # block id → who holds it
    use: dict[str, HostUse]  # host id → what live machines hold of it
    split: dict[str, SplitGpu]  # block id → the GPU's shares


@dataclass(frozen=True, slots=True)
class RoomClaim:
    """What a claim takes of its host besides devices: cores and memory, and a slot per device."""

    host: HostRecord
    cores: int
    memory_gib: int


@dataclass(frozen=True, slots=True)
class MachineEvent:
    id: int
    machine_id: str
    at: datetime
    from_state: str | None  # None for the event that created the machine
    to_state: str
    message: str


@dataclass(frozen=True, slots=True)
class RunManifest:
    """What one server ran on (composespawner.domain.manifest), kept after it ended."""

    machine_id: str
    user_name: str
    server_name: str
    started_at: datetime
    manifest: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Who held which device from when to when."""

    id: int
    machine_id: str
    user_name: str
    server_name: str
    block_id: str
    kind: str
    model: str
    started_at: datetime
    ended_at: datetime
    fraction: float = 1.0  # of the device it held: 1/n for a share of a GPU

    @property
    def seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def device_seconds(self) -> float:
        """What it counts for: a quarter of a GPU for an hour is a quarter GPU-hour."""
        return self.seconds * self.fraction


@dataclass(frozen=True, slots=True)
class ServerUse:
    """What one of a user's live servers holds: GPUs, and its share of its host."""

    server: str
    gpus: float  # a share of 1/n of a GPU counts 1/n
    cores: int = 0  # 0 for a machine from before hosts were shared (it recorded none)
    memory_gib: int = 0


@dataclass(frozen=True, slots=True)
class KeepFree:
    """GPUs a claim must leave free: a cohort's reservation, for someone outside the cohort.

    The claim may take GPUs of ``models`` only while, after it, the free ones
    still cover what the reservation's members do not already hold.
    """

    cohort: str
    models: frozenset[str]  # fabric GPU models
    gpus: int  # the reservation's size
    label: str  # the model as a person names it
    until: str  # when the session ends, as a person reads it


@dataclass(frozen=True, slots=True)
class Holding:
    """One device as the admins' inventory shows it: what it is, and who holds it."""

    device: DeviceRecord
    last_seen: datetime  # when a hub last saw it in the fabric's inventory
    machine_id: str | None = None
    held_since: datetime | None = None
    user: str | None = None
    server: str | None = None
    state: str | None = None  # the holding machine's
    host: str | None = None
    cohort: str | None = None
    # A GPU split into share_size slots (None: held whole or free), and its holders:
    # the machine fields above are then None.
    share_size: int | None = None
    shares: tuple[ShareHolding, ...] = ()


@dataclass(frozen=True, slots=True)
class ShareHolding:
    """One holder of a slot of a split GPU, as the admins' inventory shows it."""

    machine_id: str
    user: str
    server: str
    state: str
    host: str | None
    cohort: str | None
    held_since: datetime
    leaving: bool  # its machine is being released: its slot no longer counts
