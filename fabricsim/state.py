"""The simulated fabric's state: who holds which block, tags, ETags (pure).

No tornado and no I/O here: the HTTP layer (:mod:`.handlers`) and the in-process
fake (``tests.support.inprocess``) are thin adapters over this
model, so both accept and refuse exactly the same operations.

Rules, as a composable PCIe fabric has them:

* a device block is composed into at most one system (``MaxCompositions`` 1);
* it may join a system only if they share a resource zone, and only while
  it is Enabled;
* a host's own ComputerSystem block is never added or removed (a PATCH of a
  system's whole ``Links.ResourceBlocks`` must keep it);
* a host that is not expandable (``not_expandable``, like a service's fixed
  servers) takes no blocks at all: its system offers no block actions;
* add and remove are idempotent: repeating one that already took effect
  changes nothing and succeeds, *before* any ETag is checked, so a client
  retrying after a lost answer is not refused for the ETag its own first
  attempt changed;
* every write changes the ETags of the resources it touched; a PATCH of a
  system (its blocks and its mark together) is one write: all of it is
  checked before any of it is done, and the system's ETag changes once.

The composition mode says how systems come to be (:data:`COMPOSITION_MODES`):
``expandable`` hosts are standing ComputerSystems that devices are added to;
under ``specific`` and ``action`` a host is only a free compute block, and a
system exists while it is composed, of one compute block and device blocks,
all at once or not at all (:meth:`FabricState.compose_system`, with
:mod:`.composed`), until it is decomposed. That is what DMTF's composability
mockup shows: its Systems collection lists composed systems only, and its
compute blocks are Unused until a composition takes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from . import uris
from .composed import ComposedSystem, ComposedSystems, CompositionRequest, Relink
from .errors import (
    BlockNotFound,
    ETagMismatch,
    ETagRequired,
    ResourceMissing,
    SimulatorError,
)
from .hosts import StandingHosts
from .inventory import HostSpec, InventoryError, InventorySpec
from .marks import parse_mark
from .wire import HostMark, mark_json

STATE_FORMAT = 1
CompositionMode = Literal["expandable", "specific", "action"]
COMPOSITION_MODES: tuple[CompositionMode, ...] = ("expandable", "specific", "action")


class StateFileError(ValueError):
    """A saved state document that cannot be understood."""


class FabricState:
    """Attachments, tags, disabled blocks and write counters of one fabric."""

    def __init__(
        self,
        inventory: InventorySpec,
        *,
        epoch: str,
        composition: CompositionMode = "expandable",
        not_expandable: Iterable[str] = (),
    ) -> None:
        self.inventory = inventory
        self.composition = composition
        self.not_expandable = _fixed_hosts(inventory, composition, not_expandable)
        # Part of every ETag, so ETags from a previous run without a state
        # file never match by accident.
        self.epoch = epoch
        self._holder: dict[str, str] = {}  # device block id -> system id
        self._tags: dict[str, HostMark] = {}
        self._disabled: frozenset[str] = frozenset()
        self._versions: dict[str, int] = {}
        self._hosts = StandingHosts(  # expandable mode
            inventory,
            expandable=self.expandable,
            not_expandable=self.not_expandable,
            holder=self._holder,
            tags=self._tags,
            touch=self._touch,
            check_etags=self._check_etags,
            require_block=self.require_block,
            is_enabled=self.is_enabled,
        )
        self._composed = ComposedSystems(  # specific / action modes
            inventory,
            holder=self._holder,
            tags=self._tags,
            touch=self._touch,
            require_block=self.require_block,
            is_enabled=self.is_enabled,
        )

    @property
    def expandable(self) -> bool:
        return self.composition == "expandable"

    # --- queries ------------------------------------------------------------

    def host(self, system_id: str) -> HostSpec:
        """An expandable host's system; under specific composition hosts are no systems."""
        return self._hosts.host(system_id)

    def is_expandable_host(self, system_id: str) -> bool:
        """Whether a host's system takes devices (only standing hosts of expandable mode)."""
        return self._hosts.is_expandable_host(system_id)

    def system_ids(self) -> list[str]:
        """The ComputerSystems the service shows now."""
        if self.expandable:
            return [h.id for h in self.inventory.hosts]
        return self._composed.ids()

    def has_system(self, system_id: str) -> bool:
        return system_id in self.system_ids()

    def composed(self, system_id: str) -> ComposedSystem | None:
        return self._composed.get(system_id)

    def system_blocks(self, system_id: str) -> tuple[str, ...]:
        """Every block a system is made of, its compute block first."""
        composed = self._composed.get(system_id)
        if composed is not None:
            return composed.blocks
        return (self.host(system_id).block_id, *self.attached(system_id))

    def system_host(self, system_id: str) -> HostSpec:
        """The host whose compute block a system stands on."""
        composed = self._composed.get(system_id)
        if composed is None:
            return self.host(system_id)
        host = self.inventory.host_of_block(composed.blocks[0])
        assert host is not None  # compose_system checked it
        return host

    def require_block(self, block_id: str) -> None:
        if self.inventory.device(block_id) is None and not self.is_host_block(block_id):
            raise BlockNotFound(uris.block_uri(block_id))

    def is_host_block(self, block_id: str) -> bool:
        return self.inventory.host_of_block(block_id) is not None

    def holder(self, block_id: str) -> str | None:
        """The system a block is composed into (a host block: its own host, once composed)."""
        host = self.inventory.host_of_block(block_id)
        if host is not None and self.expandable:
            return host.id if self._hosts.attached(host.id) else None
        return self._holder.get(block_id)

    def attached(self, system_id: str) -> tuple[str, ...]:
        """Device blocks attached to a host, in the order they were attached."""
        return self._hosts.attached(system_id)

    def tag(self, system_id: str) -> HostMark | None:
        """The system's mark, exactly as it was written (either version)."""
        return self._tags.get(system_id)

    def is_enabled(self, block_id: str) -> bool:
        return block_id not in self._disabled

    def disabled(self) -> list[str]:
        return sorted(self._disabled)

    def block_etag(self, block_id: str) -> str:
        return self._etag(f"block:{block_id}")

    def system_etag(self, system_id: str) -> str:
        return self._etag(f"system:{system_id}")

    def check_target(self, system_id: str, block_id: str, action: str) -> HostSpec:
        """The host, if ``block_id`` is a device block that ``action`` may name for it."""
        return self._hosts.check_target(system_id, block_id, action)

    # --- commands -----------------------------------------------------------

    def add_resource_block(
        self,
        system_id: str,
        block_id: str,
        *,
        block_etag: str | None = None,
        system_etag: str | None = None,
    ) -> bool:
        """ComputerSystem.AddResourceBlock; False if it was already attached here."""
        return self._hosts.add(system_id, block_id, block_etag, system_etag)

    def remove_resource_block(
        self,
        system_id: str,
        block_id: str,
        *,
        block_etag: str | None = None,
        system_etag: str | None = None,
    ) -> bool:
        """ComputerSystem.RemoveResourceBlock; False if it was not attached here."""
        return self._hosts.remove(system_id, block_id, block_etag, system_etag)

    def set_tag(self, system_id: str, tag: HostMark | None, *, if_match: str | None) -> None:
        """PATCH of ``Oem.ComposeSpawner`` alone: ``If-Match`` is required."""
        self.patch_system(system_id, if_match=if_match, mark=tag, writes_mark=True)

    def patch_system(
        self,
        system_id: str,
        *,
        if_match: str | None,
        blocks: Sequence[str] | None = None,
        mark: HostMark | None = None,
        writes_mark: bool = False,
    ) -> None:
        """PATCH of a system: its whole block list (``blocks``) and/or its mark, as one write.

        ``If-Match`` is required. Everything is checked before anything
        changes; then the blocks are attached and detached, the mark written
        (None removes it), and the system's ETag changes once.
        """
        self.check_if_match(system_id, if_match, required=True)
        relink = self.plan_relink(system_id, blocks) if blocks is not None else None
        if relink is not None:
            relink()
        if writes_mark and mark is None:
            self._tags.pop(system_id, None)
        elif writes_mark and mark is not None:
            self._tags[system_id] = mark
        self._touch(f"system:{system_id}")

    def check_if_match(self, system_id: str, if_match: str | None, *, required: bool) -> None:
        """Refuse a write to a system without a current ``If-Match`` (if ``required``)."""
        if not self.has_system(system_id):
            raise ResourceMissing(uris.system_uri(system_id))
        if if_match is None and required:
            raise ETagRequired()
        if if_match is not None and not if_match_allows(if_match, self.system_etag(system_id)):
            raise ETagMismatch()

    def plan_relink(self, system_id: str, blocks: Sequence[str]) -> Relink:
        """Check a new whole block list for a system; the step that applies it."""
        if self._composed.get(system_id) is not None:
            return self._composed.plan_relink(system_id, blocks)
        return self._hosts.plan_relink(system_id, blocks)

    def compose_system(self, request: CompositionRequest) -> str:
        """Specific composition: a new system of exactly these blocks, or a refusal.

        All or nothing: every block is checked before anything changes.
        """
        return self._composed.compose(request)

    def decompose_system(
        self, system_id: str, *, if_match: str | None = None
    ) -> tuple[ComposedSystem, HostMark | None]:
        """Give a composed system's blocks back to the free pool; what it was.

        With ``if_match`` (DELETE's ``If-Match``), only if nobody changed the
        system since the client read it.
        """
        if if_match is not None:
            self.check_if_match(system_id, if_match, required=False)
        return self._composed.decompose(system_id)

    def restore_system(
        self, system_id: str, composed: ComposedSystem, tag: HostMark | None
    ) -> None:
        """Undo :meth:`decompose_system` (a failed manifest puts back what it took apart)."""
        self._composed.put(system_id, composed, tag)

    def set_disabled(self, block_ids: Iterable[str]) -> None:
        """Mark exactly these blocks not Enabled (a fault switch; not persisted)."""
        disabled = frozenset(block_ids)
        for block_id in sorted(disabled):
            self.require_block(block_id)
        for block_id in disabled ^ self._disabled:
            self._touch(f"block:{block_id}")
        self._disabled = disabled

    def reset(self) -> None:
        """Detach everything and clear tags; ETags keep counting up."""
        for system_id in self._composed.ids():
            self.decompose_system(system_id)
        for system_id, block_id in self._hosts.attachments():
            self.remove_resource_block(system_id, block_id)
        for system_id in list(self._tags):
            self.set_tag(system_id, None, if_match="*")
        self.set_disabled(())

    # --- persistence ----------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready document of everything that survives a restart."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "versions": dict(sorted(self._versions.items())),
            "hosts": {
                host.id: {
                    "attached": list(self.attached(host.id)),
                    "tag": _tag_json(self.tag(host.id)),
                }
                for host in self.inventory.hosts
            },
            # Written in every mode, so a file shows what it holds; restored only
            # under specific composition.
            "composed": self._composed.to_json(_tag_json),
            "next_system": self._composed.next_system,
        }

    def restore(self, document: Any) -> list[str]:
        """Load a :meth:`to_json` document; returns what was dropped and why.

        Entries that no longer fit the inventory (a host or block removed
        from the file) are dropped and reported rather than refused: the
        inventory file is the truth about the hardware.
        """
        hosts, versions = _parse_document(document)
        self.epoch = str(document["epoch"])
        self._versions = dict(versions)
        problems: list[str] = []
        for system_id, entry in hosts.items():
            problems += self._hosts.restore_host(system_id, entry)
        next_system = document.get("next_system", 1)
        self._composed.next_system = next_system if isinstance(next_system, int) else 1
        composed = document.get("composed") or {}
        if not isinstance(composed, dict):
            return [*problems, "dropped composed systems: not an object"]
        for system_id, entry in composed.items():
            problem = (
                f"dropped composed system {system_id!r}: the service is in expandable mode"
                if self.expandable
                else self._composed.restore(system_id, entry)
            )
            if problem:
                problems.append(problem)
        return problems

    # --- internals ------------------------------------------------------------

    def _check_etags(
        self, system_id: str, block_id: str, block_etag: str | None, system_etag: str | None
    ) -> None:
        if block_etag is not None and not etags_equal(block_etag, self.block_etag(block_id)):
            raise ETagMismatch()
        if system_etag is not None and not etags_equal(system_etag, self.system_etag(system_id)):
            raise ETagMismatch()

    def _touch(self, *keys: str) -> None:
        for key in keys:
            self._versions[key] = self._versions.get(key, 0) + 1

    def _etag(self, key: str) -> str:
        return f'"{self.epoch}-{self._versions.get(key, 0)}"'


