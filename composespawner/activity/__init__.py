"""Where GPU activity comes from: the sources the reclaimer reads, behind one protocol.

A source answers for one compute host at a time with an
:class:`~composespawner.domain.activity.ActivityReading`, or raises
:class:`ActivityUnreadable`. It never answers with a reading it is not sure of: a
source that cannot tell raises, and a GPU it could not read is left out of the
reading (unknown), so nothing downstream ever mistakes "could not read" for "idle".

Sources: :class:`~composespawner.activity.dcgm.DcgmExporter` (each host's DCGM
exporter, over HTTP) and :class:`~composespawner.activity.nvml.NvmlSource` (NVML on
this host).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from composespawner.domain.activity import ActivityReading

__all__ = ["ActivityReading", "ActivitySource", "ActivityUnreadable"]


class ActivityUnreadable(Exception):
    """A source could not say what a host's GPUs are doing: down, slow, or not making sense.

    ``host_id`` and ``where`` (the endpoint, or "NVML") say which; ``why`` says what
    went wrong in words an operator can act on.
    """

    def __init__(self, host_id: str, where: str, why: str) -> None:
        super().__init__(f"GPU activity of {host_id} unreadable from {where}: {why}")
        self.host_id = host_id
        self.where = where
        self.why = why


@runtime_checkable
class ActivitySource(Protocol):
    """Reads what the GPUs of one compute host are doing now."""

    async def read(self, host_id: str) -> ActivityReading:
        """This host's GPUs now; :class:`ActivityUnreadable` when that cannot be known."""
        ...
