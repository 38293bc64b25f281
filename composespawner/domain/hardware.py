"""What the pool is made of: hosts, devices, zones and a snapshot of them.

Plain data, no I/O. The fabric adapters produce it (``fabric/``); placement,
the ledger's records and the composer consume it, and import nothing from the
fabric package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
    """Marks a host as composed by a hub for one server.

    Written into ``Oem.ComposeSpawner`` of the host's ComputerSystem, so the
    reconciler can tell our compositions from anyone else's and never touch
    what it did not make.
    """

    hub: str  # the hub's identity (ComposeSpawner.hub_id)
    machine: str  # the ledger's machine id
    owner: str  # "user/servername", for people reading the fabric


@dataclass(frozen=True, slots=True)
class Host:
    """A compute host that devices can be attached to (an expandable system)."""

    system_id: str  # ComputerSystem Id
    block_id: str  # its ComputerSystem-type ResourceBlock
    zones: frozenset[str]
    cpus: int
    memory_gib: int
    state: Literal["enabled", "unavailable"]
    attached: tuple[str, ...] = ()  # device block ids attached now (its own block excluded)
    tag: CompositionTag | None = None


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

    def __post_init__(self) -> None:
        self._by_block.update({d.block_id: d for d in self.devices})

    def device(self, block_id: str) -> Device | None:
        return self._by_block.get(block_id)

    def host(self, system_id: str) -> Host | None:
        return next((h for h in self.hosts if h.system_id == system_id), None)