def _fixed_hosts(
    inventory: InventorySpec, composition: CompositionMode, host_ids: Iterable[str]
) -> frozenset[str]:
    """Hosts whose systems are not expandable: known hosts, and only where hosts are systems."""
    fixed = frozenset(host_ids)
    unknown = sorted(h for h in fixed if inventory.host(h) is None)
    if unknown:
        raise InventoryError(f"not-expandable hosts not in the inventory: {', '.join(unknown)}")
    if fixed and composition != "expandable":
        raise InventoryError(
            "not-expandable hosts need expandable composition: "
            f"under {composition} composition no host is a standing system"
        )
    return fixed


def etags_equal(given: str, current: str) -> bool:
    """Strong comparison (RFC 9110 8.8.3.2), as writes need: a weak ETag never matches.

    A weak ETag only says two representations are equivalent, not identical,
    so it cannot guard a write against a lost update.
    """
    given = given.strip()
    return not given.startswith("W/") and given == current


def if_match_allows(header: str, current: str) -> bool:
    """Whether an ``If-Match`` header (``*`` or a list of ETags) matches ``current``."""
    return any(c == "*" or etags_equal(c, current) for c in _etag_list(header))


def if_none_match_matches(header: str, current: str) -> bool:
    """Whether an ``If-None-Match`` header names ``current``: weak comparison, for reads."""
    plain = current.removeprefix("W/")
    return any(c == "*" or c.removeprefix("W/") == plain for c in _etag_list(header))


