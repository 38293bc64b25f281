"""Standing hosts (``expandable`` mode): ComputerSystems that device blocks are added to.

Pure: part of :class:`~fabricsim.state.FabricState`, which shares with it who
holds each block, the systems' tags and the ETags. The rules of adding and
removing are the fabric's (see :mod:`fabricsim.state`): a host's own block is
never added or removed, a host that is not expandable takes no blocks, and a
repeated add or remove succeeds *before* any ETag is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import uris
from .composed import BLOCKS_PATH, Relink, wanted_devices
from .errors import (
    ActionNotSupported,
    BlockInUse,
    BlockNotEnabled,
    NotADeviceBlock,
    PropertyNotWritable,
    ResourceMissing,
    ZoneMismatch,
)
from .inventory import HostSpec, InventorySpec
from .marks import parse_mark
from .wire import HostMark

# Checks a write's If-Match ETags: (system id, block id, block ETag, system ETag).
ETagCheck = Callable[[str, str, "str | None", "str | None"], None]


class StandingHosts:
    """The devices attached to each standing host, in the order they were attached."""

    def __init__(
        self,
        inventory: InventorySpec,
        *,
        expandable: bool,
        not_expandable: frozenset[str],
        holder: dict[str, str],
        tags: dict[str, HostMark],
        touch: Callable[..., None],
        check_etags: ETagCheck,
        require_block: Callable[[str], None],
        is_enabled: Callable[[str], bool],
    ) -> None:
        self._inventory = inventory
        self._expandable = expandable
        self._not_expandable = not_expandable
        self._holder = holder  # the fabric's: block id -> system id
        self._tags = tags  # the fabric's: system id -> tag
        self._touch = touch
        self._check_etags = check_etags
        self._require_block = require_block
        self._is_enabled = is_enabled
        self._attached: dict[str, list[str]] = {h.id: [] for h in inventory.hosts}

    def host(self, system_id: str) -> HostSpec:
        """An expandable host's system; under specific composition hosts are no systems."""
        host = self._inventory.host(system_id) if self._expandable else None
        if host is None:
            raise ResourceMissing(uris.system_uri(system_id))
        return host

    def is_expandable_host(self, system_id: str) -> bool:
        """Whether a host's system takes devices (only standing hosts of expandable mode)."""
        return self._expandable and system_id not in self._not_expandable

    def attached(self, system_id: str) -> tuple[str, ...]:
        """Device blocks attached to a host, in the order they were attached."""
        return tuple(self._attached.get(system_id, ()))

    def attachments(self) -> list[tuple[str, str]]:
        """Every (host, device block) attached now."""
        return [(host, block) for host, blocks in self._attached.items() for block in blocks]

    def check_target(self, system_id: str, block_id: str, action: str) -> HostSpec:
        """The host, if ``block_id`` is a device block that ``action`` may name for it."""
        host = self.host(system_id)
        if not self.is_expandable_host(system_id):
            raise ActionNotSupported(f"ComputerSystem.{action}")
        self._require_block(block_id)
        if self._inventory.host_of_block(block_id) is not None:
            raise NotADeviceBlock("ResourceBlock", f"ComputerSystem.{action}")
        return host

    def add(
        self, system_id: str, block_id: str, block_etag: str | None, system_etag: str | None
    ) -> bool:
        """ComputerSystem.AddResourceBlock; False if it was already attached here."""
        host = self.check_target(system_id, block_id, uris.ADD_RESOURCE_BLOCK)
        if self._holder.get(block_id) == system_id:
            return False
        self._check_etags(system_id, block_id, block_etag, system_etag)
        holder = self._holder.get(block_id)
        if holder is not None:
            raise BlockInUse(block_id)
        if not set(self._inventory.block_zones(block_id)) & set(host.zones):
            raise ZoneMismatch()
        for needed in (block_id, host.block_id):
            if not self._is_enabled(needed):
                raise BlockNotEnabled(needed)
        self._holder[block_id] = system_id
        self._attached[system_id].append(block_id)
        self._touch_attachment(system_id, block_id)
        return True

    def remove(
        self, system_id: str, block_id: str, block_etag: str | None, system_etag: str | None
    ) -> bool:
        """ComputerSystem.RemoveResourceBlock; False if it was not attached here."""
        self.check_target(system_id, block_id, uris.REMOVE_RESOURCE_BLOCK)
        if self._holder.get(block_id) != system_id:
            return False
        self._check_etags(system_id, block_id, block_etag, system_etag)
        # A disabled (failed) device may still be detached: giving it back
        # must always be possible.
        del self._holder[block_id]
        self._attached[system_id].remove(block_id)
        self._touch_attachment(system_id, block_id)
        return True

    def plan_relink(self, system_id: str, blocks: Sequence[str]) -> Relink:
        """PATCH of ``Links.ResourceBlocks``: check all, then a step that makes it so.

        The same rules as the actions, for every device added or removed at
        once; a host that is not expandable takes none (its block list is
        read-only there).
        """
        host = self.host(system_id)
        if not self.is_expandable_host(system_id):
            raise PropertyNotWritable(BLOCKS_PATH)
        wanted = wanted_devices(self._inventory, self._require_block, host.block_id, blocks)
        current = self._attached[system_id]
        added = [b for b in wanted if b not in current]
        removed = [b for b in current if b not in wanted]
        for block_id in added:
            if block_id in self._holder:
                raise BlockInUse(block_id)
            if not set(self._inventory.block_zones(block_id)) & set(host.zones):
                raise ZoneMismatch()
        for needed in (*added, host.block_id) if added else ():
            if not self._is_enabled(needed):
                raise BlockNotEnabled(needed)

        def relink() -> None:
            for block_id in removed:
                del self._holder[block_id]
                current.remove(block_id)
            for block_id in added:
                self._holder[block_id] = system_id
                current.append(block_id)
            changed = [*removed, *added]
            if changed:
                self._touch(*(f"block:{b}" for b in changed), f"block:{host.block_id}")

        return relink

    def _touch_attachment(self, system_id: str, block_id: str) -> None:
        host_block = self.host(system_id).block_id
        self._touch(f"block:{block_id}", f"block:{host_block}", f"system:{system_id}")

    def restore_host(self, system_id: str, entry: Mapping[str, Any]) -> list[str]:
        """Load a host's saved attachments and tag; what was dropped and why."""
        if self._inventory.host(system_id) is None:
            return [f"dropped state of unknown host {system_id!r}"]
        if not self._expandable:
            held = entry.get("attached") or entry.get("tag")
            return [f"dropped expandable state of host {system_id!r}"] if held else []
        problems = []
        for block_id in entry.get("attached", []):
            problem = self._restore_attachment(system_id, block_id)
            if problem:
                problems.append(problem)
        mark = parse_mark(entry.get("tag"))  # checked by the state's document parser
        if mark is not None:
            self._tags[system_id] = mark
        return problems

    def _restore_attachment(self, system_id: str, block_id: str) -> str | None:
        if self._inventory.device(block_id) is None:
            return f"dropped attachment of unknown block {block_id!r} to {system_id}"
        if not self.is_expandable_host(system_id):
            return f"dropped attachment of {block_id!r} to {system_id}: it is not expandable"
        if block_id in self._holder:
            return f"dropped second attachment of {block_id!r} (to {system_id})"
        self._holder[block_id] = system_id
        self._attached[system_id].append(block_id)
        return None
