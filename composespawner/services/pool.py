"""The pool as one hub sees it: the fabric's inventory and the ledger's holders, cached.

Reading only: what is there, who holds it, what one user may be offered and
what a claim may take. Every inventory read also makes sure the ledger has a
row for each device, so that claims can compare-and-set them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from composespawner.domain import colocation
from composespawner.domain.catalog import Catalog, GpuModel, Size
from composespawner.domain.cohorts import StackChoice
from composespawner.domain.colocation import Registration
from composespawner.domain.hardware import Inventory, Share
from composespawner.domain.offers import (
    Availability,
    availability,
    keep_back,
    shares_free,
    sizes_free,
)
from composespawner.domain.offers import visible_models as _visible_models
from composespawner.domain.placement import Pool, pool_for
from composespawner.domain.quotas import NO_QUOTA, Quota
from composespawner.domain.rooms import Room
from composespawner.fabric.base import Fabric, FabricUnreachable
from composespawner.ledger import DeviceRecord, Holds, HostRecord, Ledger, LedgerRunner, utcnow
from composespawner.services.reservations import Reservations
from composespawner.services.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class PoolReadout:
    """The pool as one composer knows it, read without waiting on the fabric: what the
    hub's metrics show at each scrape."""

    releases_pending: int  # releases going on in the background, not confirmed yet
    holders: Mapping[str, str] | None = None  # block → machine; None: the ledger was unreadable
    reconciler_actions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # kind, outcome
    inventory: Inventory | None = None  # the fabric's, as last read (None: none read yet)
    inventory_age: float = 0.0  # seconds since that read began


@dataclass(frozen=True, slots=True)
class Offer:
    free: dict[str, Availability]  # catalog GPU model id → availability, visible models only
    gpus_in_use: float  # a share of 1/n counts 1/n
    quota: Quota = NO_QUOTA  # the user's effective quota
    # Seconds since the inventory behind ``free`` was read, when a fresh read did
    # not finish in time; None when it is fresh.
    inventory_age: float | None = None
    kept: Mapping[str, str] = field(default_factory=dict)  # model → what cohorts keep of it
    own: Mapping[str, str] = field(default_factory=dict)  # model → its co-located GPUs for the user
    stacks: StackChoice = field(default_factory=StackChoice)  # what the user's cohorts give
    sizes: tuple[Size, ...] = ()  # the sizes the user may choose
    sizes_free: Mapping[str, int] = field(default_factory=dict)  # size id → how many fit now
    # model id → share size → how many shares of that size a new server could get now
    # (every size the form may offer listed, 0 when none), within the quota left
    shares_free: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    @property
    def gpu_limit(self) -> int | None:
        """GPUs the user may hold at once (None: no limit)."""
        return self.quota.gpus_held.value

    @property
    def quota_left(self) -> float | None:
        return _quota_left(self.gpu_limit, self.gpus_in_use)


# How many fabric_wait periods a spawn waits for an inventory the fabric is still
# answering for (a busy hub, a slow service); 6 × 5 s is half a minute.
PATIENCE = 6
LOOP_STEP = 0.25  # seconds: the grain of wait_in_loop_time


