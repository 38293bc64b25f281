"""The use cases of a composed machine: compose one, release one.

This is the service layer between the JupyterHub glue (``spawner.py``) and the
adapters (ledger, fabric). It owns the order of operations that keeps the
invariants of ARCHITECTURE.md:

* the claim (quota check + compare-and-set of every device) happens in one
  ledger transaction *before* anything on the fabric changes;
* compose is all-or-nothing: on any failure, cancellation included, what was
  attached is detached, the claim released, and the original error re-raised;
* release only frees a device in the ledger once the fabric confirmed the
  detach; while the fabric cannot be reached the machine stays ``stopping``
  with its devices held, and a background task keeps trying.

The ledger is synchronous (SQLAlchemy); its calls run in worker threads so a
slow database never stalls the hub's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .catalog import Catalog, GpuModel
from .fabric.base import (
    CompositionTag,
    Device,
    DeviceInUse,
    Fabric,
    FabricError,
    FabricRefused,
    FabricUnreachable,
    Inventory,
)
from .ledger import DeviceRecord, DevicesTaken, Ledger, QuotaExceeded, ServerBusy
from .placement import (
    Availability,
    DeviceAsk,
    NoFit,
    Plan,
    Pool,
    availability,
    place,
    pool_for,
)
from .placement import visible_models as _visible_models
from .request import MachineRequest

T = TypeVar("T")
Progress = Callable[[str], None]

# A claim can lose a race for the devices placement picked (someone claimed
# them between our snapshot and our transaction): place again on fresh data.
CLAIM_ATTEMPTS = 3


class ComposeRefused(Exception):
    """Policy said no (quota, nothing fits, server busy): nothing was claimed."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ComposeFailed(Exception):
    """The fabric failed during compose; everything was undone (or is being undone)."""


