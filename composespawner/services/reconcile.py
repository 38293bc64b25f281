"""Make the ledger, the fabric and the hub's servers agree (docs/architecture.md invariant 8).

A hub can die at any step of a spawn or a stop, a release can outlast the
process that started it, and an admin can change the fabric by hand. The
reconciler runs at hub start and then periodically, as a hub-managed service
(``composespawner reconcile``), and repairs what disagrees:

=====================  =======================================================
what it finds          what it does
=====================  =======================================================
a machine stuck in     finish the release (detach, then free in the ledger)
``stopping``
a live machine no      release it: the spawn that made it died with its hub
server uses
a host marked by this  detach what is attached to it that no live machine
hub for a machine the  holds (the host's other machines keep theirs), and take
ledger has ended       the machine off the mark: we made it, nothing holds it
a device our ledger    attach it again when it is free; otherwise report a
holds but the fabric   conflict and change nothing
lost
a running server whose stop the server: it runs without its devices
machine has ended
=====================  =======================================================

Deciding is a pure function of three snapshots (:func:`plan_reconcile`); the
:class:`Reconciler` only gathers them and carries the actions out. What it
cannot see it leaves alone: with the hub's API down it only finishes releases,
with the fabric down it does nothing, and it never touches a host marked by
another hub or by nobody (unknown is never dead). Recent machines get a grace
period, so a spawn or stop in flight is never mistaken for debris. Every action
is logged, written to the machine's event log where there is a machine, and
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from jupyterhub.services.auth import HubAuth
from traitlets import Bool, Float, default

from composespawner.domain.hardware import Inventory
from composespawner.fabric.base import FabricError
from composespawner.ledger import TERMINAL, LedgerError, Machine
from composespawner.services.application import ComposeApplication
from composespawner.services.composer import Composer
from composespawner.services.hub_api import HubClient, HubUnavailable, Stop
from composespawner.services.settings import build_composer

HUB_CALL_TIMEOUT = 20.0  # seconds for one call to the hub's API (one page of 200 active users)

ActionKind = Literal[
    "finish-release", "release-orphan", "detach-untracked", "reattach", "stop-server", "conflict"
]


@dataclass(frozen=True, slots=True)
class ServerView:
    """One active server as the hub reports it."""

    user: str
    server: str  # '' for the default server
    pending: str | None  # 'spawn', 'stop' or None: the hub is busy with it
    machine_id: str | None  # from the spawner state the hub keeps


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    reason: str
    machine_id: str | None = None
    host: str | None = None
    blocks: tuple[str, ...] = ()
    user: str | None = None
    server: str | None = None


@dataclass
class Report:
    """What one pass saw and did."""

    actions: list[Action] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    hub_reachable: bool = True
    fabric_reachable: bool = True

    def summary(self) -> dict[str, Any]:
        return {
            "done": dict(self.done),
            "errors": dict(self.errors),
            "hub_reachable": self.hub_reachable,
            "fabric_reachable": self.fabric_reachable,
            "actions": [
                {k: v for k, v in vars_of(a).items() if v not in (None, ())} for a in self.actions
            ],
        }


def vars_of(action: Action) -> dict[str, Any]:
    return {name: getattr(action, name) for name in action.__slots__}


# ---------------------------------------------------------------------------
# Deciding: pure
# ---------------------------------------------------------------------------


def plan_reconcile(
    *,
    machines: Mapping[str, Machine],
    inventory: Inventory | None,
    servers: Sequence[ServerView] | None,
    hub_id: str,
    now: datetime,
    grace: timedelta,
) -> list[Action]:
    """What to do to make ledger, fabric and hub agree.

    ``machines`` holds every live machine plus every machine a server or a host
    mark names (ended ones included); ``inventory`` is None when the fabric did
    not answer, ``servers`` None when the hub did not.
    """
    actions: list[Action] = []
    by_server = {(s.user, s.server): s for s in servers or ()}

    def settled(machine: Machine) -> bool:
        return now - _aware(machine.updated_at) >= grace

    for machine in sorted(machines.values(), key=lambda m: m.id):
        if machine.state in TERMINAL or not settled(machine):
            continue
        view = by_server.get((machine.user_name, machine.server_name))
        if machine.state == "stopping":
            actions.append(Action("finish-release", "its release never finished", machine.id))
            continue
        if servers is None:
            continue  # whether a server still uses it is unknown: leave it
        if view is not None and view.pending:
            continue  # the hub is starting or stopping it right now
        if view is None or view.machine_id != machine.id:
            why = f"no server uses it (it was {machine.state} for {_owner(machine)})"
            actions.append(Action("release-orphan", why, machine.id))
            continue
        if inventory is not None:
            actions += _check_devices(machine, inventory)

    for view in servers or ():
        if view.pending or view.machine_id is None:
            continue
        used = machines.get(view.machine_id)
        # A machine the ledger has never heard of is unknown, not ended.
        if used is not None and used.state in TERMINAL and settled(used):
            why = f"its machine {used.id} has {used.state}; the devices are gone"
            stop = Action("stop-server", why, used.id, user=view.user, server=view.server)
            actions.append(stop)

    held = {b for m in machines.values() if m.state not in TERMINAL for b in m.block_ids}
    for host in inventory.hosts if inventory is not None else ():
        if host.mark is None or host.mark.hub != hub_id:
            continue  # not ours: never touched
        # The host is shared: only what no live machine holds is an ended machine's.
        debris = tuple(b for b in host.attached if b not in held)
        for tag in host.mark.machines:
            marked = machines.get(tag.machine)
            if marked is None or (marked.state in TERMINAL and settled(marked)):
                state = "unknown to the ledger" if marked is None else marked.state
                actions.append(
                    Action(
                        "detach-untracked",
                        f"marked for machine {tag.machine} ({tag.owner}), which is {state}",
                        tag.machine,
                        host=host.system_id,
                        blocks=debris,
                    )
                )
                debris = ()  # detached with the first ended machine; the others only leave
    return actions


def _check_devices(machine: Machine, inventory: Inventory) -> list[Action]:
    """A machine a server uses: is every device it holds attached to its host?"""
    host = inventory.host(machine.host_id or "")
    marked = {m.machine for m in host.mark.machines} if host and host.mark else set()
    if host is None or machine.id not in marked:
        found = "gone" if host is None else "not marked for it"
        why = f"its host {machine.host_id} is {found} on the fabric"
        return [Action("conflict", why, machine.id, host=machine.host_id)]
    actions = []
    for block in machine.block_ids:
        if block == host.block_id or block in host.attached:
            continue
        device = inventory.device(block)
        if device is not None and device.state == "free":
            why = f"{block} is free on the fabric but held by {machine.id}"
            reattach = Action("reattach", why, machine.id, host=host.system_id, blocks=(block,))
            actions.append(reattach)
        else:
            where = "missing" if device is None else f"{device.state} ({device.attached_to})"
            why = f"{block} held by {machine.id} is {where} on the fabric"
            actions.append(Action("conflict", why, machine.id, host=host.system_id))
    return actions


def _owner(machine: Machine) -> str:
    return f"{machine.user_name}/{machine.server_name}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# ---------------------------------------------------------------------------
# The hub's servers
# ---------------------------------------------------------------------------


class HubServers(Protocol):
    async def servers(self) -> list[ServerView]:
        """Every active server, with the machine id from its spawner state."""
        ...

    async def stop_server(self, user: str, server: str) -> None: ...


class ServersFromHub:
    """The hub's servers through its REST API (``admin:server_state``: each names its machine)."""

    def __init__(self, hub: HubClient) -> None:
        self.hub = hub

    async def servers(self) -> list[ServerView]:
        return [view for user in await self.hub.users(state="active") for view in _views(user)]

    async def stop_server(self, user: str, server: str) -> None:
        answer = await self.hub.stop_server(user, server)
        if answer is Stop.REFUSED:
            # Not now: this pass's action failed, and the next pass plans it afresh.
            raise HubUnavailable(f"the hub would not stop {user}'s server {server!r} now (400)")
        # Stop.GONE, a server the hub no longer has: already stopped is what we wanted.


