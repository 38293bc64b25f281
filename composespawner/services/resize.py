"""Growing and shrinking a running machine in place, where the fabric hot-attaches.

A grow is a compose's claim-and-attach (:mod:`.claiming`): the ledger claims
first, in one transaction that checks quota, cohort reservations, co-located
ownership and that every device is free; only then does the fabric attach. All
or nothing: if any attach fails, what was attached is detached and the claim
given back, and the error re-raised. Shrinking detaches on the fabric first and
frees in the ledger only once the fabric confirmed (unknown is not dead).

A grow adds GPUs of the model the server started with: one machine's GPUs stay
one model, so code written for it keeps working. A kernel sees the new GPUs
only once it starts again (CUDA counts devices when it initialises), and only
with the machine's new ``CUDA_VISIBLE_DEVICES``.

Callers reach these through the :class:`~composespawner.services.composer.Composer`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import Share
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.placement import DeviceAsk, NoFit, place_more
from composespawner.fabric.base import Fabric, FabricError, NotExpandable
from composespawner.ledger import (
    DevicesTaken,
    LedgerError,
    LedgerRunner,
    Machine,
    NotRunning,
    QuotaExceeded,
    server_label,
)
from composespawner.ledger.limits import Use, check_ask, check_use
from composespawner.services.admission import Admission, ClaimTerms
from composespawner.services.claiming import claim_and_attach
from composespawner.services.failures import ComposeFailed, ComposeRefused, refusal
from composespawner.services.pool import PoolView

MOST_AT_ONCE = 16  # GPUs one grow may add; the quota usually says less


NO_HOT_ATTACH = (
    "This GPU fabric cannot add devices to a running machine. Stop your server and start"
    " it again with more GPUs."
)
NO_HOT_DETACH = (
    "This GPU fabric cannot take devices from a running machine. Stop your server and start"
    " it again with fewer GPUs."
)
FABRIC_FAILED = (
    "The GPU fabric failed while attaching, so nothing was added and your machine is as"
    " it was. Try again in a few minutes."
)

Admit = Callable[[str, frozenset[str]], Awaitable[Admission]]  # user, groups → admission


class Resizer:
    """Grow and shrink the running machines of one composer's fabric and ledger."""

    def __init__(
        self,
        *,
        runner: LedgerRunner,
        fabric: Fabric,
        pool: PoolView,
        catalog: Catalog,
        admit: Admit,
        log: logging.Logger,
    ) -> None:
        """``admit``: the user's admission (quota, cohort reservations) as the composer reads it."""
        self.runner = runner
        self.fabric = fabric
        self.pool = pool
        self.catalog = catalog
        self.admit = admit
        self.log = log

    async def running_machine(self, user: str, server: str) -> Machine:
        """The user's server's machine; ComposeRefused unless it runs."""
        machine = await self.runner.run(self.runner.ledger.live_machine, user, server)
        if machine is None:
            raise ComposeRefused(
                f"You have no {server_label(server)} running: start it first.",
                status=404,
                reason="no-machine",
            )
        if machine.state != "running" or not machine.host_id or not machine.zone:
            raise refusal(NotRunning(machine.id, server, machine.state))
        return machine

    async def grow(self, user: str, groups: frozenset[str], server: str, count: int) -> Machine:
        """Add ``count`` GPUs to the server's running machine; the machine as it is now."""
        machine = await self.running_machine(user, server)
        _refuse_share(machine, "grow")
        if machine.request.get("gpu_model") is None:
            raise ComposeRefused(
                "Your server runs without GPUs (CPU only), so there is no GPU model to add"
                " more of. Stop it and start it again with the GPUs you need.",
                status=409,
                reason="no-fit",
            )
        model = self.catalog.gpu_model(str(machine.request.get("gpu_model")))
        if model is None:
            raise ComposeRefused(
                "Your server's GPU model is no longer offered here, so no more can be added.",
                status=409,
                reason="no-fit",
            )
        held = await self._gpus_of(machine)
        allowed = await self.admit(user, groups)
        # Quota first, so that a grow past it hears which limit, not that nothing fits;
        # the ledger's transaction checks again, GPU-hours included, as it claims.
        others = await self.runner.run(self.runner.ledger.gpu_use, user)
        try:
            check_ask(user, allowed.quota, model.id, len(held) + count)
            check_use(
                user,
                allowed.quota,
                len(held) + count,
                Use([u for u in others if u.server != server]),
            )
        except QuotaExceeded as e:
            raise refusal(e) from e
        more = MoreGpus(
            self.runner,
            self.pool,
            self.fabric,
            self.log,
            machine=machine,
            groups=groups,
            ask=DeviceAsk(gpu_models=model.fabric_models, gpu_count=count, label=model.label),
            terms=allowed.terms(groups, model.id, self.catalog),
            max_devices=self.catalog.max_devices_per_host,
        )
        blocks = await claim_and_attach(more)
        self.pool.forget()
        self.log.info("Grew machine %s of %s by %s", machine.id, user, ", ".join(blocks))
        return await self.running_machine(user, server)

    async def shrink(self, user: str, server: str, gpu_ids: Sequence[str]) -> Machine:
        """Give back ``gpu_ids`` of the server's running machine; the machine as it is now."""
        machine = await self.running_machine(user, server)
        _refuse_share(machine, "shrink")
        held = await self._gpus_of(machine)
        strangers = sorted(set(gpu_ids) - set(held))
        if strangers:
            raise ComposeRefused(
                f"Your {server_label(server)} holds no GPU {strangers[0]!r}; it holds"
                f" {', '.join(held) or 'none'}.",
                status=404,
                reason="not-held",
            )
        host = machine.host_id or ""
        detached: list[str] = []
        try:
            for block in gpu_ids:
                await self.fabric.detach(host, block)
                detached.append(block)
        except NotExpandable as e:
            raise ComposeFailed(NO_HOT_DETACH) from e
        except FabricError as e:
            raise ComposeFailed(
                "The GPU fabric did not confirm the detach, so those GPUs stay yours for"
                " now. Try again in a few minutes."
            ) from e
        finally:
            # Free in the ledger what the fabric confirmed detached, and nothing else.
            await self.runner.run(self.runner.ledger.give_back, machine.id, detached, "gave back")
        self.pool.forget()
        self.log.info("Shrank machine %s of %s by %s", machine.id, user, gpu_ids)
        return await self.running_machine(user, server)

    async def composed(self, machine: Machine) -> ComposedMachine:
        """The machine as its notebook's environment describes it (see machine_env)."""
        inventory = await self.pool.known_inventory()
        devices = [d for b in machine.block_ids if (d := inventory.device(b)) is not None]
        return ComposedMachine(
            machine_id=machine.id,
            host=machine.host_id or "",
            zone=machine.zone or "",
            gpus=tuple(d for d in devices if d.kind == "gpu"),
            nic=next((d for d in devices if d.kind == "nic"), None),
            drives=tuple(d for d in devices if d.kind == "nvme"),
            share=share_of(machine),
            gpu_share=machine.gpu_share,
        )

    async def _gpus_of(self, machine: Machine) -> list[str]:
        """The machine's GPUs (a device's kind never changes: any inventory read tells it)."""
        inventory = await self.pool.known_inventory()
        kinds = {b: d.kind for b in machine.block_ids if (d := inventory.device(b)) is not None}
        return [b for b in machine.block_ids if kinds.get(b) == "gpu"]


