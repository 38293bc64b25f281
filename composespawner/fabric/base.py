"""The fabric protocol: what composespawner needs from a composable fabric.

Everything above this module speaks in these types; everything below it (the
Redfish client, the simulator's in-process adapter) turns its own wire format
into them. The error tree is drawn here, at the top, so callers can see at a
glance which failures mean "the fabric said no" (safe to report, nothing
changed) and which mean "we do not know what happened" (never free hardware on
those: unknown is not dead).

    FabricError
    ├── FabricUnreachable        no answer: connect error, dropped connection, timeout
    │   └── FabricDeadlineExceeded   an operation's overall deadline ran out
    ├── FabricRefused            the fabric answered with an error status
    │   ├── DeviceInUse              Composition.ResourceBlockInUse (409)
    │   ├── DeviceNotFound           Composition.ResourceBlockNotFound / 404
    │   ├── IncompatibleZone         Composition.IncompatibleZone
    │   ├── NoResourceMatch          Composition.NoResourceMatch
    │   ├── StaleETag                Base.PreconditionFailed / 412, 428
    │   └── FabricAuthError          401 / 403 after a fresh login
    └── FabricTaskFailed         a 202 task monitor ended in Exception / Killed
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

DeviceKind = Literal["gpu", "nic", "nvme"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("gpu", "nic", "nvme")

# What the fabric says about a device's availability, reduced to what matters
# for placement. "free" means Status.State == Enabled, CompositionState ==
# Unused and Reserved == false; "attached" means it is part of some system;
# anything else (disabled, failed, reserved by another client) is "unavailable".
DeviceState = Literal["free", "attached", "unavailable"]

# The key under ComputerSystem.Oem that marks a host as composed by a hub.
OEM_KEY = "ComposeSpawner"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class FabricError(Exception):
    """Base of every fabric failure. ``str(err)`` is for logs."""


class FabricUnreachable(FabricError):
    """No usable answer: the state of the fabric after this call is unknown."""


class FabricDeadlineExceeded(FabricUnreachable):
    """An operation (with its retries and task polling) ran past its deadline."""


class FabricRefused(FabricError):
    """The fabric answered with an error: nothing was changed by this call."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        message_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message_ids = tuple(message_ids)


class DeviceInUse(FabricRefused):
    """The resource block is already part of a composition."""


class DeviceNotFound(FabricRefused):
    """The resource block or system does not exist (any more)."""


class IncompatibleZone(FabricRefused):
    """The blocks are not all in one resource zone."""


class NoResourceMatch(FabricRefused):
    """The fabric has nothing that matches the request."""


class StaleETag(FabricRefused):
    """If-Match did not match: someone changed the resource since we read it."""


class FabricAuthError(FabricRefused):
    """The fabric refused our credentials."""


class FabricTaskFailed(FabricError):
    """An asynchronous fabric task ended in failure."""

    def __init__(self, message: str, *, message_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message_ids = tuple(message_ids)


# ---------------------------------------------------------------------------
# Inventory: a snapshot of the fabric, in domain terms
# ---------------------------------------------------------------------------


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


def host_taken_by(
    current: CompositionTag | None, *, marked: bool, attached: Sequence[str], wanted: CompositionTag
) -> str | None:
    """Who holds a host we want to take, or None when taking it is safe.

    ``marked`` says whether the host carries any mark under our OEM key (a
    malformed one is not ours either); ``attached`` lists its device blocks.
    A host composed by anyone else, marked or not, is never ours to take.
    """
    if current == wanted:
        return None  # ours already: taking is idempotent
    if current is not None:
        return f"machine {current.machine} of {current.owner} (hub {current.hub})"
    if marked:
        return "a composition marked by another client"
    if attached:
        return f"a composition of another client ({len(attached)} devices attached)"
    return None


# ---------------------------------------------------------------------------
# The protocol every fabric driver implements
# ---------------------------------------------------------------------------


@runtime_checkable
class Fabric(Protocol):
    """A composable fabric, reduced to the six things a spawner needs.

    Every method is idempotent so callers may retry: attaching a block already
    attached to that host, detaching one that is not attached, and writing a
    tag that is already there all succeed. Attaching a block that is attached
    to *another* host raises :class:`DeviceInUse`.
    """

    async def inventory(self) -> Inventory:
        """A fresh snapshot of hosts, devices and zones."""
        ...

    async def host_mark(self, system_id: str) -> tuple[CompositionTag | None, tuple[str, ...]]:
        """One host's mark and the blocks linked to it now (its own block included).

        A cheap read of one system, for releases: the whole inventory is not needed.
        """
        ...

    async def tag_host(self, system_id: str, tag: CompositionTag | None) -> None:
        """Take a host for one machine by marking it (``None`` removes the mark).

        Taking is conditional, so two clients working from stale snapshots
        cannot both compose on one host: it raises :class:`DeviceInUse` when
        :func:`host_taken_by` names another holder, and the write is made with
        ``If-Match`` on what was read, so a change in between is seen too.
        """
        ...

    async def attach(self, system_id: str, block_id: str) -> None:
        """Attach one device block to a host (ComputerSystem.AddResourceBlock)."""
        ...

    async def detach(self, system_id: str, block_id: str) -> None:
        """Detach one device block from a host (ComputerSystem.RemoveResourceBlock)."""
        ...

    async def close(self) -> None:
        """Release sessions and connections."""
        ...