async def wait_in_loop_time(future: asyncio.Future[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` of time this event loop was free for ``future``; whether it is done.

    Time the loop spent on other work does not count: answers that arrived then
    are still unread in their sockets. A whole class starting at once keeps the
    hub's loop busy with its own requests for seconds at a stretch (each spawn
    request costs the hub some 30 ms), and a wait on the clock would then blame
    the fabric for the hub's own backlog.
    """
    left = seconds
    while left > 0:
        step = min(LOOP_STEP, left)
        done, _ = await asyncio.wait({future}, timeout=step)
        if done:
            return True
        left -= step
    return future.done()


class PoolView:
    """Cached reads of the fabric and the ledger, for offers and for placement."""

    def __init__(
        self,
        *,
        runner: LedgerRunner,
        fabric: Fabric,
        catalog: Catalog,
        reservations: Reservations,
        snapshot_ttl: float,
        fabric_wait: float | None,
        log: logging.Logger,
        hub_id: str | None = None,
    ) -> None:
        """``fabric_wait``: seconds a spawn waits for the fabric's inventory before
        FabricUnreachable (None: as long as the fabric client's own timeouts take);
        ``hub_id``: the hub whose marked hosts take more machines (None: none do)."""
        self.hub_id = hub_id
        # What a user may take, on this hub's shared hosts, for placement.
        self._pool = partial(pool_for, hub=hub_id, max_devices=catalog.max_devices_per_host)
        self.runner = runner
        self.fabric = fabric
        self.catalog = catalog
        self.reservations = reservations
        self.snapshot_ttl = snapshot_ttl
        self.fabric_wait = fabric_wait
        self.log = log
        self._inventory = Snapshot[Inventory](snapshot_ttl)
        self._synced_blocks: frozenset[str] = frozenset()
        # Co-located devices registered in the portal, read with each inventory.
        self._registrations: Mapping[str, Registration] = {}
        self._chassis_owners_of: tuple[Inventory, Mapping[str, str]] | None = None
        # The ledger's holders and hosts' room in use as placement last read them,
        # with the number of our committed claims when that read began.
        self._holders = Snapshot[tuple[Holds, int]](snapshot_ttl)
        self._refreshing: set[asyncio.Task[Inventory]] = set()

    @property
    def ledger(self) -> Ledger:
        return self.runner.ledger

    # -- the fabric's inventory -------------------------------------------------

    async def inventory(self, *, fresh: bool = False) -> Inventory:
        """The fabric's inventory, cached for ``snapshot_ttl`` seconds (see Snapshot).

        Raises FabricUnreachable once the fabric has answered nothing for
        ``fabric_wait`` seconds (or after PATIENCE such waits while it answers
        slowly); the read goes on for whoever asks next.
        """
        known = self._inventory.current(fresh=fresh)
        if known is not None:
            return known  # without a turn of the loop: in a rush each turn takes long
        if self.fabric_wait is None:
            return await self._inventory.get(self._read_inventory, fresh=fresh)
        read = asyncio.ensure_future(self._inventory.get(self._read_inventory, fresh=fresh))
        try:
            # A fabric that keeps answering is getting on with the read, however slowly:
            # wait on. One that answered nothing during a wait is not waited for.
            for _ in range(PATIENCE):
                began = time.monotonic()
                if await wait_in_loop_time(read, self.fabric_wait):
                    return read.result()
                if self.fabric.seconds_since_answer() > time.monotonic() - began:
                    break
            raise _no_inventory_within(self.fabric_wait)
        finally:
            read.cancel()  # our wait only: the read itself goes on for the next caller

    async def known_inventory(self) -> Inventory:
        """Any inventory read so far, however old (a fresh one if none): for what never changes."""
        return self._inventory.value or await self.inventory()

    def last_inventory(self) -> tuple[Inventory | None, float]:
        """The inventory last read, and its age in seconds; no I/O."""
        return self._inventory.value, time.monotonic() - self._inventory.began

    def readout(self, *, releases_pending: int) -> PoolReadout:
        """The pool for a metrics scrape: the ledger's holders and the last inventory.

        A scrape never waits on the fabric: an inventory older than the snapshot's
        lifetime is read again in the background, for the next scrape.
        """
        try:
            holders = self.ledger.holders()
            actions = self.ledger.reconcile_action_counts()
        except Exception:
            self.log.exception("Metrics: the ledger could not be read")
            return PoolReadout(releases_pending)
        inventory, age = self.last_inventory()
        if inventory is None or age > self.snapshot_ttl:
            self._refresh_soon()
        return PoolReadout(releases_pending, holders, actions, inventory, age)

    def _refresh_soon(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # read outside the hub's loop: the next read is as stale
        task = loop.create_task(self.inventory())
        self._refreshing.add(task)  # kept until done: the loop holds tasks only weakly
        task.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task[Inventory]) -> None:
        self._refreshing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("Metrics: inventory refresh failed: %s", task.exception())

    def forget(self) -> None:
        """Devices were given back: the next offer and placement read again."""
        self._inventory.forget()
        self._holders.forget()

    async def _read_inventory(self) -> Inventory:
        inventory = await self.fabric.inventory()
        self._registrations = await self.runner.run(self.ledger.policy.registrations)
        await self._sync_ledger(inventory)
        return inventory

    async def _sync_ledger(self, inventory: Inventory) -> None:
        """Make sure the ledger has a row for every block and host, so claims can
        compare-and-set them."""
        owners = self.owners(inventory)
        records = [DeviceRecord.from_device(d, owners.get(d.block_id)) for d in inventory.devices]
        records += [DeviceRecord.from_host(h) for h in inventory.hosts]
        slots = self.catalog.max_devices_per_host
        hosts = [
            HostRecord(h.system_id, h.block_id, Room(h.cpus, h.memory_gib, h.max_devices or slots))
            for h in inventory.hosts
        ]
        fingerprint = frozenset(repr(r) for r in (*records, *hosts))
        if fingerprint != self._synced_blocks:
            await self.runner.run(self.ledger.sync_devices, records)
            await self.runner.run(self.ledger.sync_hosts, hosts)
            self._synced_blocks = fingerprint

    def owners(
        self, inventory: Inventory, registrations: Mapping[str, Registration] | None = None
    ) -> dict[str, str]:
        """Co-located devices and the group that owns each: the catalog's, then the portal's
        (``registrations``, or those read with the inventory)."""
        return colocation.owners(self._chassis_owners(inventory), self._registered(registrations))

    def _chassis_owners(self, inventory: Inventory) -> Mapping[str, str]:
        """block → group, for devices in the catalog's co-located chassis: worked out once
        per inventory, not on each of a rush's spawns (every device, every time)."""
        known = self._chassis_owners_of
        if known is None or known[0] is not inventory:
            owned = {}
            for device in inventory.devices:
                group = self.catalog.owner_of_chassis(device.chassis)
                if group:
                    owned[device.block_id] = group
            known = self._chassis_owners_of = (inventory, owned)
        return known[1]

    def owners_for(
        self,
        inventory: Inventory,
        user: str,
        groups: frozenset[str],
        registrations: Mapping[str, Registration] | None = None,
    ) -> Mapping[str, str]:
        """:meth:`owners` as ``user`` may use them: what is lent to them is theirs to take."""
        registered = self._registered(registrations)
        owners = self.owners(inventory, registered)
        return colocation.owners_for(owners, registered, user, groups, utcnow())

    def _registered(
        self, registrations: Mapping[str, Registration] | None
    ) -> Mapping[str, Registration]:
        return self._registrations if registrations is None else registrations

    # -- what one user may have ---------------------------------------------------

    async def offer(
        self,
        user: str,
        groups: frozenset[str],
        *,
        quota: Quota = NO_QUOTA,
        holdback: Mapping[frozenset[str], int] | None = None,
        notes: Mapping[str, str] | None = None,
        registrations: Mapping[str, Registration] | None = None,
        within: float | None = None,
    ) -> Offer:
        """What the spawn form shows one user: models they may use, what is free, quota.

        ``quota``: the user's effective quota (models it does not allow are not
        offered). ``holdback``: free GPUs cohorts' sessions keep from this user
        (fabric models → count), and ``notes`` what the form says of them (catalog
        model → text). ``within``: seconds to wait for a fresh inventory before
        offering the last one, with its age; with none read yet, FabricUnreachable.
        """
        inventory, age = await self._inventory_within(within)
        registered = self._registered(registrations)
        owners = self.owners(inventory, registered)
        usable = colocation.owners_for(owners, registered, user, groups, utcnow())
        held, use, split = await self.runner.run(self.ledger.holds)
        pool = self._pool(inventory, held=held, owners=usable, groups=groups, use=use, split=split)
        own = _own_notes(self.catalog, pool, owners, registered, user, groups)
        pool = keep_back(pool, holdback or {})
        in_use = sum(use.gpus for use in await self.runner.run(self.ledger.gpu_use, user))
        quota_left = _quota_left(quota.gpus_held.value, in_use)
        per_server = quota.gpus_per_server.value
        cap = self.catalog.max_gpus_per_machine
        models = self._visible_catalog_models(inventory, owners, groups)
        allowed = [m for m in models if quota.allows_model(m.id)]
        free = {
            m.id: availability(
                pool,
                m.fabric_models,
                label=m.label,
                per_machine_cap=cap if per_server is None else min(cap, per_server),
                quota_left=quota_left,
            )
            for m in allowed
        }
        kept = {model: note for model, note in (notes or {}).items() if model in free}
        sizes = self.catalog.sizes
        hosts = {s.id: None if s.whole_host else Share(s.cores, s.memory_gib) for s in sizes}
        return Offer(
            sizes=sizes,
            sizes_free=sizes_free(pool, hosts),
            shares_free=_shares_offered(pool, allowed, quota_left),
            free=free,
            gpus_in_use=in_use,
            quota=quota,
            inventory_age=age,
            kept=kept,
            own={model: note for model, note in own.items() if model in free},
        )

    async def _inventory_within(self, budget: float | None) -> tuple[Inventory, float | None]:
        if budget is None:
            return await self.inventory(), None
        try:
            return await self._inventory.get_within(self._read_inventory, budget)
        except TimeoutError as e:
            raise _no_inventory_within(budget) from e

    async def visible_models(
        self,
        user: str,
        groups: frozenset[str],
        registrations: Mapping[str, Registration] | None = None,
    ) -> frozenset[str]:
        """Catalog ids of the GPU models this user may ask for, free or not.

        What request validation needs, without the ledger reads of :meth:`offer`:
        it runs on every spawn. The portal's registrations are read afresh (a small
        table) unless the caller has just read them (``registrations``), so a GPU
        registered or lent a moment ago can be asked for at once.
        """
        inventory = await self.inventory()
        if registrations is None:
            registrations = await self.runner.run(self.ledger.policy.registrations)
        owners = self.owners_for(inventory, user, groups, registrations)
        models = self._visible_catalog_models(inventory, owners, groups)
        return frozenset(m.id for m in models)

    def _visible_catalog_models(
        self, inventory: Inventory, owners: Mapping[str, str], groups: frozenset[str]
    ) -> list[GpuModel]:
        fabric_models = _visible_models(inventory, owners, groups)
        return [m for m in self.catalog.gpu_models if m.fabric_models & fabric_models]

    # -- what a claim may take ----------------------------------------------------

    async def claimable(
        self,
        user: str,
        groups: frozenset[str],
        *,
        fresh: bool,
        holdback: Mapping[frozenset[str], int] | None = None,
        registrations: Mapping[str, Registration] | None = None,
    ) -> Pool:
        """What placement may take for this user: free in the ledger, not reserved by us.

        The holders are read once per snapshot, not per claim (in a rush every spawn
        would read the whole holder table). A stale read cannot cause a double holder:
        our claims since are reserved in-process (shares of GPUs too), and the claim's
        compare-and-set refuses what another hub took meanwhile (then we read again).
        Our releases drop it (forget). ``holdback``: free GPUs cohorts' sessions keep
        from these groups (fabric models → count); the claim checks them exactly."""
        inventory = await self.inventory(fresh=fresh)
        (held, use, split), read_after = await self._holders.get(self._read_holders, fresh=fresh)
        mine, owners = self.reservations, self.owners_for(inventory, user, groups, registrations)
        taken, rooms = mine.taken(held, read_after), mine.rooms(use, read_after)
        split = mine.splits(split, read_after)
        pool = self._pool(
            inventory, held=taken, owners=owners, groups=groups, use=rooms, split=split
        )
        return keep_back(pool, holdback or {})

    async def _read_holders(self) -> tuple[Holds, int]:
        read_after = self.reservations.commits
        return await self.runner.run(self.ledger.holds), read_after


def _own_notes(
    catalog: Catalog,
    pool: Pool,
    owners: Mapping[str, str],
    registrations: Mapping[str, Registration],
    user: str,
    groups: frozenset[str],
) -> dict[str, str]:
    """Catalog model → which of its free GPUs are the user's group's own, or lent to them."""
    now = utcnow()
    notes: dict[str, list[str]] = {}
    for model in catalog.gpu_models:
        mine = [d for d in pool.devices if d.block_id in owners and d.model in model.fabric_models]
        for group in sorted({owners[d.block_id] for d in mine} & groups):
            n = sum(1 for d in mine if owners[d.block_id] == group)
            notes.setdefault(model.id, []).append(
                f"{n} free {'is' if n == 1 else 'are'} {group}'s own"
            )
        for d in mine:
            registration = registrations.get(d.block_id)
            if registration and registration.lent_to(user, groups, now) and registration.lent_until:
                until = f"{registration.lent_until:%Y-%m-%d}"
                notes.setdefault(model.id, []).append(f"{d.block_id} is lent to you until {until}")
    return {model: "; ".join(lines) for model, lines in notes.items()}


def _shares_offered(
    pool: Pool, models: Sequence[GpuModel], quota_left: float | None
) -> dict[str, dict[int, int]]:
    """Catalog model → share size → shares new servers could get now (none where the
    quota left is less than one share)."""
    return {
        m.id: {
            size: shares_free(pool, m.fabric_models, size)
            if quota_left is None or quota_left + 1e-9 >= 1 / size
            else 0
            for size in m.shares
        }
        for m in models
        if m.shares
    }


def _quota_left(gpu_limit: int | None, in_use: float) -> float | None:
    """GPUs a user may still take (None: no limit); never below 0, even over a lowered limit."""
    return None if gpu_limit is None else max(gpu_limit - in_use, 0)


def _no_inventory_within(seconds: float) -> FabricUnreachable:
    return FabricUnreachable(f"no inventory from the fabric within {seconds:g} s; still reading")