def _etag_list(header: str) -> list[str]:
    return [part.strip() for part in header.split(",") if part.strip()]


def _tag_json(tag: HostMark | None) -> dict[str, object] | None:
    return None if tag is None else mark_json(tag)


def _parse_document(document: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """Check a saved state document's shape; :class:`StateFileError` if wrong."""
    if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
        raise StateFileError(f"not a format-{STATE_FORMAT} simulator state document")
    hosts, versions = document.get("hosts"), document.get("versions")
    if not isinstance(hosts, dict) or not isinstance(versions, dict) or "epoch" not in document:
        raise StateFileError("state document lacks hosts, versions or epoch")
    if not all(isinstance(v, int) for v in versions.values()):
        raise StateFileError("state document versions must be integers")
    for system_id, entry in hosts.items():
        _check_host_entry(system_id, entry)
    return hosts, versions


def _check_host_entry(system_id: str, entry: Any) -> None:
    attached = entry.get("attached") if isinstance(entry, dict) else None
    if not isinstance(attached, list) or not all(isinstance(b, str) for b in attached):
        raise StateFileError(f"host {system_id}: `attached` must be a list of block ids")
    try:
        parse_mark(entry.get("tag"))
    except SimulatorError as err:
        raise StateFileError(
            f"host {system_id}: `tag` must be null or a mark of either version: {err}"
        ) from err
