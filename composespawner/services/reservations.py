"""Devices this process is claiming, so that its concurrent spawns pick different ones.

Only an optimisation: the ledger's compare-and-set is what keeps claims apart,
across processes too. Without it, every spawn of a rush would place on the
same snapshot, pick the same best-fit devices, and all but one would lose the
compare-and-set and place again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from composespawner.domain.rooms import HostUse, Room
from composespawner.domain.shares import SplitGpu


@dataclass(frozen=True, slots=True)
class HeldShare:
    """A share of a GPU a claim of this process takes: counted in its slots as room is."""

    block_id: str
    host_id: str
    size: int


@dataclass(frozen=True, slots=True)
class HeldRoom:
    """Room a claim of this process takes on a shared host: held back as blocks are."""

    machine_id: str
    host_id: str
    need: Room


class Reservations:
    """Blocks held back from placement: claims in flight, and claims committed lately.

    A committed claim shows in the ledger's holders once a read of them begins
    after the commit; until then its reservation keeps placement off it.
    """

    def __init__(self) -> None:
        # block → number of the claim commit that took it (None: still in flight).
        self._blocks: dict[str, int | None] = {}
        # machine id → the room its claim takes, and that commit's number as above.
        self._rooms: dict[str, tuple[HeldRoom, int | None]] = {}
        # A share claim's slot, in a list per claim: many claims join one GPU at once.
        self._shares: list[tuple[HeldShare, int | None]] = []
        self.commits = 0  # claims committed by this process so far

    def hold(
        self, blocks: Iterable[str], room: HeldRoom | None = None, share: HeldShare | None = None
    ) -> None:
        """A claim of ``blocks`` (and ``room``, and a ``share`` of a GPU) is about to be tried."""
        self._blocks.update(dict.fromkeys(blocks))
        if room is not None:
            self._rooms[room.machine_id] = (room, None)
        if share is not None:
            self._shares.append((share, None))

    def commit(
        self, blocks: Iterable[str], room: HeldRoom | None = None, share: HeldShare | None = None
    ) -> None:
        """The claim of ``blocks`` committed: held until a later read of the ledger shows it."""
        self.commits += 1
        self._blocks.update(dict.fromkeys(blocks, self.commits))
        if room is not None:
            self._rooms[room.machine_id] = (room, self.commits)
        if share is not None:
            self._shares.remove((share, None))
            self._shares.append((share, self.commits))

    def drop(
        self, blocks: Iterable[str], room: HeldRoom | None = None, share: HeldShare | None = None
    ) -> None:
        """The claim of ``blocks`` was not made."""
        for block in blocks:
            self._blocks.pop(block, None)
        if room is not None:
            self._rooms.pop(room.machine_id, None)
        if share is not None:
            self._shares.remove((share, None))

    def splits(self, split: Mapping[str, SplitGpu], read_after: int) -> dict[str, SplitGpu]:
        """``split`` (a ledger read of the GPUs held in shares, begun after commit
        ``read_after``) with the shares this process's claims take that it does not show."""
        self._shares = [(s, c) for s, c in self._shares if c is None or c > read_after]
        found = dict(split)
        for share, _ in self._shares:
            known = found.get(share.block_id)
            if known is None:
                found[share.block_id] = SplitGpu(share.host_id, share.size, 1)
            elif known.host_id == share.host_id and known.size == share.size:
                held = min(known.holders + 1, known.size)
                found[share.block_id] = SplitGpu(known.host_id, known.size, held, known.closing)
        return found

    def rooms(self, use: Mapping[str, HostUse], read_after: int) -> dict[str, HostUse]:
        """``use`` (a ledger read of the hosts' room held, begun after commit ``read_after``)
        with the room this process's claims take that the read does not show yet."""
        for machine_id, (_, committed) in list(self._rooms.items()):
            if committed is not None and committed <= read_after:
                del self._rooms[machine_id]
        held = dict(use)
        for room, _ in self._rooms.values():
            before = held.get(room.host_id, HostUse(0, 0, 0, 0))
            held[room.host_id] = HostUse(
                before.cores + room.need.cores,
                before.memory_gib + room.need.memory_gib,
                before.slots + room.need.slots,
                before.machines + 1,
            )
        return held

    def taken(self, held: Mapping[str, str], read_after: int) -> set[str]:
        """Blocks placement may not take: ``held`` in a ledger read, or reserved here.

        ``read_after``: :attr:`commits` when that read began; the claims it
        already shows need no reservation any more.
        """
        for block, committed in list(self._blocks.items()):
            if committed is not None and committed <= read_after:
                del self._blocks[block]
        return held.keys() | self._blocks.keys()
