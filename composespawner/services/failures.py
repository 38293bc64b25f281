"""How a compose ends when it does not succeed, and what the user reads then.

Two outcomes: :class:`ComposeRefused`, policy said no and nothing was claimed;
:class:`ComposeFailed`, the fabric failed and everything was undone (or is
being undone). The messages say what happened and what to do; the fabric's
and the ledger's own words go to the log.
"""

from __future__ import annotations

import asyncio
import re

from composespawner.fabric.base import DeviceInUse, FabricError, FabricRefused, FabricUnreachable
from composespawner.ledger import LedgerError, NotOwner, QuotaExceeded, ServerBusy, server_label


class ComposeRefused(Exception):
    """Policy said no (quota, nothing fits, server busy): nothing was claimed."""

    def __init__(self, message: str, *, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # for metrics: no-fit, contention, or the ledger's refusal


class ComposeFailed(Exception):
    """The fabric failed during compose; everything was undone (or is being undone)."""


def why_busy(error: ServerBusy) -> str:
    if error.state == "stopping":
        return (
            f"Your {server_label(error.server)} is still giving the devices of its last machine"
            " back to the pool: the GPU fabric is slow to confirm. Try again in a minute."
        )
    return error.user_message


def why_claim_failed(error: BaseException) -> str:
    """What the user reads when the fabric failed before anything was attached."""
    if isinstance(error, FabricUnreachable):
        return (
            "The GPU fabric is not answering right now, so nothing was claimed."
            " Try again in a few minutes, and tell the admins if it persists."
        )
    return why_compose_failed(error)


def refusal(error: LedgerError) -> ComposeRefused:
    """A ledger refusal as the user reads it: its own message, and the status that fits."""
    status = 403 if isinstance(error, QuotaExceeded | NotOwner) else 409
    # For metrics: QuotaExceeded counts as "quota-exceeded".
    reason = re.sub(r"(?<!^)(?=[A-Z])", "-", type(error).__name__).lower()
    return ComposeRefused(error.user_message, status=status, reason=reason)


def why_compose_failed(error: BaseException) -> str:
    """What the user reads; the fabric's own words go to the log (see _attach)."""
    if isinstance(error, FabricUnreachable):
        return (
            "The GPU fabric stopped answering while your machine was being put together."
            " Your devices are given back as soon as it answers again; try again in a few"
            " minutes, and tell the admins if it persists."
        )
    if isinstance(error, DeviceInUse):
        return "A device was taken by another system while we attached it. Please try again."
    if isinstance(error, FabricRefused):
        status = f" (HTTP {error.status})" if error.status else ""
        return f"The GPU fabric refused to compose your machine{status}. Please try again later."
    if isinstance(error, FabricError):
        return "The GPU fabric failed while attaching a device. Please try again."
    if isinstance(error, asyncio.CancelledError):
        return "The start was cancelled."
    return "Starting the machine failed."