@dataclass(frozen=True, slots=True)
class ComposedMachine:
    machine_id: str
    host: str  # ComputerSystem Id
    zone: str
    gpus: tuple[Device, ...]
    nic: Device | None
    drives: tuple[Device, ...]

    def to_state(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "host": self.host,
            "zone": self.zone,
            "gpus": [_device_state(d) for d in self.gpus],
            "nic": _device_state(self.nic) if self.nic else None,
            "drives": [_device_state(d) for d in self.drives],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ComposedMachine:
        return cls(
            machine_id=str(state["machine_id"]),
            host=str(state["host"]),
            zone=str(state["zone"]),
            gpus=tuple(_device_from_state(d) for d in state.get("gpus", [])),
            nic=_device_from_state(state["nic"]) if state.get("nic") else None,
            drives=tuple(_device_from_state(d) for d in state.get("drives", [])),
        )


class Composer:
    """Composes and releases machines for every spawner of one hub."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        fabric: Fabric,
        catalog: Catalog,
        hub_id: str,
        snapshot_ttl: float = 3.0,
        release_retry_max: float = 60.0,
        log: logging.Logger | None = None,
    ) -> None:
        self.ledger = ledger
        self.fabric = fabric
        self.catalog = catalog
        self.hub_id = hub_id
        self.snapshot_ttl = snapshot_ttl
        self.release_retry_max = release_retry_max
        self.log = log or logging.getLogger(__name__)
        self._inventory = _Snapshot[Inventory](snapshot_ttl)
        self._synced_blocks: frozenset[tuple[str, str]] = frozenset()
        self._releases: dict[str, asyncio.Task[None]] = {}
        # Devices this process placed a claim on, so concurrent spawns do not all
        # pick the same best-fit devices and lose the ledger's compare-and-set.
        # block → number of the claim commit that took it (None: still in flight).
        # Only an optimisation: the ledger's compare-and-set is what keeps claims
        # apart, across processes too.
        self._reserved: dict[str, int | None] = {}
        self._claims_committed = 0
        # The ledger's holders as placement last read them, with _claims_committed
        # when that read began.
        self._holders = _Snapshot[tuple[Mapping[str, str], int]](snapshot_ttl)
        # An SQLite ledger is a local file and each call a short transaction
        # (well under a millisecond): it runs on the event loop, as JupyterHub's
        # own database does. In a worker thread it cost more than the call
        # itself: handing over and back, and the GIL that the thread and the
        # event loop then pass back and forth (every hub commit waited for it).
        # A database server's round trips go to a worker thread.
        self._ledger_inline = ledger.is_local_file

    async def _ledger_call(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a ledger method (see _ledger_inline); it lands or fails as a whole."""
        if self._ledger_inline:
            return func(*args, **kwargs)
        return await _whole_in_thread(func, *args, **kwargs)

    async def record(self, machine_id: str, to: str, message: str) -> None:
        """Record a non-terminal lifecycle step the spawner took (``running``)."""
        await self._ledger_call(self.ledger.transition, machine_id, to, message)

    # -- reading ---------------------------------------------------------

    async def inventory(self, *, fresh: bool = False) -> Inventory:
        """The fabric's inventory, cached for ``snapshot_ttl`` seconds (see _Snapshot)."""
        return await self._inventory.get(self._read_inventory, fresh=fresh)

    async def _read_inventory(self) -> Inventory:
        inventory = await self.fabric.inventory()
        await self._sync_ledger(inventory)
        return inventory

    def owners(self, inventory: Inventory) -> dict[str, str]:
        """Co-located devices and the group that owns each."""
        owners = {}
        for device in inventory.devices:
            group = self.catalog.owner_of_chassis(device.chassis)
            if group:
                owners[device.block_id] = group
        return owners

    async def offer(self, user: str, groups: frozenset[str]) -> Offer:
        """What the spawn form shows one user: models they may use, what is free, quota."""
        inventory = await self.inventory()
        owners = self.owners(inventory)
        held = await self._ledger_call(self.ledger.holders)
        pool = pool_for(inventory, held=held, owners=owners, groups=groups)
        free = {
            m.id: availability(pool, m.fabric_models, self.catalog.max_gpus_per_machine)
            for m in self._visible_catalog_models(inventory, owners, groups)
        }
        in_use = sum(use.gpus for use in await self._ledger_call(self.ledger.gpu_use, user))
        return Offer(free=free, gpus_in_use=in_use)

    async def visible_models(self, groups: frozenset[str]) -> frozenset[str]:
        """Catalog ids of the GPU models these groups may ask for, free or not.

        What request validation needs, without the ledger reads of :meth:`offer`:
        it runs on every spawn.
        """
        inventory = await self.inventory()
        models = self._visible_catalog_models(inventory, self.owners(inventory), groups)
        return frozenset(m.id for m in models)

    def _visible_catalog_models(
        self, inventory: Inventory, owners: Mapping[str, str], groups: frozenset[str]
    ) -> list[GpuModel]:
        fabric_models = _visible_models(inventory, owners, groups)
        return [m for m in self.catalog.gpu_models if m.fabric_models & fabric_models]

    # -- composing -------------------------------------------------------

    async def compose(
        self,
        *,
        user: str,
        groups: frozenset[str],
        server: str,
        request: MachineRequest,
        gpu_limit: int | None,
        progress: Progress,
        then: tuple[str, str] | None = None,
    ) -> ComposedMachine:
        """Claim, then attach; all-or-nothing. Raises ComposeRefused or ComposeFailed.

        ``then``: a next lifecycle step (state, message) the caller takes at once,
        recorded in the same ledger transaction as ``composed``.
        """
        ask = self._ask(request)
        try:
            machine_id = await self._ledger_call(
                self.ledger.request_machine, user, server, request.to_options()
            )
        except ServerBusy as e:
            raise ComposeRefused(e.user_message, status=409) from e
        except asyncio.CancelledError:
            await asyncio.shield(self._end_cancelled_request(user, server))
            raise
        try:
            plan = await self._claim(machine_id, user, groups, ask, gpu_limit, progress)
        except ComposeRefused:
            raise
        except BaseException as e:
            # The fabric failed (or the start was cancelled) before anything was
            # attached: the machine must still end, or the server stays busy forever.
            await asyncio.shield(self._undo(machine_id, _why_compose_failed(e)))
            if isinstance(e, FabricError):
                raise ComposeFailed(_why_compose_failed(e)) from e
            raise
        tag = CompositionTag(hub=self.hub_id, machine=machine_id, owner=f"{user}/{server}")
        await self._attach(machine_id, plan, tag, progress)
        steps = [("composed", "all devices attached"), *([then] if then else [])]
        await self._ledger_call(self.ledger.advance, machine_id, *steps)
        self.log.info(
            "Composed machine %s for %s/%s on %s in %s: %s",
            machine_id,
            user,
            server,
            plan.host.system_id,
            plan.zone,
            ", ".join(plan.block_ids),
        )
        return ComposedMachine(
            machine_id=machine_id,
            host=plan.host.system_id,
            zone=plan.zone,
            gpus=plan.gpus,
            nic=plan.nic,
            drives=plan.drives,
        )

    def _ask(self, request: MachineRequest) -> DeviceAsk:
        model = self.catalog.gpu_model(request.gpu_model)
        network = self.catalog.network(request.network)
        assert model is not None, "request was validated"
        assert network is not None, "request was validated"
        return DeviceAsk(
            gpu_models=model.fabric_models,
            gpu_count=request.gpu_count,
            label=model.label,
            nic_speed_gbps=network.speed_gbps,
            scratch_gb=request.scratch_gb,
        )

    async def _claim(
        self,
        machine_id: str,
        user: str,
        groups: frozenset[str],
        ask: DeviceAsk,
        gpu_limit: int | None,
        progress: Progress,
    ) -> Plan:
        fresh = False
        for attempt in range(CLAIM_ATTEMPTS):
            inventory = await self.inventory(fresh=fresh)
            held, read_after = await self._held(fresh=fresh)
            # From here to the reservation nothing awaits: no other spawn interleaves.
            plan = place(self._pool(inventory, held, read_after, groups), ask)
            if isinstance(plan, NoFit) and not fresh and attempt + 1 < CLAIM_ATTEMPTS:
                # Our snapshot may predate another hub's release: look again
                # before telling the user nothing fits.
                fresh = True
                continue
            if isinstance(plan, NoFit):
                await self._fail_unclaimed(machine_id, plan.reason)
                raise ComposeRefused(plan.reason, status=409)
            blocks = (plan.host.block_id, *plan.block_ids)
            self._reserved.update(dict.fromkeys(blocks))
            progress(f"claiming {ask.gpu_count} × {ask.label} in {plan.zone}")
            try:
                await self._ledger_call(
                    self.ledger.claim,
                    machine_id,
                    host_id=plan.host.system_id,
                    zone=plan.zone,
                    block_ids=blocks,
                    gpu_limit=gpu_limit,
                    groups=groups,
                )
            except QuotaExceeded as e:
                self._unreserve(blocks)
                await self._fail_unclaimed(machine_id, e.user_message)
                raise ComposeRefused(e.user_message, status=403) from e
            except DevicesTaken:
                self._unreserve(blocks)
                self.log.info("Claim for %s lost a race (attempt %d)", machine_id, attempt + 1)
                fresh = True
                continue
            except BaseException:
                self._unreserve(blocks)
                raise
            self._claims_committed += 1
            self._reserved.update(dict.fromkeys(blocks, self._claims_committed))
            return plan
        reason = "The devices you chose were taken by other users while we claimed them. Try again."
        await self._fail_unclaimed(machine_id, reason)
        raise ComposeRefused(reason, status=409)

    async def _held(self, *, fresh: bool) -> tuple[Mapping[str, str], int]:
        """The ledger's holders for placement, and how many of our claims it includes.

        Read once per inventory snapshot, not per claim: in a rush every spawn
        would otherwise read the whole holder table. A stale read cannot cause a
        double holder: our own claims since it are reserved in-process, and the
        claim's compare-and-set refuses devices another hub took meanwhile (then
        we read again). Our releases drop it, so freed devices show at once.
        """
        return await self._holders.get(self._read_holders, fresh=fresh)

    async def _read_holders(self) -> tuple[Mapping[str, str], int]:
        read_after = self._claims_committed
        return await self._ledger_call(self.ledger.holders), read_after

    def _pool(
        self, inventory: Inventory, held: Mapping[str, str], read_after: int, groups: frozenset[str]
    ) -> Pool:
        """What placement may take: free in the ledger read, and not reserved by us.

        A claim that committed before the ledger read began shows in ``held``;
        its reservation is no longer needed.
        """
        for block, committed in list(self._reserved.items()):
            if committed is not None and committed <= read_after:
                del self._reserved[block]
        taken = held.keys() | self._reserved.keys()
        return pool_for(inventory, held=taken, owners=self.owners(inventory), groups=groups)

    def _unreserve(self, blocks: Sequence[str]) -> None:
        for block in blocks:
            self._reserved.pop(block, None)

    async def _end_cancelled_request(self, user: str, server: str) -> None:
        live = await self._ledger_call(self.ledger.live_machine, user, server)
        if live is not None and live.state == "requested":
            await self._fail_unclaimed(live.id, _why_compose_failed(asyncio.CancelledError()))

    async def _fail_unclaimed(self, machine_id: str, reason: str) -> None:
        await self._ledger_call(
            self.ledger.transition, machine_id, "failed", reason, failure=reason
        )

    async def _attach(
        self, machine_id: str, plan: Plan, tag: CompositionTag, progress: Progress
    ) -> None:
        host = plan.host.system_id
        try:
            await self.fabric.tag_host(host, tag)
            for i, gpu in enumerate(plan.gpus, 1):
                progress(f"attaching GPU {i}/{len(plan.gpus)} ({gpu.model}) to {host}")
                await self.fabric.attach(host, gpu.block_id)
            if plan.nic:
                progress(f"attaching {plan.nic.speed_gbps} Gb/s network card to {host}")
                await self.fabric.attach(host, plan.nic.block_id)
            for i, drive in enumerate(plan.drives, 1):
                progress(f"attaching scratch NVMe {i}/{len(plan.drives)} to {host}")
                await self.fabric.attach(host, drive.block_id)
        except BaseException as e:
            self.log.warning("Compose of %s on %s failed (%r); undoing", machine_id, host, e)
            await asyncio.shield(self._undo(machine_id, _why_compose_failed(e)))
            if isinstance(e, FabricError):
                raise ComposeFailed(_why_compose_failed(e)) from e
            raise

    async def _undo(self, machine_id: str, reason: str) -> None:
        try:
            await self.release(machine_id, reason=reason, failed=True)
        except FabricError:
            self.log.exception("Undo of %s failed; retrying in the background", machine_id)
            self.release_soon(machine_id, reason=reason, failed=True)

    # -- releasing -------------------------------------------------------

    async def release(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Detach everything the machine holds, then free it in the ledger.

        Idempotent. Raises FabricError if the fabric did not confirm; the
        devices then stay held in the ledger (unknown is not dead).
        """
        machine = await self._ledger_call(self.ledger.machine, machine_id)
        if machine is None or machine.state in ("released", "failed"):
            return
        if machine.state == "requested":
            await self._fail_unclaimed(machine_id, reason)
            return
        if machine.state != "stopping":
            await self._ledger_call(self.ledger.transition, machine_id, "stopping", reason)
        if machine.host_id:
            await self._detach_all(machine_id, machine.host_id, machine.block_ids)
        end = "failed" if failed else "released"
        await self._ledger_call(
            self.ledger.release,
            machine_id,
            to=end,
            message=reason,
            failure=reason if failed else None,
        )
        self._inventory.forget()  # the next form should see these devices free
        self._holders.forget()  # and the next placement
        self.log.info("Released machine %s (%s): %s", machine_id, end, reason)

    async def _detach_all(self, machine_id: str, host: str, held: Sequence[str]) -> None:
        blocks = set(held)  # what the machine held when release began: it takes no more
        tag, linked = await self.fabric.host_mark(host)
        if tag is None or tag.machine != machine_id or tag.hub != self.hub_id:
            # We mark a host before attaching anything, so a host without our mark
            # holds nothing we attached; what is on it belongs to someone else.
            self.log.info("Host %s has no mark of %s: nothing of ours on it", host, machine_id)
            return
        # A host's own block never changes: any snapshot, however old, knows it.
        inventory = self._inventory.value or await self.inventory()
        known = inventory.host(host)
        own_block = known.block_id if known else ""
        for block in sorted((blocks & set(linked)) - {own_block}):
            await self.fabric.detach(host, block)
        await self.fabric.tag_host(host, None)

    def release_soon(self, machine_id: str, *, reason: str, failed: bool = False) -> None:
        """Keep trying to release in the background until the fabric confirms."""
        if machine_id in self._releases and not self._releases[machine_id].done():
            return
        task = asyncio.ensure_future(self._release_until_done(machine_id, reason, failed))
        self._releases[machine_id] = task

    async def _release_until_done(self, machine_id: str, reason: str, failed: bool) -> None:
        delay = 0.5
        while True:
            try:
                await self.release(machine_id, reason=reason, failed=failed)
                return
            except FabricError as e:
                self.log.warning(
                    "Release of %s not confirmed (%s); retry in %.1fs", machine_id, e, delay
                )
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.release_retry_max)

    async def close(self) -> None:
        for task in self._releases.values():
            task.cancel()
        await self.fabric.close()
        await self._ledger_call(self.ledger.close)

    # -- helpers ---------------------------------------------------------

    async def _sync_ledger(self, inventory: Inventory) -> None:
        """Make sure the ledger has a row for every block, so claims can compare-and-set."""
        owners = self.owners(inventory)
        records = [DeviceRecord.from_device(d, owners.get(d.block_id)) for d in inventory.devices]
        records += [DeviceRecord.from_host(h) for h in inventory.hosts]
        fingerprint = frozenset((r.block_id, repr(r)) for r in records)
        if fingerprint != self._synced_blocks:
            await self._ledger_call(self.ledger.sync_devices, records)
            self._synced_blocks = fingerprint


class _Snapshot(Generic[T]):
    """A value read at most once per ``ttl`` seconds; one read at a time serves all waiting.

    ``fresh``: a read that began after the call did; one that began meanwhile,
    for another caller waiting on the lock, will do.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.value: T | None = None
        self._began = -math.inf  # when the read behind ``value`` began
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """The next get() reads again (``value`` stays for who can use any snapshot)."""
        self._began = -math.inf

    async def get(self, read: Callable[[], Awaitable[T]], *, fresh: bool = False) -> T:
        asked = time.monotonic()
        async with self._lock:
            stale = asked - self._began > self.ttl or (fresh and self._began < asked)
            if stale or self.value is None:
                began = time.monotonic()
                self.value, self._began = await read(), began
            return self.value


@dataclass(frozen=True, slots=True)
class Offer:
    free: dict[str, Availability]  # catalog GPU model id → availability, visible models only
    gpus_in_use: int


def _why_compose_failed(error: BaseException) -> str:
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


def _device_state(device: Device) -> dict[str, Any]:
    return {
        "block_id": device.block_id,
        "kind": device.kind,
        "model": device.model,
        "zones": sorted(device.zones),
        "chassis": device.chassis,
        "memory_gib": device.memory_gib,
        "speed_gbps": device.speed_gbps,
        "capacity_gb": device.capacity_gb,
    }


def _device_from_state(state: Mapping[str, Any]) -> Device:
    return Device(
        block_id=state["block_id"],
        kind=state["kind"],
        model=state["model"],
        zones=frozenset(state.get("zones", ())),
        chassis=state.get("chassis", ""),
        state="attached",
        memory_gib=state.get("memory_gib"),
        speed_gbps=state.get("speed_gbps"),
        capacity_gb=state.get("capacity_gb"),
    )


async def _whole_in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func`` in a worker thread; it lands (or fails) as a whole even if the caller is cancelled.

    Cancelling a coroutine does not stop its worker thread. Without waiting for
    the thread, the caller's undo could run before a write commits, miss it,
    and leave devices claimed by a machine nobody will ever release.
    """
    future = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise
