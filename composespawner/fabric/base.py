"""The fabric protocol: what composespawner needs from a composable fabric.

Everything above this module speaks in the domain types of ``hardware.py``; everything below it (the
Redfish client, the tests' in-process fake) turns its own wire format
into them. The error tree is drawn here, at the top, so callers can see at a
glance which failures mean "the fabric said no" (safe to report, nothing
changed) and which mean "we do not know what happened" (never free hardware on
those: unknown is not dead).

    FabricError
    ├── FabricUnreachable        no answer: connect error, dropped connection, timeout
    │   ├── FabricDeadlineExceeded   an operation's overall deadline ran out
    │   └── FabricCertificateError   the service's TLS certificate was not trusted
    ├── FabricRefused            the fabric answered with an error status
    │   ├── DeviceInUse              Composition.ResourceBlockInUse (409)
    │   ├── DeviceNotFound           Composition.ResourceBlockNotFound / 404
    │   ├── IncompatibleZone         Composition.IncompatibleZone
    │   ├── NoResourceMatch          Composition.NoResourceMatch
    │   ├── StaleETag                Base.PreconditionFailed / 412, 428
    │   └── FabricAuthError          401 / 403 after a fresh login
    └── FabricTaskFailed         a 202 task monitor ended in Exception / Killed
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

from composespawner.domain.hardware import CompositionTag, Device, HostMark, Inventory

# The key under ComputerSystem.Oem that marks a host as composed by a hub.
OEM_KEY = "ComposeSpawner"

# How a fabric composes machines (see FABRIC.md): devices added one by one to a
# standing host ("expandable"), or whole systems at once, by POST to the Systems
# collection ("specific") or by CompositionService.Compose ("action").
CompositionMode = Literal["expandable", "specific", "action"]
# Where compose() reports what it is doing: one line per step, for the user.
Progress = Callable[[str], None]


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class FabricError(Exception):
    """Base of every fabric failure. ``str(err)`` is for logs."""


class FabricUnreachable(FabricError):
    """No usable answer: the state of the fabric after this call is unknown."""


class FabricDeadlineExceeded(FabricUnreachable):
    """An operation (with its retries and task polling) ran past its deadline."""


class FabricCertificateError(FabricUnreachable):
    """The service's TLS certificate failed verification: we sent nothing to it.

    Not retried (a certificate does not become trusted by asking again), and
    still "unreachable": what the fabric holds is unknown, not free.
    """


class FabricRefused(FabricError):
    """The fabric answered with an error: nothing was changed by this call."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        message_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message_ids = tuple(message_ids)


class DeviceInUse(FabricRefused):
    """The resource block is already part of a composition."""


class NotExpandable(FabricRefused):
    """The fabric composes whole systems: a host takes no devices one by one (no hot-attach)."""


class DeviceNotFound(FabricRefused):
    """The resource block or system does not exist (any more)."""


class IncompatibleZone(FabricRefused):
    """The blocks are not all in one resource zone."""


class NoResourceMatch(FabricRefused):
    """The fabric has nothing that matches the request."""


class StaleETag(FabricRefused):
    """If-Match did not match: someone changed the resource since we read it."""


class FabricAuthError(FabricRefused):
    """The fabric refused our credentials."""


