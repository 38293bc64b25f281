"""What the simulator and its clients agree on by wire format alone.

The OEM key and the mark's properties are part of the Redfish dialect a
client speaks; the simulator keeps its own copy of them instead of importing
the client's, so that a change on one side shows up as a failing test rather
than silently changing both.

The mark on a ComputerSystem (``Oem.ComposeSpawner``) has two versions, and
the service takes and keeps either, exactly as written:

``ComposeSpawner.v1_0_0`` (:class:`CompositionTag`)
    ``{"Hub", "Machine", "Owner"}``: a host composed for one machine, as
    older clients write it;
``ComposeSpawner.v1_1_0`` (:class:`SharedMark`)
    ``{"Hub", "Machines": [{"Machine", "Owner"}, ...]}``: a host shared by
    the machines listed (at least one; a mark of none is removed instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# The key under ComputerSystem.Oem that marks a host as composed by a hub.
OEM_KEY = "ComposeSpawner"
TAG_TYPE = "#ComposeSpawner.v1_0_0.ComposeSpawner"
SHARED_MARK_TYPE = "#ComposeSpawner.v1_1_0.Mark"


class TagShape(Protocol):
    """Anything with a v1_0_0 tag's three fields: the state keeps what it is given.

    An in-process adapter may store its own domain type and read back the very
    object it wrote; what arrives over HTTP is a :class:`CompositionTag`.
    """

    @property
    def hub(self) -> str: ...

    @property
    def machine(self) -> str: ...

    @property
    def owner(self) -> str: ...


class MachineShape(Protocol):
    """One machine of a shared mark: its id and its user/server."""

    @property
    def machine(self) -> str: ...

    @property
    def owner(self) -> str: ...


@runtime_checkable
class SharedMarkShape(Protocol):
    """Anything with a v1_1_0 mark's fields (told from a tag by its ``machines``)."""

    @property
    def hub(self) -> str: ...

    @property
    def machines(self) -> Sequence[MachineShape]: ...


# What the state keeps under a system's Oem.ComposeSpawner.
HostMark = TagShape | SharedMarkShape


@dataclass(frozen=True, slots=True)
class CompositionTag:
    """``Oem.ComposeSpawner`` v1_0_0 of a ComputerSystem: which hub composed it, for what."""

    hub: str
    machine: str
    owner: str


@dataclass(frozen=True, slots=True)
class MachineRef:
    """One entry of a v1_1_0 mark's ``Machines``."""

    machine: str
    owner: str


@dataclass(frozen=True, slots=True)
class SharedMark:
    """``Oem.ComposeSpawner`` v1_1_0: the hub that composed a host, and its machines there."""

    hub: str
    machines: tuple[MachineRef, ...]


def is_shared(mark: HostMark) -> bool:
    """Whether a mark is of the v1_1_0 shape (a list of machines)."""
    return isinstance(mark, SharedMarkShape)


def mark_json(mark: HostMark) -> dict[str, object]:
    """A mark's properties as written on the wire (no ``@odata.type``)."""
    if isinstance(mark, SharedMarkShape):
        machines = [{"Machine": m.machine, "Owner": m.owner} for m in mark.machines]
        return {"Hub": mark.hub, "Machines": machines}
    return {"Hub": mark.hub, "Machine": mark.machine, "Owner": mark.owner}


def mark_type(mark: HostMark) -> str:
    """The ``@odata.type`` a mark is served with: the version of its shape."""
    return SHARED_MARK_TYPE if isinstance(mark, SharedMarkShape) else TAG_TYPE
