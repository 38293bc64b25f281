"""Growing and shrinking a running machine in place, where the fabric hot-attaches.

The order is a compose's (ARCHITECTURE.md): the ledger claims first, in one
transaction that checks quota, cohort reservations, co-located ownership and
that every device is free; only then does the fabric attach. All or nothing: if
any attach fails, what was attached is detached and the claim given back, and
the error re-raised. Shrinking detaches on the fabric first and frees in the
ledger only once the fabric confirmed (unknown is not dead).

A grow adds GPUs of the model the server started with: one machine's GPUs stay
one model, so code written for it keeps working. A kernel sees the new GPUs
only once it starts again (CUDA counts devices when it initialises), and only
with the machine's new ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from composespawner.domain.machine import ComposedMachine
from composespawner.domain.placement import DeviceAsk, NoFit, place_more
from composespawner.fabric.base import FabricError, NotExpandable
from composespawner.ledger import (
    DevicesTaken,
    LedgerError,
    Machine,
    NotRunning,
    QuotaExceeded,
    server_label,
)
from composespawner.ledger.limits import Use, check_ask, check_use
from composespawner.services.failures import ComposeFailed, ComposeRefused, refusal

if TYPE_CHECKING:
    from composespawner.services.composer import Composer

# Another claim may take the GPUs placement picked: pick again on fresh data.
GROW_ATTEMPTS = 3
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


class Resizer:
    """Grow and shrink the running machines of one composer's fabric and ledger."""

    def __init__(self, composer: Composer) -> None:
        self.composer = composer

    async def running_machine(self, user: str, server: str) -> Machine:
        """The user's server's machine; ComposeRefused unless it runs."""
        machine = await self.composer.runner.run(self.composer.ledger.live_machine, user, server)
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
        composer = self.composer
        machine = await self.running_machine(user, server)
        model = composer.catalog.gpu_model(str(machine.request.get("gpu_model")))
        if model is None:
            raise ComposeRefused(
                "Your server's GPU model is no longer offered here, so no more can be added.",
                status=409,
                reason="no-fit",
            )
        held = await self._gpus_of(machine)
        allowed = await composer.admission_for(user, groups)
        # Quota first, so that a grow past it hears which limit, not that nothing fits;
        # the ledger's transaction checks again, GPU-hours included, as it claims.
        others = await composer.runner.run(composer.ledger.gpu_use, user)
        try:
            check_ask(user, allowed.quota, model.id, len(held) + count)
            use = Use([u for u in others if u.server != server])
            check_use(user, allowed.quota, len(held) + count, use)
        except QuotaExceeded as e:
            raise refusal(e) from e
        terms = allowed.terms(groups, model.id, composer.catalog)
        ask = DeviceAsk(gpu_models=model.fabric_models, gpu_count=count, label=model.label)
        for _ in range(GROW_ATTEMPTS):
            pool = await composer.pool.claimable(
                user, groups, fresh=True, holdback=terms.holdback, registrations=terms.registrations
            )
            picked = place_more(pool, machine.zone or "", ask)
            if isinstance(picked, NoFit):
                raise ComposeRefused(picked.reason, status=409, reason="no-fit")
            blocks = [d.block_id for d in picked]
            try:
                await composer.runner.run(
                    composer.ledger.grow,
                    machine.id,
                    block_ids=blocks,
                    quota=terms.quota,
                    groups=groups,
                    keep_free=terms.keep_free,
                )
            except DevicesTaken:
                continue  # another claim took one since the pool was read
            except LedgerError as e:
                raise refusal(e) from e
            await self._attach(machine, blocks)
            composer.pool.forget()
            composer.log.info("Grew machine %s of %s by %s", machine.id, user, ", ".join(blocks))
            return await self.running_machine(user, server)
        raise ComposeRefused(
            "Other users took the free GPUs while we claimed them. Try again.",
            status=409,
            reason="contention",
        )

    async def shrink(self, user: str, server: str, gpu_ids: Sequence[str]) -> Machine:
        """Give back ``gpu_ids`` of the server's running machine; the machine as it is now."""
        machine = await self.running_machine(user, server)
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
                await self.composer.fabric.detach(host, block)
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
            await self.composer.runner.run(
                self.composer.ledger.give_back, machine.id, detached, "gave back"
            )
        self.composer.pool.forget()
        self.composer.log.info("Shrank machine %s of %s by %s", machine.id, user, gpu_ids)
        return await self.running_machine(user, server)

    async def _attach(self, machine: Machine, blocks: Sequence[str]) -> None:
        """Attach every block, or none: on any failure detach and give the claim back."""
        host = machine.host_id or ""
        attached: list[str] = []
        try:
            for block in blocks:
                await self.composer.fabric.attach(host, block)
                attached.append(block)
            # A stop that began meanwhile gave back what the ledger held then, perhaps
            # before these were attached: it finds them attached no more, nor do we.
            now = await self.composer.runner.run(self.composer.ledger.machine, machine.id)
            if now is None or now.state != "running":
                raise refusal(
                    NotRunning(machine.id, machine.server_name, now.state if now else "ended")
                )
        except BaseException as e:
            await asyncio.shield(self._undo(machine, host, attached, blocks))
            if isinstance(e, NotExpandable):
                raise ComposeFailed(NO_HOT_ATTACH) from e
            if isinstance(e, FabricError):
                raise ComposeFailed(FABRIC_FAILED) from e
            raise

    async def _undo(
        self, machine: Machine, host: str, attached: Sequence[str], blocks: Sequence[str]
    ) -> None:
        log = self.composer.log
        log.warning("Grow of %s failed; detaching %s", machine.id, attached or "nothing")
        try:
            for block in attached:
                await self.composer.fabric.detach(host, block)
        except FabricError:
            # Those stay held in the ledger: the next stop of this server detaches them.
            log.exception("Could not detach %s from %s; they stay held", attached, host)
            blocks = [b for b in blocks if b not in attached]
        await self.composer.runner.run(
            self.composer.ledger.give_back, machine.id, list(blocks), "not attached", used=False
        )

    async def composed(self, machine: Machine) -> ComposedMachine:
        """The machine as its notebook's environment describes it (see machine_env)."""
        inventory = await self.composer.pool.known_inventory()
        devices = [d for b in machine.block_ids if (d := inventory.device(b)) is not None]
        return ComposedMachine(
            machine_id=machine.id,
            host=machine.host_id or "",
            zone=machine.zone or "",
            gpus=tuple(d for d in devices if d.kind == "gpu"),
            nic=next((d for d in devices if d.kind == "nic"), None),
            drives=tuple(d for d in devices if d.kind == "nvme"),
        )

    async def _gpus_of(self, machine: Machine) -> list[str]:
        """The machine's GPUs (a device's kind never changes: any inventory read tells it)."""
        inventory = await self.composer.pool.known_inventory()
        kinds = {b: d.kind for b in machine.block_ids if (d := inventory.device(b)) is not None}
        return [b for b in machine.block_ids if kinds.get(b) == "gpu"]