def _views(user: Mapping[str, Any]) -> Iterable[ServerView]:
    for name, server in (user.get("servers") or {}).items():
        state = server.get("state") or {}
        machine = state.get("compose", {}).get("machine_id") if isinstance(state, dict) else None
        yield ServerView(user["name"], name, server.get("pending"), machine)


# ---------------------------------------------------------------------------
# Doing
# ---------------------------------------------------------------------------


class Reconciler:
    """Gathers the three snapshots, plans, and carries the plan out."""

    def __init__(
        self,
        composer: Composer,
        hub: HubServers | None,
        *,
        grace: float = 60.0,
        log: logging.Logger | None = None,
    ) -> None:
        self.composer = composer
        self.hub = hub
        self.grace = timedelta(seconds=grace)
        self.log = log or logging.getLogger(__name__)
        self.totals: Counter[str] = Counter()

    async def run_once(self) -> Report:
        report = Report()
        ledger = self.composer.ledger
        servers = await self._servers(report)
        try:
            inventory = await self.composer.pool.inventory(fresh=True)
        except FabricError as e:
            self.log.warning("Reconcile: the fabric did not answer (%s); nothing done", e)
            report.fabric_reachable = False
            return report  # every repair needs the fabric; unknown is never dead
        live = await self.composer.runner.run(ledger.live_machines)
        machines = {m.id: m for m in live}
        named = {s.machine_id for s in servers or () if s.machine_id}
        named |= {m.machine for h in inventory.hosts if h.mark for m in h.mark.machines}
        for machine_id in sorted(named - machines.keys()):
            machine = await self.composer.runner.run(ledger.machine, machine_id)
            if machine is not None:
                machines[machine_id] = machine
        report.actions = plan_reconcile(
            machines=machines,
            inventory=inventory,
            servers=servers,
            hub_id=self.composer.hub_id,
            now=datetime.now(UTC),
            grace=self.grace,
        )
        for action in report.actions:
            await self._carry_out(action, report)
        self.totals.update(report.done)
        self.totals.update({f"error:{k}": n for k, n in report.errors.items()})
        if report.actions:
            done, errors = dict(report.done), dict(report.errors)
            self.log.info("Reconcile pass: done %s, errors %s", done, errors)
        return report

    async def run_forever(self, every: float) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                self.log.exception("Reconcile pass failed; trying again in %.0fs", every)
            await asyncio.sleep(every)

    async def _servers(self, report: Report) -> list[ServerView] | None:
        if self.hub is None:
            report.hub_reachable = False
            return None
        try:
            return await self.hub.servers()
        except HubUnavailable as e:
            self.log.warning("Reconcile: the hub did not answer (%s); only finishing releases", e)
            report.hub_reachable = False
            return None

    async def _carry_out(self, action: Action, report: Report) -> None:
        self.log.info(
            "Reconcile: %s %s: %s",
            action.kind,
            action.machine_id or f"{action.user}/{action.server}",
            action.reason,
        )
        try:
            await self._act(action)
        except (FabricError, HubUnavailable, LedgerError) as e:
            # A LedgerError here is a transition someone else made first: next pass.
            self.log.warning("Reconcile: %s of %s failed: %s", action.kind, action.machine_id, e)
            report.errors[action.kind] += 1
            await self._record(action, "error", f"{action.reason} (failed: {e})")
        else:
            report.done[action.kind] += 1
            await self._record(action, "done", action.reason)

    async def _record(self, action: Action, outcome: Literal["done", "error"], why: str) -> None:
        """Keep the action in the ledger: the hub's metrics count them from there."""
        try:
            await self.composer.runner.run(
                self.composer.ledger.record_reconcile_action,
                action.kind,
                outcome,
                why,
                machine_id=action.machine_id,
                host_id=action.host,
            )
        except Exception:
            self.log.exception("Reconcile: could not record %s in the ledger", action.kind)

    async def _act(self, action: Action) -> None:
        composer, why = self.composer, f"reconciler: {action.reason}"
        if action.kind == "finish-release":
            assert action.machine_id
            await composer.release(action.machine_id, reason=why)
        elif action.kind == "release-orphan":
            assert action.machine_id
            await composer.release(action.machine_id, reason=why, failed=True)
        elif action.kind == "detach-untracked":
            assert action.host
            assert action.machine_id
            await composer.clear_host(action.host, action.blocks, action.machine_id)
        elif action.kind == "reattach":
            assert action.host
            await composer.reattach(action.host, action.blocks)
        elif action.kind == "stop-server":
            assert self.hub is not None
            assert action.user is not None
            await self.hub.stop_server(action.user, action.server or "")
        # "conflict": reported and counted, never acted on: a person must look.


# ---------------------------------------------------------------------------
# The service: ``composespawner reconcile``
# ---------------------------------------------------------------------------


class ReconcilerApp(ComposeApplication):
    """The reconciler as a hub-managed service: ``composespawner reconcile -f CONFIG``."""

    name = "composespawner reconcile"
    description = """Make the ledger, the fabric and the hub's servers agree, at start and
    then every few seconds. Reads the hub's config file for the ledger, fabric and
    catalog; the hub's API comes from $JUPYTERHUB_API_URL and $JUPYTERHUB_API_TOKEN,
    which the hub sets for its services."""

    every = Float(60.0, config=True, help="Seconds between reconcile passes.")
    grace = Float(
        60.0,
        config=True,
        help="""Seconds a machine is left alone after its last change: keep it longer
        than the hub takes to record a started server.""",
    )
    once = Bool(False, config=True, help="Make one pass, print what it did as JSON, and exit.")
    aliases = {
        **ComposeApplication.aliases,
        "every": "ReconcilerApp.every",
        "grace": "ReconcilerApp.grace",
    }
    flags = {"once": ({"ReconcilerApp": {"once": True}}, once.help)}

    @default("log_format")
    def _default_log_format(self) -> str:
        return "[%(levelname)1.1s %(asctime)s reconcile] %(message)s"

    def start(self) -> None:
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
            asyncio.run(self._run())

    async def _run(self) -> None:
        # The hub stops its services with SIGINT, then SIGTERM: either way the
        # pass in progress is cancelled and the fabric session logged out.
        main = asyncio.current_task()
        assert main is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        auth = HubAuth()
        hub = HubClient(auth.api_url, auth.api_token, HUB_CALL_TIMEOUT) if auth.api_token else None
        if hub is None:
            self.log.warning("No $JUPYTERHUB_API_TOKEN: servers unknown, only finishing releases")
        settings = self.settings
        self.log.info("Reconciling for hub %s every %.0f s", settings.hub_id, self.every)
        composer = build_composer(settings, self.log, for_spawns=False)
        servers = ServersFromHub(hub) if hub is not None else None
        reconciler = Reconciler(composer, servers, grace=self.grace, log=self.log)
        try:
            if self.once:
                print(json.dumps((await reconciler.run_once()).summary(), indent=1))
            else:
                await reconciler.run_forever(self.every)
        finally:
            if hub is not None:
                await hub.close()
            await composer.close()