class FabricTaskFailed(FabricError):
    """An asynchronous fabric task ended in failure."""

    def __init__(self, message: str, *, message_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message_ids = tuple(message_ids)


def host_taken_by(
    current: HostMark | None, *, marked: bool, attached: Sequence[str], hub: str
) -> str | None:
    """Who holds a host ``hub`` wants to compose on, or None when composing there is safe.

    ``marked`` says whether the host carries any mark under our OEM key (a
    malformed one is not ours either); ``attached`` lists its device blocks.
    A host ``hub`` marked is shared by its machines; one composed by anyone
    else, marked or not, is never ours to take.
    """
    if current is not None and current.hub == hub:
        return None  # ours: another machine of this hub joins it
    if current is not None:
        machines = ", ".join(f"{m.machine} of {m.owner}" for m in current.machines)
        return f"hub {current.hub} (machines {machines})"
    if marked:
        return "a composition marked by another client"
    if attached:
        return f"a composition of another client ({len(attached)} devices attached)"
    return None


def attach_steps(host: str, devices: Sequence[Device]) -> list[str]:
    """The progress line of each device attached to ``host``, in order."""
    total = {kind: sum(d.kind == kind for d in devices) for kind in ("gpu", "nvme")}
    seen = {"gpu": 0, "nvme": 0}
    lines = []
    for device in devices:
        if device.kind == "nic":
            lines.append(f"attaching {device.speed_gbps} Gb/s network card to {host}")
            continue
        seen[device.kind] += 1
        count = f"{seen[device.kind]}/{total[device.kind]}"
        if device.kind == "gpu":
            lines.append(f"attaching GPU {count} ({device.model}) to {host}")
        else:
            lines.append(f"attaching scratch NVMe {count} to {host}")
    return lines


async def compose_by_attaching(
    fabric: Fabric, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
) -> str:
    """Expandable composition: put the machine on the host's mark, then attach its devices.

    Not all-or-nothing by itself: on failure the caller undoes with
    :func:`decompose_by_detaching`, which the mark makes safe.
    """
    await fabric.join_host(host, tag)
    for device, line in zip(devices, attach_steps(host, devices), strict=True):
        progress(line)
        await fabric.attach(host, device.block_id)
    return host


async def decompose_by_detaching(
    fabric: Fabric, host: str, blocks: Sequence[str], tag: CompositionTag
) -> bool:
    """Expandable release of one machine: detach its ``blocks`` still on the host, then
    take the machine off the host's mark (the mark goes with the last machine).

    False, touching nothing, when the host's mark does not list ``tag``'s machine:
    a machine joins the mark before anything is attached for it and leaves it
    after its devices are detached, so without it there nothing of it is there,
    and what is there is another machine's or someone else's. Other machines'
    devices on the host are never touched: only ``blocks`` are detached.
    """
    mark, linked = await fabric.host_mark(host)
    if mark is None or not mark.has(tag):
        return False
    # ``blocks`` are device blocks: the host's own block, among ``linked``, is never one.
    for block in sorted(set(blocks) & set(linked)):
        await fabric.detach(host, block)
    await fabric.leave_host(host, tag)
    return True


# ---------------------------------------------------------------------------
# The protocol every fabric driver implements
# ---------------------------------------------------------------------------


@runtime_checkable
class Fabric(Protocol):
    """A composable fabric, reduced to the things a spawner needs.

    Every method is idempotent so callers may retry: attaching a block already
    attached to that host, detaching one that is not attached, and writing a
    tag that is already there all succeed. Attaching a block that is attached
    to *another* host raises :class:`DeviceInUse`.

    A *host* is what a machine is composed on: an expandable system's Id, or,
    where the fabric composes whole systems, the Id of its compute block (no
    system stands for it until it is composed). ``compose``/``decompose`` work
    in every mode; ``attach``/``detach``/``join_host``/``leave_host`` only where
    hosts are expandable, and raise :class:`FabricRefused` elsewhere.
    """

    async def compose(
        self, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
    ) -> str:
        """Compose ``tag``'s machine of ``host`` and ``devices``; the composed system's Id.

        The host may carry other machines of ``tag``'s hub: this one joins them,
        with its own devices. Idempotent: a machine already composed for ``tag``
        there is found, not made twice. A host composed for anyone else (another
        client, another hub) raises :class:`DeviceInUse`.
        Whole-system fabrics compose all or nothing; on an expandable one a
        failure may leave part of it, for :meth:`decompose` to take apart.
        """
        ...

    async def decompose(self, host: str, blocks: Sequence[str], tag: CompositionTag) -> bool:
        """Take apart what ``tag``'s machine holds on ``host`` (device ``blocks``), leaving
        the host's other machines and their devices as they are; the host's own
        composition goes with its last machine.

        False, touching nothing, when nothing of that machine is there (already
        taken apart, or never made): success, for a caller that retries.
        """
        ...

    async def inventory(self) -> Inventory:
        """A fresh snapshot of hosts, devices and zones."""
        ...

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        """One host's mark and the blocks linked to it now (its own block included).

        A cheap read of one system, for releases: the whole inventory is not needed.
        """
        ...

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        """Put ``tag``'s machine on the host's mark, marking the host for its hub if unmarked.

        Conditional, so two clients working from stale snapshots cannot both
        compose on one host: it raises :class:`DeviceInUse` when
        :func:`host_taken_by` names another holder, and the write is made with
        ``If-Match`` on what was read, so a change in between (another machine
        joining or leaving) is read again, never lost. Idempotent.
        """
        ...

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        """Take ``tag``'s machine off the host's mark; the mark goes with the last machine.

        Written with ``If-Match`` as :meth:`join_host` is, so a machine joining
        meanwhile keeps the mark. Idempotent: a machine not on it leaves nothing.
        """
        ...

    async def attach(self, system_id: str, block_id: str) -> None:
        """Attach one device block to a host (ComputerSystem.AddResourceBlock)."""
        ...

    async def detach(self, system_id: str, block_id: str) -> None:
        """Detach one device block from a host (ComputerSystem.RemoveResourceBlock)."""
        ...

    def seconds_since_answer(self) -> float:
        """Seconds since the fabric last answered any request (``inf``: never).

        What tells a slow fabric, or a busy hub, from one that has stopped
        answering: a wait for it may go on while it keeps answering.
        """
        ...

    async def close(self) -> None:
        """Release sessions and connections."""
        ...
