"""The portal's use cases: what its pages and JSON calls ask of the ledger and the hub.

Handlers parse a request, say who is asking and whether they may, then call one
of these. They raise the portal's own errors (``portal/errors.py``) and let the
hub client's ``HubUnavailable`` through; the handlers' ``write_error`` turns both
into statuses. Every ledger call goes through the ledger's own transactions (in
a worker thread for a database server), and admin changes carry the actor and
their address into the audit log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import Cohort, next_session_start
from composespawner.domain.colocation import Registration
from composespawner.domain.machine import machine_env
from composespawner.domain.manifest import NotRelaunchable, relaunch_options
from composespawner.domain.quotas import InvalidQuota, Level, Quota, QuotaRule
from composespawner.domain.reclaim import SITE_DEFAULT, ReclaimPolicy
from composespawner.domain.request import RequestError, check_server_name
from composespawner.domain.usage import DayUse, InvalidPeriod, Period, usage_report
from composespawner.ledger import (
    TERMINAL,
    Actor,
    AuditEntry,
    DeviceRecord,
    Holding,
    Ledger,
    Machine,
    RunManifest,
    UnknownDevices,
)
from composespawner.ledger.runner import LedgerRunner
from composespawner.portal import machine_views, reclaim_views, usage_views, views
from composespawner.portal.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    NotOffered,
    PortalError,
    Unavailable,
)
from composespawner.portal.leaderboards import Leaderboards
from composespawner.portal.reclaims import ReclaimDesk
from composespawner.portal.scoring import Scorer
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.hub_api import HubClient, Stop

AUDIT_PAGE_ROWS = 500
NOTICES_FOR = timedelta(days=7)  # how long "my machine" shows what admins did to my servers
RECENT_RUNS = 10  # the runs "my machine" lists, newest first


@dataclass
class Portal:
    """What every handler shares: the ledger, the hub's API, the catalog, the site default."""

    ledger: Ledger
    hub: HubClient
    catalog: Catalog
    site_quota: QuotaRule
    prefix: str
    timezone: tzinfo = UTC  # where cohort session times are told
    composer: Composer | None = None  # grows and shrinks running machines (None: it cannot)
    scorer: Scorer | None = None  # scores starter-kit submissions (None: none are taken)
    stack_environments: Path | None = None  # where the stacks' environments are built
    reclaim_policy: ReclaimPolicy = SITE_DEFAULT  # the site's, as the reclaimer's config
    reclaim_interval: float = 0.0  # the reclaimer's seconds between passes
    runner: LedgerRunner = field(init=False)
    kits: Leaderboards = field(init=False)  # the starter kits' submissions and boards
    reclaims: ReclaimDesk = field(init=False)  # idle GPUs: what users are told, Keep

    def __post_init__(self) -> None:
        self.runner = LedgerRunner(self.ledger)
        self.reclaims = ReclaimDesk(
            self.ledger, self.runner, self.reclaim_policy, self.timezone, self.reclaim_interval
        )
        self.kits = Leaderboards(
            self.ledger, self.runner, self.catalog, self.scorer, self.stack_environments
        )

    @property
    def model_ids(self) -> list[str]:
        return [m.id for m in self.catalog.gpu_models]

    async def check_group_exists(self, group: str) -> None:
        """Cohorts and owners are hub groups: naming one that does not exist is a typing slip."""
        if not await self.hub.group_exists(group):
            raise InvalidInput(f"No group {group!r} in the hub: create it there first.")

    # -- me ---------------------------------------------------------------------

    async def quota_of(self, user: str, groups: list[str]) -> Quota:
        return await self.runner.run(self.ledger.policy.quota_of, user, groups, self.site_quota)

    async def my_machine(self, user: str, groups: list[str]) -> dict[str, Any]:
        quota = await self.quota_of(user, groups)
        machines = await self.runner.run(self.ledger.live_machines, user)
        devices = await self.devices_of(machines)
        hours = await self.runner.run(self.ledger.gpu_hours, user)
        mine = machine_views.my_machine(user, groups, quota, machines, devices, hours)
        mine["servers"] = await self.reclaims.annotated(mine["servers"], machines, devices)
        mine["cohorts"] = await self.cohorts(groups)
        since = datetime.now(UTC) - NOTICES_FOR
        notices = await self.runner.run(self.ledger.policy.notices, user, since)
        mine["notices"] = [reclaim_views.notice(entry) for entry in notices]
        runs = await self.runner.run(self.ledger.run_manifests, user, RECENT_RUNS)
        mine["runs"] = [machine_views.run_json(run) for run in runs]
        return mine

    async def resize(self, change: Callable[[Composer], Awaitable[Machine]]) -> dict[str, Any]:
        """Grow or shrink a running machine; the server as it is now, and what a kernel
        must do to see the change."""
        if self.composer is None:
            raise NotOffered("This portal cannot change running machines.")
        try:
            machine = await change(self.composer)
        except ComposeRefused as e:
            raise PortalError(str(e), e.status) from None
        except ComposeFailed as e:
            raise Unavailable(str(e)) from None
        devices = await self.devices_of([machine])
        composed = await self.composer.composed(machine)
        resized = machine_views.resized(machine, devices, machine_env(composed))
        return (await self.reclaims.annotated([resized], [machine], devices))[0]

    async def run_of(self, user: str, machine_id: str, *, sees_all: bool) -> RunManifest:
        """The run on ``machine_id``: its user's and (``sees_all``) the admins' alone; anyone
        else is told what they would be of a machine that never was."""
        run = await self.runner.run(self.ledger.run_manifest, machine_id)
        if run is None or (run.user_name != user and not sees_all):
            raise NotFound("No run of yours has that machine id.")
        return run

    async def launch_again(self, user: str, machine_id: str, name: str | None) -> dict[str, Any]:
        """Start a server like ``user``'s run on ``machine_id``: same stack lock, same GPUs.

        ``name`` is the new server's (None: the run's own, which must not be running).
        """
        run = await self.run_of(user, machine_id, sees_all=False)
        server = run.server_name if name is None else name
        try:
            check_server_name(server)
            options = relaunch_options(run.manifest, self.catalog)
        except RequestError as e:
            raise InvalidInput(str(e)) from None
        except NotRelaunchable as e:
            raise Conflict(str(e)) from None
        status, message = await self.hub.start_server(user, server, options)
        shown = f"server {server!r}" if server else "your default server"
        if status == 400 and "already running" in message:
            raise Conflict(f"{shown.capitalize()} is running: stop it, or name another.")
        if status not in (201, 202):
            raise PortalError(message, status if 400 <= status < 600 else 502)
        return {"server": server, "options": options, "from_machine": machine_id}

    async def devices_of(self, machines: Iterable[Machine]) -> dict[str, DeviceRecord]:
        """The devices the machines hold, by block id."""
        held = {block for machine in machines for block in machine.block_ids}
        return {d.block_id: d for d in await self.runner.run(self.ledger.devices, held)}

    # -- quotas -----------------------------------------------------------------

    async def quota_rules(self) -> list[QuotaRule]:
        return await self.runner.run(self.ledger.policy.quota_rules)

    async def quota_rule(self, level: Level, subject: str) -> QuotaRule:
        rules = await self.quota_rules()
        found = next((r for r in rules if (r.level, r.subject) == (level, subject)), None)
        if found is None:
            raise NotFound(f"No {level} quota for {subject!r}.")
        return found

    async def set_quota_rule(self, rule: QuotaRule, actor: Actor) -> None:
        if rule.level == "cohort":
            await self.check_group_exists(rule.subject)
        await self.runner.run(self.ledger.policy.set_quota_rule, rule, actor)

    async def delete_quota_rule(self, level: str, subject: str, actor: Actor) -> bool:
        """Whether there was such a rule to delete."""
        return await self.runner.run(self.ledger.policy.delete_quota_rule, level, subject, actor)

    async def user_quota(self, name: str) -> dict[str, Any]:
        """Any user's effective quota, each limit with where it comes from."""
        groups = await self.hub.user_groups(name)
        if groups is None:
            raise NotFound(f"No user {name!r} in the hub.")
        quota = await self.quota_of(name, groups)
        return {"name": name, "groups": sorted(groups), "quota": views.quota_json(quota)}

    # -- cohorts ----------------------------------------------------------------

    async def cohorts(self, names: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Every cohort (or those of ``names``), with its next session start in the site's
        time zone."""
        now = datetime.now(self.timezone)
        return [
            views.cohort_json(c, self.catalog, next_session_start(c, now))
            for c in await self.runner.run(self.ledger.policy.cohorts, names)
        ]

    async def cohort(self, name: str) -> dict[str, Any]:
        found = await self.cohorts([name])
        if not found:
            raise NotFound(f"No cohort {name!r}.")
        return found[0]

    async def cohort_names(self) -> list[str]:
        return await self.runner.run(self.ledger.policy.cohort_names)

    async def set_cohort(self, name: str, body: object, actor: Actor, *, admin: bool) -> Cohort:
        """Store the cohort ``body`` describes: an admin's whole, course staff's but for
        its reservation."""
        if not admin:
            stored = await self.runner.run(self.ledger.policy.cohorts, [name])
            try:
                body = views.staff_change(body, stored[0] if stored else None)
            except views.NotStaffsToChange as e:
                raise Forbidden(str(e)) from None
        try:
            cohort = views.cohort_from_json(name, body, self.catalog)
        except InvalidQuota as e:
            raise InvalidInput(str(e)) from None
        await self.check_group_exists(cohort.name)
        await self.runner.run(self.ledger.policy.set_cohort, cohort, actor)
        return cohort

    async def delete_cohort(self, name: str, actor: Actor) -> bool:
        """Whether there was such a cohort to delete."""
        return await self.runner.run(self.ledger.policy.delete_cohort, name, actor)

    # -- devices ----------------------------------------------------------------

    async def holdings(self) -> list[Holding]:
        return await self.runner.run(self.ledger.holdings)

    async def inventory(self) -> dict[str, Any]:
        """Every device and its holder, and every host with its machines and room left."""
        holdings = await self.holdings()
        machines = await self.runner.run(self.ledger.live_machines)
        hosts = await self.runner.run(self.ledger.host_rooms)
        return machine_views.inventory(holdings, machines, hosts)

    async def force_release(self, machine_id: str, reason: str, actor: Actor) -> dict[str, Any]:
        """Stop the server a live machine serves, cleanly, telling its user why."""
        machine = await self.runner.run(self.ledger.machine, machine_id)
        if machine is None or machine.state in TERMINAL:
            raise NotFound(f"No live machine {machine_id!r}: it may have ended already.")
        user, server = machine.user_name, machine.server_name
        await self.runner.run(
            self.ledger.policy.note_force_release, machine_id, user, server, reason, actor
        )
        stopping = await self.hub.stop_server(user, server) is Stop.STOPPING
        return {"machine": machine_id, "user": user, "server": server, "stopping": stopping}

    async def colocated(self, groups: Collection[str] | None) -> list[dict[str, Any]]:
        """Co-located GPUs: every one (``groups`` None, for admins) or those ``groups`` own."""
        holdings = await self.holdings()
        registrations = await self.runner.run(self.ledger.policy.registrations)
        return views.colocated(holdings, registrations, groups)

    async def register_device(self, block: str, owner_group: str, actor: Actor) -> Registration:
        await self.check_group_exists(owner_group)
        try:
            return await self.runner.run(
                self.ledger.policy.register_device, block, owner_group, actor
            )
        except UnknownDevices:
            raise NotFound(f"No device {block!r} has been seen in the fabric.") from None

    async def unregister_device(self, block: str, actor: Actor) -> bool:
        """Give a registered device back to its catalog owner, or to the pool."""
        holdings = await self.holdings()
        chassis = next((h.device.chassis for h in holdings if h.device.block_id == block), "")
        owner = self.catalog.owner_of_chassis(chassis)
        return await self.runner.run(self.ledger.policy.unregister_device, block, actor, owner)

    async def lend(
        self, block: str, body: object, actor: Actor, groups: Collection[str] | None
    ) -> Registration:
        """Lend (or, with body None, take back) a device: any (``groups`` None, for admins)
        or one ``groups`` own."""
        registration = (await self.runner.run(self.ledger.policy.registrations)).get(block)
        if registration is None:
            raise NotFound(f"{block!r} is not a registered co-located device.")
        if groups is not None and registration.owner_group not in groups:
            raise Forbidden(f"Only {registration.owner_group}'s members may lend {block}.")
        if body is None:
            lent = replace(registration, lent_to_user=None, lent_to_group=None, lent_until=None)
        else:
            try:
                lent = views.loan_from_json(registration, body, datetime.now(self.timezone))
            except InvalidQuota as e:
                raise InvalidInput(str(e)) from None
            await self._check_borrower_exists(lent)
        await self.runner.run(self.ledger.policy.lend, lent, actor)
        return lent

    async def _check_borrower_exists(self, lent: Registration) -> None:
        if lent.lent_to_group is not None:
            found = await self.hub.group_exists(lent.lent_to_group)
        else:
            found = await self.hub.user_groups(lent.lent_to_user or "") is not None
        if not found:
            who = lent.lent_to_group or lent.lent_to_user
            raise InvalidInput(f"No user or group {who!r} in the hub to lend to.")

    # -- usage and the audit log ------------------------------------------------

    def period(self, since: str | None, until: str | None) -> Period:
        """The date range asked for, in the site's days; InvalidInput says what to fix."""
        try:
            return Period.parse(since, until, today=datetime.now(self.timezone).date())
        except InvalidPeriod as e:
            raise InvalidInput(str(e)) from e

    async def usage(self, period: Period) -> dict[str, Any]:
        """GPU-hours in ``period`` by day and model, user, cohort (held; used and given back
        by day and cohort); and what runs now."""
        sums = await self.runner.run(self.ledger.usage_sums, period)
        cohorts = await self.cohort_names()
        members = {}
        if cohorts:
            groups = await self.hub.group_members()
            members = {name: groups.get(name, []) for name in cohorts}
        report = usage_report(
            period,
            sums.days,
            sums.users,
            sums.live,
            members,
            used=sums.used,
            given_back=sums.given_back,
        )
        held = await self.runner.run(self.ledger.holdings, held_only=True)
        return usage_views.usage_json(report, views.running(held))

    async def day_uses(self, period: Period) -> list[DayUse]:
        """Every day, user and model in ``period`` with each figure of it: held (ended,
        then running so far), then used and given back (the CSV's rows)."""
        held = await self.runner.run(self.ledger.day_uses, period)
        return held + await self.runner.run(self.ledger.reclaims.usage_figures, period)

    async def audit_log(self, rows: int | None = AUDIT_PAGE_ROWS) -> list[AuditEntry]:
        """The newest ``rows`` entries, newest first; None: all of them, oldest first."""
        if rows is None:
            return await self.runner.run(self.ledger.policy.audit_log, None, True)
        return await self.runner.run(self.ledger.policy.audit_log, rows)