@dataclass
class MoreGpus:
    """A grow's claim and attach (see claiming): GPUs of the machine's zone, one at a time.

    The machine runs on as it was whatever happens: a refusal ends nothing, and an
    undo detaches what was attached and gives back what was claimed for it.
    """

    runner: LedgerRunner
    pool: PoolView
    fabric: Fabric
    log: logging.Logger
    machine: Machine
    groups: frozenset[str]
    ask: DeviceAsk
    terms: ClaimTerms
    max_devices: int  # the catalog's slots per host, for a host the fabric says none of
    contention: str = "Other users took the free GPUs while we claimed them. Try again."
    attached: list[str] = field(default_factory=list)

    async def place(self, *, fresh: bool) -> tuple[str, ...] | NoFit:
        # Always on fresh data: grows are rare, and a running machine's zone may be busy.
        del fresh
        pool = await self.pool.claimable(
            self.machine.user_name,
            self.groups,
            fresh=True,
            holdback=self.terms.holdback,
            registrations=self.terms.registrations,
        )
        on_host = next((h for h in pool.hosts if h.host.system_id == self.machine.host_id), None)
        # A machine from before hosts were shared has its host to itself (not in the pool).
        slots = on_host.free.slots if on_host else self.max_devices - len(self.machine.block_ids)
        picked = place_more(pool, self.machine.zone or "", self.ask, slots=slots)
        return picked if isinstance(picked, NoFit) else tuple(d.block_id for d in picked)

    async def take(self, blocks: tuple[str, ...]) -> bool:
        try:
            await self.runner.run(
                self.runner.ledger.grow,
                self.machine.id,
                block_ids=list(blocks),
                quota=self.terms.quota,
                groups=self.groups,
                keep_free=self.terms.keep_free,
            )
        except DevicesTaken:
            return False  # another claim took one since the pool was read
        except LedgerError as e:
            raise refusal(e) from e
        return True

    async def refused(self, why: str, reason: str) -> ComposeRefused:
        return ComposeRefused(why, status=409, reason=reason)

    async def attach(self, blocks: tuple[str, ...]) -> None:
        machine, ledger = self.machine, self.runner.ledger
        for block in blocks:
            await self.fabric.attach(machine.host_id or "", block)
            self.attached.append(block)
        # A stop that began meanwhile gave back what the ledger held then, perhaps
        # before these were attached: it finds them attached no more, nor do we.
        now = await self.runner.run(ledger.machine, machine.id)
        if now is None or now.state != "running":
            raise refusal(
                NotRunning(machine.id, machine.server_name, now.state if now else "ended")
            )

    async def undo(self, blocks: tuple[str, ...] | None, error: BaseException) -> None:
        if blocks is None:
            return  # nothing was claimed
        host, attached = self.machine.host_id or "", self.attached
        self.log.warning("Grow of %s failed; detaching %s", self.machine.id, attached or "nothing")
        given_back = list(blocks)
        try:
            for block in attached:
                await self.fabric.detach(host, block)
        except FabricError:
            # Those stay held in the ledger: the next stop of this server detaches them.
            self.log.exception("Could not detach %s from %s; they stay held", attached, host)
            given_back = [b for b in blocks if b not in attached]
        await self.runner.run(
            self.runner.ledger.give_back, self.machine.id, given_back, "not attached", used=False
        )

    def failed(self, error: BaseException, *, attaching: bool) -> BaseException:
        if attaching and isinstance(error, NotExpandable):
            return ComposeFailed(NO_HOT_ATTACH)
        if attaching and isinstance(error, FabricError):
            return ComposeFailed(FABRIC_FAILED)
        return error


def share_of(machine: Machine) -> Share | None:
    """The machine's share of its host as the ledger keeps it (None: the whole host)."""
    if machine.cores is None or machine.memory_gib is None:
        return None
    return Share(machine.cores, machine.memory_gib)


def _refuse_share(machine: Machine, change: str) -> None:
    """A share is of exactly one GPU, held until the server stops: it neither grows nor
    shrinks (a shrink would detach a GPU its other holders use)."""
    if not machine.shared:
        return
    what = (
        "cannot grow: stop the server and start it again with whole GPUs (gpu_share 1)"
        " and the count you need"
        if change == "grow"
        else "is given back when the server stops: stop the server to give it back"
    )
    raise ComposeRefused(
        f"Your server has a 1/{machine.gpu_share} share of one GPU, shared with other"
        f" servers; a share {what}.",
        status=409,
        reason="share",
    )
