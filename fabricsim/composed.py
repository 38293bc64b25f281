"""Composed systems (``specific`` and ``action`` modes): systems that exist while composed.

A composed system is one compute block and device blocks, taken all at once or
not at all, until it is decomposed. Pure: part of :class:`~fabricsim.state.FabricState`,
which shares with it who holds each block, the systems' tags and the ETags.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import uris
from .errors import (
    BlockInUse,
    BlockNotEnabled,
    NotOneComputeBlock,
    OwnBlockRequired,
    ResourceMissing,
    SimulatorError,
    ZoneMismatch,
)
from .inventory import InventorySpec
from .marks import parse_mark
from .wire import HostMark

COMPOSED_PREFIX = "composed-"
# Where a PATCH names a system's whole block list.
BLOCKS_PATH = "/Links/ResourceBlocks"
# Applies a checked change of a system's blocks (the state touches the system once).
Relink = Callable[[], None]


@dataclass(frozen=True, slots=True)
class ComposedSystem:
    """A system made by specific composition: one compute block and devices."""

    name: str
    blocks: tuple[str, ...]  # the compute block first


@dataclass(frozen=True, slots=True)
class CompositionRequest:
    """What a POST to Systems or a ComposeSystem stanza asks for."""

    name: str
    blocks: tuple[str, ...]
    tag: HostMark | None = None


class ComposedSystems:
    """The composed systems of one fabric, with the rules of composing them."""

    def __init__(
        self,
        inventory: InventorySpec,
        *,
        holder: dict[str, str],
        tags: dict[str, HostMark],
        touch: Callable[..., None],
        require_block: Callable[[str], None],
        is_enabled: Callable[[str], bool],
    ) -> None:
        self._inventory = inventory
        self._holder = holder  # the fabric's: block id -> system id
        self._tags = tags  # the fabric's: system id -> tag
        self._touch = touch
        self._require_block = require_block
        self._is_enabled = is_enabled
        self._composed: dict[str, ComposedSystem] = {}
        self.next_system = 1

    def get(self, system_id: str) -> ComposedSystem | None:
        return self._composed.get(system_id)

    def ids(self) -> list[str]:
        return list(self._composed)

    def compose(self, request: CompositionRequest) -> str:
        """A new system of exactly these blocks, or a refusal.

        All or nothing: every block is checked before anything changes.
        """
        self.check(request.blocks)
        system_id = f"{COMPOSED_PREFIX}{self.next_system}"
        self.next_system += 1
        self.put(system_id, ComposedSystem(request.name, request.blocks), request.tag)
        return system_id

    def decompose(self, system_id: str) -> tuple[ComposedSystem, HostMark | None]:
        """Give a composed system's blocks back to the free pool; what it was."""
        composed = self._composed.get(system_id)
        if composed is None:
            raise ResourceMissing(uris.system_uri(system_id))
        del self._composed[system_id]
        for block_id in composed.blocks:
            self._holder.pop(block_id, None)
        tag = self._tags.pop(system_id, None)
        self._touch(f"system:{system_id}", *(f"block:{b}" for b in composed.blocks))
        return composed, tag

    def plan_relink(self, system_id: str, blocks: Sequence[str]) -> Relink:
        """PATCH of ``Links.ResourceBlocks``: check all, then a step that makes it so.

        Devices missing from ``blocks`` go back to the free pool, new ones join,
        and the compute block stays: the system is the same system, so every
        block of it must still share one zone.
        """
        composed = self._composed.get(system_id)
        if composed is None:
            raise ResourceMissing(uris.system_uri(system_id))
        own, current = composed.blocks[0], composed.blocks[1:]
        wanted = wanted_devices(self._inventory, self._require_block, own, blocks)
        added = [b for b in wanted if b not in current]
        kept = [b for b in current if b in wanted]
        for block_id in added:
            if block_id in self._holder:
                raise BlockInUse(block_id)
        new = (own, *kept, *added)
        if not set.intersection(*(set(self._inventory.block_zones(b)) for b in new)):
            raise ZoneMismatch()
        for block_id in added:
            if not self._is_enabled(block_id):
                raise BlockNotEnabled(block_id)

        def relink() -> None:
            for block_id in set(current) - set(kept):
                del self._holder[block_id]
            for block_id in added:
                self._holder[block_id] = system_id
            self._composed[system_id] = ComposedSystem(composed.name, new)
            changed = set(added) | (set(current) - set(kept))
            self._touch(*(f"block:{b}" for b in sorted(changed)))

        return relink

    def check(self, blocks: Sequence[str]) -> None:
        """Refuse a composition of ``blocks`` unless it may be made now."""
        for block_id in blocks:
            self._require_block(block_id)
        computes = [b for b in blocks if self._inventory.host_of_block(b) is not None]
        if len(computes) != 1 or blocks[0] != computes[0] or len(set(blocks)) != len(blocks):
            # The compute block first is our own rule, so a system's first block names its host.
            raise NotOneComputeBlock("Links/ResourceBlocks")
        for block_id in blocks:
            if block_id in self._holder:
                raise BlockInUse(block_id)
        zones = [set(self._inventory.block_zones(b)) for b in blocks]
        if not set.intersection(*zones):
            raise ZoneMismatch()
        for block_id in blocks:
            if not self._is_enabled(block_id):
                raise BlockNotEnabled(block_id)

    def put(self, system_id: str, composed: ComposedSystem, tag: HostMark | None) -> None:
        """Make ``system_id`` of ``composed``'s blocks (checked already), tagged ``tag``."""
        self._composed[system_id] = composed
        for block_id in composed.blocks:
            self._holder[block_id] = system_id
        if tag is not None:
            self._tags[system_id] = tag
        self._touch(f"system:{system_id}", *(f"block:{b}" for b in composed.blocks))

    def restore(self, system_id: str, entry: Any) -> str | None:
        """Load a saved composed system; what was dropped and why (None: nothing)."""
        blocks = entry.get("blocks") if isinstance(entry, dict) else None
        if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
            return f"dropped composed system {system_id!r}: `blocks` is not a list of block ids"
        try:
            self.check(blocks)
        except SimulatorError as err:
            return f"dropped composed system {system_id!r}: {err}"
        try:
            mark = parse_mark(entry.get("tag"))
        except SimulatorError:
            mark = None  # as before: a system with an unreadable mark keeps none
        name = entry.get("name")
        name = name if isinstance(name, str) else system_id
        self.put(system_id, ComposedSystem(name, tuple(blocks)), mark)
        return None

    def to_json(self, tag_json: Callable[[HostMark | None], Any]) -> dict[str, Any]:
        return {
            system_id: {
                "name": composed.name,
                "blocks": list(composed.blocks),
                "tag": tag_json(self._tags.get(system_id)),
            }
            for system_id, composed in self._composed.items()
        }


def wanted_devices(
    inventory: InventorySpec,
    require_block: Callable[[str], None],
    own_block: str,
    blocks: Sequence[str],
) -> tuple[str, ...]:
    """The device blocks of a system's whole desired block list, in its order.

    The list must name every block once, and of compute blocks exactly the
    system's own: a system never loses the block it stands on, nor takes a
    second host's.
    """
    for block_id in blocks:
        require_block(block_id)
    computes = [b for b in blocks if inventory.host_of_block(b) is not None]
    if computes != [own_block] or len(set(blocks)) != len(blocks):
        raise OwnBlockRequired(BLOCKS_PATH)
    return tuple(b for b in blocks if b != own_block)
