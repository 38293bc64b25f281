"""What the simulator and its clients agree on by wire format alone.

The OEM key and the tag's three properties are part of the Redfish dialect a
client speaks; the simulator keeps its own copy of them instead of importing
the client's, so that a change on one side shows up as a failing test rather
than silently changing both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The key under ComputerSystem.Oem that marks a host as composed by a hub.
OEM_KEY = "ComposeSpawner"


class TagShape(Protocol):
    """Anything with a tag's three fields: the state keeps what it is given.

    An in-process adapter may store its own domain type and read back the very
    object it wrote; what arrives over HTTP is a :class:`CompositionTag`.
    """

    @property
    def hub(self) -> str: ...

    @property
    def machine(self) -> str: ...

    @property
    def owner(self) -> str: ...


@dataclass(frozen=True, slots=True)
class CompositionTag:
    """``Oem.ComposeSpawner`` of a ComputerSystem: which hub composed it, for what."""

    hub: str
    machine: str
    owner: str
