"""What the pool is made of: hosts, devices, zones and a snapshot of them.

Plain data, no I/O. The fabric adapters produce it (``fabric/``); placement,
the ledger's records and the composer consume it, and import nothing from the
fabric package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

DeviceKind = Literal["gpu", "nic", "nvme"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("gpu", "nic", "nvme")

# What the fabric says about a device's availability, reduced to what matters
# for placement. "free" means Status.State == Enabled, CompositionState ==
# Unused and Reserved == false; "attached" means it is part of some system;
# anything else (disabled, failed, reserved by another client) is "unavailable".
DeviceState = Literal["free", "attached", "unavailable"]


@dataclass(frozen=True, slots=True)
class Device:
    """One attachable device: a GPU, a NIC or an NVMe drive (one resource block)."""

    block_id: str  # the ResourceBlock's Id: our device id everywhere
    kind: DeviceKind
    model: str  # Processor.Model / Drive.Model / the NIC's description
    zones: frozenset[str]  # ResourceZone Ids this block may compose in
    chassis: str  # Chassis Id the device sits in
    state: DeviceState
    attached_to: str | None = None  # host system Id while attached
    memory_gib: int | None = None  # GPUs
    uuid: str | None = None  # GPUs: Processor.UUID, what container runtimes select by
    speed_gbps: int | None = None  # NICs
    capacity_gb: int | None = None  # NVMe drives (decimal GB, as vendors sell them)


@dataclass(frozen=True, slots=True)
class CompositionTag:
    """One machine a hub composed on a host: who it is for.

    Listed in the host's :class:`HostMark`, so the reconciler can tell our
    compositions from anyone else's and never touch what it did not make.
    """

    hub: str  # the hub's identity (ComposeSpawner.hub_id)
    machine: str  # the ledger's machine id
    owner: str  # "user/servername", for people reading the fabric


@dataclass(frozen=True, slots=True)
class HostMark:
    """Our mark on a host (``Oem.ComposeSpawner`` of its ComputerSystem).

    It names the hub that composed the host and the machines of that hub on it
    now: several servers share one host, each with its own devices. A host
    carries the mark from its first machine's compose to its last one's release.
    """

    hub: str
    machines: tuple[CompositionTag, ...]  # each with this hub

    def has(self, tag: CompositionTag) -> bool:
        return any(m.machine == tag.machine for m in self.machines) and self.hub == tag.hub

    def joined(self, tag: CompositionTag) -> HostMark:
        """The mark with ``tag``'s machine on it too."""
        if self.has(tag):
            return self
        return HostMark(self.hub, (*self.machines, tag))

    def left(self, tag: CompositionTag) -> HostMark | None:
        """The mark without ``tag``'s machine; None when it was the last."""
        rest = tuple(m for m in self.machines if m.machine != tag.machine)
        return HostMark(self.hub, rest) if rest else None

    @classmethod
    def of(cls, tag: CompositionTag) -> HostMark:
        return cls(tag.hub, (tag,))


@dataclass(frozen=True, slots=True)
class Host:
    """A compute host that devices can be attached to (an expandable system)."""

    system_id: str  # ComputerSystem Id
    block_id: str  # its ComputerSystem-type ResourceBlock
    zones: frozenset[str]
    cpus: int  # CPU cores (ProcessorSummary.CoreCount)
    memory_gib: int
    state: Literal["enabled", "unavailable"]
    attached: tuple[str, ...] = ()  # device block ids attached now (its own block excluded)
    mark: HostMark | None = None
    max_devices: int | None = None  # devices it can take, where the fabric says
    # Whether machines can share it: each attached and detached on its own. Where
    # the fabric composes whole systems that it cannot change, a machine has its
    # host to itself, whatever size it asked for.
    shareable: bool = True


@dataclass(frozen=True, slots=True)
class Share:
    """A machine's share of its host: the CPU cores and memory its notebook may use.

    Several machines share one host; each gets its own devices and this much of
    the host's own CPUs and memory (the launcher enforces it: a cgroup, a pod's
    limits).
    """

    cores: int
    memory_gib: int


@dataclass(frozen=True, slots=True)
class Inventory:
    """Everything placement needs to know about the fabric at one moment."""

    hosts: tuple[Host, ...] = ()
    devices: tuple[Device, ...] = ()
    zones: tuple[str, ...] = ()
    _by_block: dict[str, Device] = field(default_factory=dict, compare=False, repr=False)
    _largest: list[tuple[int, int]] = field(default_factory=list, compare=False, repr=False)
    # What placement works out of this snapshot alone, kept with it: every spawn reads
    # the same snapshot (see placement.pool_for).
    derived: dict[object, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_block.update({d.block_id: d for d in self.devices})

    def largest_host(self) -> tuple[int, int]:
        """The most cores and the most memory (GiB) any shareable host has (worked out once)."""
        if not self._largest:
            shared = [h for h in self.hosts if h.shareable and h.state == "enabled"]
            cores = max((h.cpus for h in shared), default=0)
            memory = max((h.memory_gib for h in shared), default=0)
            self._largest.append((cores, memory))
        return self._largest[0]

    def device(self, block_id: str) -> Device | None:
        return self._by_block.get(block_id)

    def host(self, system_id: str) -> Host | None:
        return next((h for h in self.hosts if h.system_id == system_id), None)
