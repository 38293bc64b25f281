"""Why the ledger refused: the error tree, drawn here at the top.

    LedgerError
    ├── UnknownMachine       no machine with that id
    ├── IllegalTransition    the lifecycle does not allow that step (or someone else moved first)
    ├── ServerBusy           the user's server already has a live machine
    ├── NotRunning           a machine that is not running cannot grow or shrink
    ├── QuotaExceeded        the spawn would take the user past a limit of their quota
    ├── NotOwner             a co-located device belongs to a group the user is not in
    ├── ReservedForCohort    the GPUs left are reserved for a cohort's session
    ├── DevicesTaken         a block is held by another machine
    │   └── UnknownDevices   a block is not in the ledger at all
    └── SchemaNotCurrent     the database's schema is not the one this version needs

Every refusal leaves the ledger exactly as it was: the transaction that raised
it is rolled back. Errors a user can act on carry a ``user_message``.
"""

from __future__ import annotations

from collections.abc import Iterable

from composespawner.ledger.records import KeepFree, server_label


class LedgerError(Exception):
    """Base of every ledger refusal. ``str(err)`` is for logs."""

    @property
    def user_message(self) -> str:
        return str(self)


class UnknownMachine(LedgerError):
    def __init__(self, machine_id: str) -> None:
        super().__init__(f"no machine {machine_id!r} in the ledger")
        self.machine_id = machine_id

    @property
    def user_message(self) -> str:
        return "Your machine's record disappeared while it was being set up. Start again."


class IllegalTransition(LedgerError):
    def __init__(self, from_state: str, to_state: str, detail: str = "") -> None:
        message = f"illegal transition {from_state} -> {to_state}"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.from_state = from_state
        self.to_state = to_state

    @property
    def user_message(self) -> str:
        # Someone else moved the machine on: an admin, or the reconciler cleaning up.
        return (
            "Your machine was ended while it was being set up (an admin or the hub's"
            " clean-up stopped it). Start your server again."
        )


class ServerBusy(LedgerError):
    """The (user, server) pair already has a machine that is not released or failed."""

    def __init__(self, user: str, server: str, machine_id: str | None, state: str | None) -> None:
        super().__init__(
            f"{user}/{server or '(default)'} already has live machine {machine_id} ({state})"
        )
        self.user = user
        self.server = server
        self.machine_id = machine_id
        self.state = state

    @property
    def user_message(self) -> str:
        return f"Your {server_label(self.server)} is already running or starting. Stop it first."


class NotRunning(LedgerError):
    """Only a running machine grows or shrinks in place: not one starting or stopping."""

    def __init__(self, machine_id: str, server: str, state: str) -> None:
        super().__init__(f"machine {machine_id} is {state}, not running")
        self.server = server
        self.state = state

    @property
    def user_message(self) -> str:
        return (
            f"Your {server_label(self.server)} is {self.state}: only a running server can"
            " grow or shrink. Try again once it runs."
        )


class SharesDoNotGrow(LedgerError):
    """A machine holding a share of a GPU takes no more devices: a share is of one GPU."""

    def __init__(self, machine_id: str) -> None:
        super().__init__(f"machine {machine_id} holds a share of a GPU: it does not grow")

    @property
    def user_message(self) -> str:
        return (
            "Your server has a share of one GPU, and a share cannot grow. Stop the server"
            " and start it again with whole GPUs (gpu_share 1) and the count you need."
        )


class QuotaExceeded(LedgerError):
    """The spawn would take the user past one limit of their effective quota.

    ``limit`` names the limit (a field of :class:`~composespawner.domain.quotas.Quota`),
    ``source`` the rule it comes from; ``user_message`` says what to do.
    """

    def __init__(self, user: str, limit: str, source: str, user_message: str) -> None:
        self.user = user
        self.limit = limit
        self.source = source
        self._user_message = user_message
        super().__init__(f"{user}: {limit} from {source}: {user_message}")

    @property
    def user_message(self) -> str:
        return self._user_message


def gpus(count: float) -> str:
    """A count of GPUs for people: shares make it fractional ("0.25 GPU", "1.5 GPUs")."""
    shown = f"{count:g}" if count == int(count) else f"{count:.2f}".rstrip("0")
    return f"{shown} GPU" if count <= 1 else f"{shown} GPUs"


class ReservedForCohort(LedgerError):
    """The claim would take GPUs a cohort's session keeps for its members."""

    def __init__(self, user: str, keep: KeepFree, free: int) -> None:
        self.user = user
        self.keep = keep
        self.free = free
        super().__init__(f"{user}: {keep.label} reserved for cohort {keep.cohort} ({free} free)")

    @property
    def user_message(self) -> str:
        keep = self.keep
        return (
            f"The free {keep.label} GPUs are reserved for cohort {keep.cohort}'s session until"
            f" {keep.until}. Choose another model, or start your server after the session."
        )


class NotOwner(LedgerError):
    """Co-located devices are reserved to their owner group."""

    def __init__(self, user: str, block_ids: Iterable[str]) -> None:
        self.user = user
        self.block_ids = tuple(sorted(block_ids))
        super().__init__(f"{user} is not in the owner group of {', '.join(self.block_ids)}")

    @property
    def user_message(self) -> str:
        return "Some of the devices chosen are reserved to another group. Choose others."


class DevicesTaken(LedgerError):
    """Some blocks were not free when the claim ran; nothing was claimed."""

    def __init__(self, block_ids: Iterable[str], reason: str = "not free") -> None:
        self.block_ids = tuple(sorted(block_ids))
        super().__init__(f"{reason}: {', '.join(self.block_ids)}")

    @property
    def user_message(self) -> str:
        return "Someone else took some of those devices a moment ago. Please try again."


class UnknownDevices(DevicesTaken):
    """Blocks the ledger has never seen.

    A subclass of :class:`DevicesTaken` because the caller's remedy is the same:
    refresh the inventory and place again.
    """

    def __init__(self, block_ids: Iterable[str]) -> None:
        super().__init__(block_ids, reason="unknown devices")


class SchemaNotCurrent(LedgerError):
    """The ledger's schema is older (or newer) than this composespawner's."""

    def __init__(self, found: str | None, wanted: str) -> None:
        super().__init__(
            f"the ledger's schema is at revision {found or '(none: an empty database)'}, this"
            f" composespawner needs {wanted}: run `composespawner upgrade-db` with the hub's"
            " config (back the database up first), then start the hub again"
        )
        self.found = found
        self.wanted = wanted


class HostFull(DevicesTaken):
    """The host has no room left for the claim (cores, memory or slots); nothing was claimed.

    A subclass of :class:`DevicesTaken` because the caller's remedy is the same:
    other machines took the room since the pool was read, so place again.
    """

    def __init__(self, host_id: str, what: str) -> None:
        super().__init__((host_id,), reason=f"no room for {what} on")

    @property
    def user_message(self) -> str:
        return "Other servers took the room left on that host a moment ago. Please try again."
