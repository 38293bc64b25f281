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
    ResourceMissing,
    ZoneMismatch,
)
from .inventory import InventorySpec
from .wire import TagShape

COMPOSED_PREFIX = "composed-"


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
    tag: TagShape | None = None


class ComposedSystems:
    """The composed systems of one fabric, with the rules of composing them."""

    def __init__(
        self,
        inventory: InventorySpec,
        *,
        holder: dict[str, str],
        tags: dict[str, TagShape],
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

    def decompose(self, system_id: str) -> tuple[ComposedSystem, TagShape | None]:
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

    def put(self, system_id: str, composed: ComposedSystem, tag: TagShape | None) -> None:
        """Make ``system_id`` of ``composed``'s blocks (checked already), tagged ``tag``."""
        self._composed[system_id] = composed
        for block_id in composed.blocks:
            self._holder[block_id] = system_id
        if tag is not None:
            self._tags[system_id] = tag
        self._touch(f"system:{system_id}", *(f"block:{b}" for b in composed.blocks))

    def to_json(self, tag_json: Callable[[TagShape | None], Any]) -> dict[str, Any]:
        return {
            system_id: {
                "name": composed.name,
                "blocks": list(composed.blocks),
                "tag": tag_json(self._tags.get(system_id)),
            }
            for system_id, composed in self._composed.items()
        }
