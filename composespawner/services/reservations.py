"""Devices this process is claiming, so that its concurrent spawns pick different ones.

Only an optimisation: the ledger's compare-and-set is what keeps claims apart,
across processes too. Without it, every spawn of a rush would place on the
same snapshot, pick the same best-fit devices, and all but one would lose the
compare-and-set and place again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class Reservations:
    """Blocks held back from placement: claims in flight, and claims committed lately.

    A committed claim shows in the ledger's holders once a read of them begins
    after the commit; until then its reservation keeps placement off it.
    """

    def __init__(self) -> None:
        # block → number of the claim commit that took it (None: still in flight).
        self._blocks: dict[str, int | None] = {}
        self.commits = 0  # claims committed by this process so far

    def hold(self, blocks: Iterable[str]) -> None:
        """A claim of ``blocks`` is about to be tried."""
        self._blocks.update(dict.fromkeys(blocks))

    def commit(self, blocks: Iterable[str]) -> None:
        """The claim of ``blocks`` committed: held until a later read of the ledger shows it."""
        self.commits += 1
        self._blocks.update(dict.fromkeys(blocks, self.commits))

    def drop(self, blocks: Iterable[str]) -> None:
        """The claim of ``blocks`` was not made."""
        for block in blocks:
            self._blocks.pop(block, None)

    def taken(self, held: Mapping[str, str], read_after: int) -> set[str]:
        """Blocks placement may not take: ``held`` in a ledger read, or reserved here.

        ``read_after``: :attr:`commits` when that read began; the claims it
        already shows need no reservation any more.
        """
        for block, committed in list(self._blocks.items()):
            if committed is not None and committed <= read_after:
                del self._blocks[block]
        return held.keys() | self._blocks.keys()
