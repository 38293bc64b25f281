"""The portal's pages and JSON calls: HubOAuth for who, ``custom:compose:*`` scopes for what.

Every handler reads or changes the ledger through its own transactions (in a
worker thread for a database server), and admin changes carry the actor and
their address into the audit log. Cookie-authenticated changes need the XSRF
token (HubOAuth checks it); API tokens need the scope.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, tzinfo
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import plotly
from jupyterhub.services.auth import HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado.web import HTTPError, RequestHandler, authenticated

from composespawner.domain.catalog import Catalog, Kit
from composespawner.domain.cohorts import Cohort, InvalidCohort, next_session_start
from composespawner.domain.colocation import Registration
from composespawner.domain.machine import machine_env
from composespawner.domain.manifest import NotRelaunchable, relaunch_options
from composespawner.domain.quotas import InvalidQuota, Level, Quota, QuotaRule
from composespawner.domain.request import RequestError, check_server_name
from composespawner.domain.usage import InvalidPeriod, Period, usage_report
from composespawner.launchers.environments import StackEnvironments
from composespawner.ledger import (
    TERMINAL,
    Actor,
    DeviceRecord,
    Ledger,
    Machine,
    Standing,
    UnknownDevices,
    standings,
)
from composespawner.ledger.runner import LedgerRunner
from composespawner.ledger.submissions import BY
from composespawner.portal import views
from composespawner.portal.scoring import Scorer, SubmissionRefused
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.hub_api import HubClient, HubUnavailable

T = TypeVar("T")

ADMIN_SCOPE = "custom:compose:admin"
# Course staff: ``custom:compose:staff!group=<cohort>`` manages that cohort alone.
STAFF_SCOPE = "custom:compose:staff"
AUDIT_PAGE_ROWS = 500
MOST_REASON = 500
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
    resizer: Composer | None = None  # grows and shrinks running machines (None: it cannot)
    scorer: Scorer | None = None  # scores starter-kit submissions (None: none are taken)
    stack_environments: Path | None = None  # where the stacks' environments are built
    runner: LedgerRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = LedgerRunner(self.ledger)

    @property
    def model_ids(self) -> list[str]:
        return [m.id for m in self.catalog.gpu_models]

    async def quota_of(self, user: str, groups: list[str]) -> Quota:
        return await self.runner.run(self.ledger.policy.quota_of, user, groups, self.site_quota)

    async def my_machine(self, user: str, groups: list[str]) -> dict[str, Any]:
        quota = await self.quota_of(user, groups)
        machines = await self.runner.run(self.ledger.live_machines, user)
        devices = await self.devices_of(machines)
        hours = await self.runner.run(self.ledger.gpu_hours, user)
        mine = views.my_machine(user, groups, quota, machines, devices, hours)
        mine["cohorts"] = await self.cohorts(groups)
        since = datetime.now(UTC) - NOTICES_FOR
        notices = await self.runner.run(self.ledger.policy.notices, user, since)
        mine["notices"] = [views.notice_text(entry) for entry in notices]
        runs = await self.runner.run(self.ledger.run_manifests, user, RECENT_RUNS)
        mine["runs"] = [views.run_json(run) for run in runs]
        return mine

    async def resize(self, change: Callable[[Composer], Awaitable[Machine]]) -> dict[str, Any]:
        """Grow or shrink a running machine; the server as it is now, and what a kernel
        must do to see the change."""
        if self.resizer is None:
            raise HTTPError(501, "This portal cannot change running machines.")
        try:
            machine = await change(self.resizer)
        except ComposeRefused as e:
            raise HTTPError(e.status, str(e)) from None
        except ComposeFailed as e:
            raise HTTPError(503, str(e)) from None
        devices = await self.devices_of([machine])
        composed = await self.resizer.composed(machine)
        return views.resized(machine, devices, machine_env(composed))

    async def launch_again(self, user: str, machine_id: str, name: str | None) -> dict[str, Any]:
        """Start a server like ``user``'s run on ``machine_id``: same stack lock, same GPUs.

        ``name`` is the new server's (None: the run's own, which must not be running).
        """
        run = await self.runner.run(self.ledger.run_manifest, machine_id)
        if run is None or run.user_name != user:
            raise HTTPError(404, "No run of yours has that machine id.")
        server = run.server_name if name is None else name
        try:
            check_server_name(server)
            options = relaunch_options(run.manifest, self.catalog)
        except RequestError as e:
            raise HTTPError(400, str(e)) from None
        except NotRelaunchable as e:
            raise HTTPError(409, str(e)) from None
        try:
            status, message = await self.hub.start_server(user, server, options)
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        shown = f"server {server!r}" if server else "your default server"
        if status == 400 and "already running" in message:
            raise HTTPError(409, f"{shown.capitalize()} is running: stop it, or name another.")
        if status not in (201, 202):
            raise HTTPError(status if 400 <= status < 600 else 502, message)
        return {"server": server, "options": options, "from_machine": machine_id}

    async def submit(
        self, user: str, groups: list[str], kit: Kit, ask: views.SubmissionAsk
    ) -> dict[str, Any]:
        """Score ``ask``'s model on ``kit``'s blind data and put it on its leaderboard."""
        if self.scorer is None or self.stack_environments is None:
            raise HTTPError(503, "This hub takes no starter-kit submissions.")
        mine = await self.runner.run(self.ledger.policy.cohorts, groups) if groups else []
        try:
            board = views.board_for(kit.id, sorted(mine, key=lambda c: c.name), ask.cohort)
        except InvalidCohort as e:
            raise HTTPError(403, str(e)) from None
        python = self._stack_python(kit)
        try:
            score = await self.scorer.score(kit, python, ask.model)
        except SubmissionRefused as e:
            raise HTTPError(e.status, str(e)) from None
        manifest = await self._run_manifest_of(user, ask.server)
        submission = await self.runner.run(
            functools.partial(
                self.ledger.submissions.add,
                kit=kit.id,
                cohort=board,
                user=user,
                team=ask.team,
                score=score,
                model=ask.model,
                record=ask.record,
                manifest=manifest,
            )
        )
        on_board = await self.runner.run(self.ledger.submissions.of_board, kit.id, board)
        rank = next(s.rank for s in standings(on_board, "user") if s.name == user)
        return {
            "id": submission.id,
            "kit": kit.id,
            "cohort": board,
            "score": score,
            "rank": rank,
            "model_sha256": submission.model_sha256,
        }

    def _stack_python(self, kit: Kit) -> Path:
        stack = self.catalog.stack(kit.stack)
        # The catalog checks a kit's stack; submit() checks stack_environments.
        assert stack is not None
        assert stack.common is not None
        assert self.stack_environments is not None
        environment = StackEnvironments(self.stack_environments, stack.common).ready(stack)
        if environment is None:
            raise HTTPError(
                503,
                f"The {stack.label} stack is not built on this hub yet: start a server on it,"
                " then submit again.",
            )
        return environment.bin / "python"

    async def _run_manifest_of(self, user: str, server: str) -> dict[str, Any] | None:
        """The run manifest of ``user``'s running ``server``, if it is running."""
        machines = await self.runner.run(self.ledger.live_machines, user)
        machine = next((m for m in machines if m.server_name == server), None)
        if machine is None:
            return None
        run = await self.runner.run(self.ledger.run_manifest, machine.id)
        return None if run is None else run.manifest

    async def force_release(self, machine_id: str, reason: str, actor: Actor) -> dict[str, Any]:
        """Stop the server a live machine serves, cleanly, telling its user why."""
        machine = await self.runner.run(self.ledger.machine, machine_id)
        if machine is None or machine.state in TERMINAL:
            raise HTTPError(404, f"No live machine {machine_id!r}: it may have ended already.")
        user, server = machine.user_name, machine.server_name
        await self.runner.run(
            self.ledger.policy.note_force_release, machine_id, user, server, reason, actor
        )
        try:
            stopping = await self.hub.stop_server(user, server)
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        return {"machine": machine_id, "user": user, "server": server, "stopping": stopping}

    async def usage(self, period: Period) -> dict[str, Any]:
        """GPU-hours in ``period`` by day and model, user, cohort; and what runs now."""
        sums = await self.runner.run(self.ledger.usage_sums, period)
        cohorts = await self.runner.run(self.ledger.policy.cohort_names)
        members = {}
        if cohorts:
            try:
                groups = await self.hub.group_members()
            except HubUnavailable as e:
                raise HTTPError(503, "The hub did not answer; try again.") from e
            members = {name: groups.get(name, []) for name in cohorts}
        report = usage_report(period, sums.days, sums.users, sums.live, members)
        held = await self.runner.run(self.ledger.holdings, held_only=True)
        return views.usage_json(report, views.running(held))

    def period(self, since: str | None, until: str | None) -> Period:
        """The date range asked for, in the site's days; 400 with what to fix if unusable."""
        try:
            return Period.parse(since, until, today=datetime.now(self.timezone).date())
        except InvalidPeriod as e:
            raise HTTPError(400, str(e)) from e

    async def cohorts(self, names: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Every cohort (or those of ``names``), with its next session start in the site's
        time zone."""
        now = datetime.now(self.timezone)
        return [
            views.cohort_json(c, next_session_start(c, now))
            for c in await self.runner.run(self.ledger.policy.cohorts, names)
        ]

    async def devices_of(self, machines: Iterable[Machine]) -> dict[str, DeviceRecord]:
        """The devices the machines hold, by block id."""
        held = {block for machine in machines for block in machine.block_ids}
        return {d.block_id: d for d in await self.runner.run(self.ledger.devices, held)}


class PortalHandler(HubOAuthenticated, RequestHandler):
    """Base of every page and call: who is asking, and may they."""

    @property
    def portal(self) -> Portal:
        portal: Portal = self.settings["portal"]
        return portal

    @property
    def user(self) -> dict[str, Any]:
        """The logged-in user's model; 403 for a request that is not authenticated."""
        model: dict[str, Any] | None = self.current_user
        if model is None:
            raise HTTPError(403, "Log in to the hub first.")
        return model

    @property
    def is_admin(self) -> bool:
        model = self.current_user
        return bool(model and self.hub_auth.check_scopes([ADMIN_SCOPE], model))

    def require_admin(self) -> None:
        self.user  # noqa: B018 (403 before anything else for an anonymous request)
        if not self.is_admin:
            raise HTTPError(403, "Only the GPU pool's admins may do this.")

    def staffs(self, cohort: str) -> bool:
        """Whether the caller manages ``cohort``: its staff, or an admin."""
        model = self.current_user
        required = [f"{STAFF_SCOPE}!group={cohort}"]
        return bool(model and (self.is_admin or self.hub_auth.check_scopes(required, model)))

    @property
    def is_staff(self) -> bool:
        """Whether the caller manages some cohort."""
        model = self.current_user
        held = model.get("scopes", []) if model else []
        return self.is_admin or any(s.partition("!")[0] == STAFF_SCOPE for s in held)

    def require_staff(self, cohort: str | None = None) -> None:
        """403 unless the caller manages ``cohort`` (with None: some cohort)."""
        self.user  # noqa: B018
        if not (self.is_staff if cohort is None else self.staffs(cohort)):
            whose = "a cohort's" if cohort is None else f"{cohort}'s"
            raise HTTPError(403, f"Only the GPU pool's admins and {whose} staff may do this.")

    async def groups(self) -> list[str]:
        """The caller's hub groups: from their model, or (for a token that may not read
        them, such as a notebook's) from the hub, so their cohorts' quotas always apply."""
        user = self.user
        if "groups" in user:
            return list(user["groups"])
        try:
            groups = await self.portal.hub.user_groups(user["name"])
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        return groups or []

    @property
    def actor(self) -> Actor:
        return Actor(self.user["name"], self.request.remote_ip or "")

    async def ledger(self, func: Callable[..., T], *args: Any) -> T:
        return await self.portal.runner.run(func, *args)

    def error_message(self, status_code: int, kwargs: dict[str, Any]) -> str:
        """What a person reads of an error: ours as raised; a 5xx's details stay in the log."""
        exc_info = kwargs.get("exc_info")
        if exc_info and isinstance(exc_info[1], HTTPError) and exc_info[1].log_message:
            return str(exc_info[1].log_message)
        if status_code >= 500:
            return "The portal failed; the admins will find why in its log."
        return self._reason

    async def check_group_exists(self, group: str) -> None:
        """Cohorts and owners are hub groups: naming one that does not exist is a typing slip."""
        try:
            exists = await self.portal.hub.group_exists(group)
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        if not exists:
            raise HTTPError(400, f"No group {group!r} in the hub: create it there first.")


class ApiHandler(PortalHandler):
    """JSON in and out; errors as ``{"status": ..., "message": ...}``."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish({"status": status_code, "message": self.error_message(status_code, kwargs)})

    def json_body(self) -> object:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise HTTPError(400, "The body is not JSON.") from None

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))


class PageHandler(PortalHandler):
    """Pages in the look of the hub's own (they extend JupyterHub's page.html)."""

    def render_page(self, template: str, **context: Any) -> None:
        user = self.user
        env = self.settings["jinja"]
        html = env.get_template(template).render(
            **self._page_context(user),
            **context,
        )
        self.finish(html)

    def _page_context(self, user: dict[str, Any]) -> dict[str, Any]:
        return {
            "base_url": "/hub/",
            "prefix": "/",
            "static_url": _hub_static_url,
            "user": _PageUser(user["name"]),
            "no_spawner_check": True,
            "services": [],
            "parsed_scopes": {},
            "admin_access": False,
            "xsrf_token": self.xsrf_token.decode(),
            "xsrf_form_html": self.xsrf_form_html,
            "login_url": "/hub/login",
            "logout_url": "/hub/logout",
            "portal_url": self.portal.prefix,
            "per_page": views.PAGE_ROWS,
            "is_admin": self.is_admin,
            "is_staff": self.is_staff,
            "announcement": None,
            "version_hash": "",
        }

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        env = self.settings["jinja"]
        self.finish(
            env.get_template("portal_error.html").render(
                status=status_code,
                phrase=HTTPStatus(status_code).phrase,
                message=self.error_message(status_code, kwargs),
                portal_url=self.portal.prefix,
            )
        )


@dataclass(frozen=True)
class _PageUser:
    """What JupyterHub's page.html reads of a user."""

    name: str

    @property
    def json_escaped_name(self) -> str:
        # page.html puts it between quotes of its own, as JupyterHub's User does.
        return json.dumps(self.name)[1:-1]


def _hub_static_url(path: str, include_version: bool = True) -> str:
    del include_version
    return url_path_join("/hub/static/", path)


class FormPage(PageHandler):
    """A page with forms: GET shows it; POST acts, then shows it again, or shows why not
    (a 400 with the person's input kept). Admins only unless ``admins_only`` is False."""

    path = ""  # below the portal's prefix, where the page is
    admins_only = True

    async def act(self, form: dict[str, str]) -> None:
        raise NotImplementedError

    async def render_form(self, **context: Any) -> None:
        raise NotImplementedError

    @authenticated
    async def get(self) -> None:
        if self.admins_only:
            self.require_admin()
        await self.render_form()

    @authenticated
    async def post(self) -> None:
        if self.admins_only:
            self.require_admin()
        form = {name: values[0].decode() for name, values in self.request.body_arguments.items()}
        try:
            await self.act(form)
        except InvalidQuota as e:
            await self._refused(str(e), form)
            return
        except HTTPError as e:
            if e.status_code != 400:
                raise
            await self._refused(str(e.log_message), form)
            return
        self.redirect(url_path_join(self.portal.prefix, self.path))

    async def _refused(self, why: str, form: dict[str, str]) -> None:
        self.set_status(400)
        await self.render_form(error=why, form=form)


# -- everyone --------------------------------------------------------------------


class MyMachinePage(PageHandler):
    """My servers, quota and cohorts; a running server's GPUs added or given back in place."""

    @authenticated
    async def get(self) -> None:
        await self._show()

    @authenticated
    async def post(self) -> None:
        form = {name: values[0].decode() for name, values in self.request.body_arguments.items()}
        name, groups = self.user["name"], frozenset(await self.groups())
        server = form.get("server", "")
        try:
            if form.get("action") == "grow":
                text = form.get("count", "1").strip()
                count = views.grow_count(
                    {"count": int(text) if text.isascii() and text.isdigit() else text}
                )
                change = await self.portal.resize(lambda r: r.grow(name, groups, server, count))
            elif form.get("action") == "shrink":
                gpu = form.get("gpu", "")
                change = await self.portal.resize(lambda r: r.shrink(name, server, [gpu]))
            elif form.get("action") == "launch-again":
                machine, new = form.get("machine", ""), form.get("name", "").strip()
                started = await self.portal.launch_again(name, machine, new or None)
                server = started["server"]
                shown = f"Server {server!r}" if server else "Your default server"
                change = {"next_step": f"{shown} is starting as that run did."}
            else:
                raise HTTPError(400, "Choose to add a GPU, give one back or launch a run again.")
        except views.InvalidGrow as e:
            self.set_status(400)
            await self._show(error=str(e))
        except HTTPError as e:
            if e.status_code >= 500 and e.status_code != 503:
                raise
            self.set_status(e.status_code)
            await self._show(error=e.log_message)
        else:
            await self._show(changed=change["next_step"])

    async def _show(self, **context: Any) -> None:
        mine = await self.portal.my_machine(self.user["name"], await self.groups())
        self.render_page("my_machine.html", mine=mine, **context)


class MeApi(ApiHandler):
    async def get(self) -> None:
        self.write_json(await self.portal.my_machine(self.user["name"], await self.groups()))


class MyGpusApi(ApiHandler):
    """A running server's GPUs, changed in place: ``api/me/server/gpus`` for the default
    server, ``api/me/servers/NAME/gpus`` for a named one. POST ``{"count": N}`` adds N
    GPUs of the server's model; GET reads them."""

    async def get(self, server: str) -> None:
        """The server's machine and its kernels' environment, as they are now."""
        name, server = self.user["name"], unquote(server)
        self.write_json(await self.portal.resize(lambda r: r.running_machine(name, server)))

    async def post(self, server: str) -> None:
        try:
            count = views.grow_count(self.json_body())
        except views.InvalidGrow as e:
            raise HTTPError(400, str(e)) from None
        name, groups = self.user["name"], frozenset(await self.groups())
        server = unquote(server)
        self.write_json(
            await self.portal.resize(lambda resizer: resizer.grow(name, groups, server, count))
        )


class MyGpuApi(ApiHandler):
    """One GPU of a running server: DELETE ``api/me/server/gpus/ID`` gives it back."""

    async def delete(self, server: str, gpu: str) -> None:
        name, server, gpu = self.user["name"], unquote(server), unquote(gpu)
        self.write_json(
            await self.portal.resize(lambda resizer: resizer.shrink(name, server, [gpu]))
        )


# -- admins ---------------------------------------------------------------------


class QuotasApi(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        rules = await self.ledger(self.portal.ledger.policy.quota_rules)
        self.write_json({"rules": [views.rule_json(rule) for rule in rules]})


class QuotaRuleApi(ApiHandler):
    """One level's rule: ``api/quotas/site``, ``.../cohort/NAME``, ``.../user/NAME``."""

    async def get(self, level: Level, subject: str) -> None:
        self.require_admin()
        self.write_json(views.rule_json(await self._stored(level, unquote(subject))))

    async def put(self, level: Level, subject: str) -> None:
        self.require_admin()
        subject = unquote(subject)
        try:
            rule = views.rule_from_json(level, subject, self.json_body(), self.portal.model_ids)
        except InvalidQuota as e:
            raise HTTPError(400, str(e)) from None
        if level == "cohort":
            await self.check_group_exists(subject)
        await self.ledger(self.portal.ledger.policy.set_quota_rule, rule, self.actor)
        self.write_json(views.rule_json(rule))

    async def delete(self, level: Level, subject: str) -> None:
        self.require_admin()
        subject = unquote(subject)
        removed = await self.ledger(
            self.portal.ledger.policy.delete_quota_rule, level, subject, self.actor
        )
        if not removed:
            raise HTTPError(404, f"No {level} quota for {subject!r} to delete.")
        self.set_status(204)
        self.finish()

    async def _stored(self, level: Level, subject: str) -> QuotaRule:
        rules = await self.ledger(self.portal.ledger.policy.quota_rules)
        found = next((r for r in rules if (r.level, r.subject) == (level, subject)), None)
        if found is None:
            raise HTTPError(404, f"No {level} quota for {subject!r}.")
        return found


class UserQuotaApi(ApiHandler):
    """Any user's effective quota, each limit with where it comes from."""

    async def get(self, name: str) -> None:
        self.require_admin()
        name = unquote(name)
        try:
            groups = await self.portal.hub.user_groups(name)
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        if groups is None:
            raise HTTPError(404, f"No user {name!r} in the hub.")
        quota = await self.portal.quota_of(name, groups)
        self.write_json({"name": name, "groups": sorted(groups), "quota": views.quota_json(quota)})


class AuditApi(ApiHandler):
    """The audit log, newest first; ``?format=csv`` exports all of it, oldest first."""

    async def get(self) -> None:
        self.require_admin()
        if self.get_argument("format", "json") == "csv":
            entries = await self.ledger(self.portal.ledger.policy.audit_log, None, True)
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="audit-log.csv"')
            self.finish(_csv([views.audit_json(e) for e in entries], views.AUDIT_COLUMNS))
            return
        entries = await self.ledger(self.portal.ledger.policy.audit_log, AUDIT_PAGE_ROWS)
        self.write_json({"entries": [views.audit_json(e) for e in entries]})


class InventoryApi(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        self.write_json(views.inventory(await self.ledger(self.portal.ledger.holdings)))


class LaunchAgainApi(ApiHandler):
    """``POST api/runs/MACHINE/launch`` with ``{"name": "server"}`` (optional: the run's
    own server): a new server on the run's stack lock and GPU model and count."""

    async def post(self, machine_id: str) -> None:
        body = self.json_body()
        if body is None:
            body = {}
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(body, dict) or (name is not None and not isinstance(name, str)):
            raise HTTPError(400, 'Send {"name": "a server name"}, or nothing for the run\'s own.')
        result = await self.portal.launch_again(self.user["name"], unquote(machine_id), name)
        self.write_json(result, status=202)


class RunManifestApi(ApiHandler):
    """``GET api/runs/MACHINE``: what that machine's server ran on. Its user's and the
    admins' alone: anyone else gets the 404 a machine that never was gets."""

    async def get(self, machine_id: str) -> None:
        run = await self.ledger(self.portal.ledger.run_manifest, unquote(machine_id))
        if run is None or (run.user_name != self.user["name"] and not self.is_admin):
            raise HTTPError(404, "No run of yours has that machine id.")
        self.write_json(views.run_json(run))


class KitsMixin(PortalHandler):
    """What the submission and leaderboard calls and page share."""

    def kit(self, kit_id: str) -> Kit:
        kit = self.portal.catalog.kit(unquote(kit_id))
        if kit is None:
            known = ", ".join(k.id for k in self.portal.catalog.kits) or "none"
            raise HTTPError(404, f"No starter kit {unquote(kit_id)!r}; the kits: {known}.")
        return kit

    async def standings(self, kit: Kit, cohort: str | None, by: str) -> list[Standing]:
        """The kit's board for ``cohort`` (None: the open one): a cohort's is its members',
        its staff's and the admins' to see; the open board everyone's."""
        if by not in BY:
            raise HTTPError(400, "by must be user or team.")
        if cohort is not None and cohort not in await self.groups() and not self.staffs(cohort):
            raise HTTPError(403, f"Only cohort {cohort}'s members and staff see its leaderboard.")
        board = await self.ledger(self.portal.ledger.submissions.of_board, kit.id, cohort)
        return standings(board, by)


class KitSubmissionsApi(ApiHandler, KitsMixin):
    """``POST api/kits/KIT/submissions``: score a model on the kit's blind data, and put
    it on the leaderboard of the submitter's cohort."""

    async def post(self, kit_id: str) -> None:
        kit = self.kit(kit_id)
        try:
            ask = views.submission_from_json(self.json_body())
        except InvalidCohort as e:
            raise HTTPError(400, str(e)) from None
        groups = await self.groups()
        result = await self.portal.submit(self.user["name"], groups, kit, ask)
        self.write_json(result, status=201)


class LeaderboardApi(ApiHandler, KitsMixin):
    """``GET api/kits/KIT/leaderboard?cohort=NAME&by=user|team``: each one's best score."""

    async def get(self, kit_id: str) -> None:
        kit = self.kit(kit_id)
        cohort = self.get_argument("cohort", None) or None
        by = self.get_argument("by", "user")
        ranked = await self.standings(kit, cohort, by)
        self.write_json(
            {
                "kit": kit.id,
                "cohort": cohort,
                "by": by,
                "standings": [views.standing_json(s) for s in ranked],
            }
        )


class LeaderboardsPage(PageHandler, KitsMixin):
    """``leaderboards?kit=KIT&cohort=NAME&by=user|team``: a kit's board, for people."""

    @authenticated
    async def get(self) -> None:
        kits = self.portal.catalog.kits
        if not kits:
            raise HTTPError(404, "This hub offers no starter kits, so it has no leaderboards.")
        kit = self.kit(self.get_argument("kit", kits[0].id))
        groups = await self.groups()
        cohorts = await self.ledger(self.portal.ledger.policy.cohort_names)
        boards = [c for c in cohorts if c in groups or self.staffs(c)]
        cohort = self.get_argument("cohort", boards[0] if boards else "") or None
        by = self.get_argument("by", "user")
        ranked = await self.standings(kit, cohort, by)
        self.render_page(
            "leaderboards.html",
            kits=kits,
            kit=kit,
            boards=boards,
            cohort=cohort,
            by=by,
            standings=[views.standing_json(s) for s in ranked],
        )


class RunPage(PageHandler):
    """``runs/MACHINE``: a run's manifest, for its user and the admins (404 to others)."""

    @authenticated
    async def get(self, machine_id: str) -> None:
        run = await self.ledger(self.portal.ledger.run_manifest, unquote(machine_id))
        if run is None or (run.user_name != self.user["name"] and not self.is_admin):
            raise HTTPError(404, "No run of yours has that machine id.")
        self.render_page("run.html", run=views.run_json(run))


class ReleaseMachineApi(ApiHandler):
    """``POST api/machines/ID/release`` with ``{"reason": "..."}``: stop its server."""

    async def post(self, machine_id: str) -> None:
        self.require_admin()
        body = self.json_body()
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MOST_REASON:
            raise HTTPError(
                400, f"Say why, for the user: a reason of 1 to {MOST_REASON} characters."
            )
        result = await self.portal.force_release(unquote(machine_id), reason.strip(), self.actor)
        self.write_json(result, status=202)


class InventoryPage(FormPage):
    path = "inventory"

    async def act(self, form: dict[str, str]) -> None:
        reason = form.get("reason", "").strip()
        if not reason or len(reason) > MOST_REASON:
            raise HTTPError(400, f"Say why, for the user: 1 to {MOST_REASON} characters.")
        await self.portal.force_release(form.get("machine", ""), reason, self.actor)

    async def render_form(self, **context: Any) -> None:
        view = views.inventory(await self.ledger(self.portal.ledger.holdings))
        view["devices"], paging = views.page_of(view["devices"], self.get_argument("page", None))
        self.render_page("inventory.html", inventory=view, paging=paging, **context)


class ColocatedMixin(PortalHandler):
    """Registering co-located GPUs (admins), and lending them (admins and their owners)."""

    async def colocated_view(self) -> list[dict[str, Any]]:
        holdings = await self.ledger(self.portal.ledger.holdings)
        registrations = await self.ledger(self.portal.ledger.policy.registrations)
        groups = None if self.is_admin else list(self.user.get("groups", []))
        return views.colocated(holdings, registrations, groups)

    async def register(self, block: str, owner_group: str) -> Registration:
        self.require_admin()
        await self.check_group_exists(owner_group)
        try:
            return await self.ledger(
                self.portal.ledger.policy.register_device, block, owner_group, self.actor
            )
        except UnknownDevices:
            raise HTTPError(404, f"No device {block!r} has been seen in the fabric.") from None

    async def unregister(self, block: str) -> bool:
        """Give a registered device back to its catalog owner, or to the pool."""
        self.require_admin()
        holdings = await self.ledger(self.portal.ledger.holdings)
        chassis = next((h.device.chassis for h in holdings if h.device.block_id == block), "")
        owner = self.portal.catalog.owner_of_chassis(chassis)
        return await self.ledger(
            self.portal.ledger.policy.unregister_device, block, self.actor, owner
        )

    async def lend(self, block: str, body: object) -> Registration:
        """Lend (or, with body None, take back) a device the caller's group owns."""
        registration = (await self.ledger(self.portal.ledger.policy.registrations)).get(block)
        if registration is None:
            raise HTTPError(404, f"{block!r} is not a registered co-located device.")
        if not self.is_admin and registration.owner_group not in self.user.get("groups", []):
            raise HTTPError(403, f"Only {registration.owner_group}'s members may lend {block}.")
        if body is None:
            lent = replace(registration, lent_to_user=None, lent_to_group=None, lent_until=None)
        else:
            try:
                lent = views.loan_from_json(registration, body, datetime.now(self.portal.timezone))
            except InvalidQuota as e:
                raise HTTPError(400, str(e)) from None
            await self._check_borrower_exists(lent)
        await self.ledger(self.portal.ledger.policy.lend, lent, self.actor)
        return lent

    async def _check_borrower_exists(self, lent: Registration) -> None:
        try:
            if lent.lent_to_group is not None:
                found = await self.portal.hub.group_exists(lent.lent_to_group)
            else:
                found = await self.portal.hub.user_groups(lent.lent_to_user or "") is not None
        except HubUnavailable as e:
            raise HTTPError(503, "The hub did not answer; try again.") from e
        if not found:
            who = lent.lent_to_group or lent.lent_to_user
            raise HTTPError(400, f"No user or group {who!r} in the hub to lend to.")


class ColocatedApi(ApiHandler, ColocatedMixin):
    async def get(self) -> None:
        self.user  # noqa: B018 (403 for anonymous)
        self.write_json({"devices": await self.colocated_view()})


class DeviceOwnerApi(ApiHandler, ColocatedMixin):
    """``api/devices/BLOCK/owner``: PUT ``{"owner_group": NAME}`` registers, DELETE gives back."""

    async def put(self, block: str) -> None:
        self.require_admin()
        body = self.json_body()
        group = body.get("owner_group") if isinstance(body, dict) else None
        if not isinstance(group, str) or not group:
            raise HTTPError(400, 'Name the owner: {"owner_group": "vision-lab"}.')
        registration = await self.register(unquote(block), group)
        self.write_json({"id": registration.block_id, "owner_group": registration.owner_group})

    async def delete(self, block: str) -> None:
        self.require_admin()
        block = unquote(block)
        if not await self.unregister(block):
            raise HTTPError(404, f"{block!r} is not a registered co-located device.")
        self.set_status(204)
        self.finish()


class DeviceLoanApi(ApiHandler, ColocatedMixin):
    """``api/devices/BLOCK/loan``: PUT lends (``{"user"|"group": NAME, "until": DATE}``), DELETE
    takes back. For admins and the owner group's members."""

    async def put(self, block: str) -> None:
        lent = await self.lend(unquote(block), self.json_body())
        self.write_json({"id": lent.block_id, "loan": views.loan_json(lent)})

    async def delete(self, block: str) -> None:
        await self.lend(unquote(block), None)
        self.set_status(204)
        self.finish()


class ColocatedPage(FormPage, ColocatedMixin):
    path = "colocated"
    admins_only = False  # owners lend their own; each action checks who may

    async def act(self, form: dict[str, str]) -> None:
        action, block = form.get("action", ""), form.get("block", "")
        if action == "register":
            await self.register(block, form.get("owner_group", "").strip())
        elif action == "unregister":
            await self.unregister(block)
        elif action == "lend":
            kind = "group" if form.get("to_kind") == "group" else "user"
            await self.lend(block, {kind: form.get("to", "").strip(), "until": form.get("until")})
        elif action == "take_back":
            await self.lend(block, None)
        else:
            raise HTTPError(400, "Choose register, unregister, lend or take back.")

    async def render_form(self, **context: Any) -> None:
        devices = await self.colocated_view()
        self.render_page("colocated.html", devices=devices, today=date.today(), **context)


class CohortsMixin(PortalHandler):
    """Cohorts: admins manage all of them; course staff their own, but not its reservation."""

    async def my_cohorts(self) -> list[dict[str, Any]]:
        return [c for c in await self.portal.cohorts() if self.staffs(c["name"])]

    async def set_cohort(self, name: str, body: object) -> Cohort:
        self.require_staff(name)
        if not self.is_admin:
            stored = await self.ledger(self.portal.ledger.policy.cohorts, [name])
            try:
                body = views.staff_change(body, stored[0] if stored else None)
            except views.NotStaffsToChange as e:
                raise HTTPError(403, str(e)) from None
        try:
            cohort = views.cohort_from_json(name, body, self.portal.catalog)
        except InvalidQuota as e:
            raise HTTPError(400, str(e)) from None
        await self.check_group_exists(cohort.name)
        await self.ledger(self.portal.ledger.policy.set_cohort, cohort, self.actor)
        return cohort


class CohortsApi(ApiHandler, CohortsMixin):
    async def get(self) -> None:
        self.require_staff()
        self.write_json({"cohorts": await self.my_cohorts()})


class CohortApi(ApiHandler, CohortsMixin):
    """One cohort: ``api/cohorts/NAME``, NAME its hub group."""

    async def get(self, name: str) -> None:
        name = unquote(name)
        self.require_staff(name)
        found = await self.portal.cohorts([name])
        if not found:
            raise HTTPError(404, f"No cohort {name!r}.")
        self.write_json(found[0])

    async def put(self, name: str) -> None:
        cohort = await self.set_cohort(unquote(name), self.json_body())
        self.write_json(views.cohort_json(cohort))

    async def delete(self, name: str) -> None:
        self.require_admin()
        name = unquote(name)
        if not await self.ledger(self.portal.ledger.policy.delete_cohort, name, self.actor):
            raise HTTPError(404, f"No cohort {name!r} to delete.")
        self.set_status(204)
        self.finish()


class CohortsPage(FormPage, CohortsMixin):
    path = "cohorts"
    admins_only = False  # course staff manage their own; each action checks who may

    async def render_form(self, **context: Any) -> None:
        self.require_staff()
        self.render_page(
            "cohorts.html",
            cohorts=await self.my_cohorts(),
            models=self.portal.model_ids,
            timezone=str(self.portal.timezone),
            **context,
        )

    async def act(self, form: dict[str, str]) -> None:
        name = form.get("name", "").strip()
        if form.get("action") == "delete":
            self.require_admin()
            await self.ledger(self.portal.ledger.policy.delete_cohort, name, self.actor)
            return
        await self.set_cohort(name, views.cohort_body_from_form(form))


class QuotasPage(FormPage):
    path = "quotas"

    async def act(self, form: dict[str, str]) -> None:
        policy = self.portal.ledger.policy
        if form.get("action") == "delete":  # the row's button: "level:subject"
            level, _, subject = form.get("rule", "").partition(":")
            views.check_subject(level, subject)
            await self.ledger(policy.delete_quota_rule, level, subject, self.actor)
            return
        level, subject = form.get("level", ""), form.get("subject", "")
        rule = views.rule_from_form(level, subject, form, self.portal.model_ids)
        if rule.level == "cohort":
            await self.check_group_exists(rule.subject)
        await self.ledger(policy.set_quota_rule, rule, self.actor)

    async def render_form(self, **context: Any) -> None:
        rules = await self.ledger(self.portal.ledger.policy.quota_rules)
        shown, paging = views.page_of(rules, self.get_argument("page", None))
        self.render_page(
            "quotas.html",
            rules=[views.rule_json(rule) for rule in shown],
            paging=paging,
            models=self.portal.model_ids,
            limits=views.LIMITS,
            **context,
        )


class UsageApi(ApiHandler):
    """GPU-hours over ``?since=&until=`` (days, both included; the last 30 by default);
    ``?format=csv`` exports one row per day, user and model."""

    async def get(self) -> None:
        self.require_admin()
        period = self.portal.period(
            self.get_argument("since", None), self.get_argument("until", None)
        )
        if self.get_argument("format", "json") == "csv":
            uses = await self.ledger(self.portal.ledger.day_uses, period)
            name = f"gpu-usage-{period.first}-{period.last}.csv"
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
            self.finish(_csv(views.usage_rows(uses), views.USAGE_COLUMNS))
            return
        self.write_json(await self.portal.usage(period))


class UsagePage(PageHandler):
    @authenticated
    async def get(self) -> None:
        self.require_admin()
        since, until = self.get_argument("since", None), self.get_argument("until", None)
        error = None
        try:
            period = self.portal.period(since or None, until or None)
        except HTTPError as e:  # the page shows the default range, and what to fix
            self.set_status(400)
            period, error = self.portal.period(None, None), e.log_message
        usage = await self.portal.usage(period)
        self.render_page("usage.html", usage=usage, error=error, plotly_version=plotly.__version__)


class AuditPage(PageHandler):
    @authenticated
    async def get(self) -> None:
        self.require_admin()
        entries = await self.ledger(self.portal.ledger.policy.audit_log, AUDIT_PAGE_ROWS)
        self.render_page("audit.html", entries=[views.audit_json(e) for e in entries])


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return out.getvalue()


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: no stored name turns into a formula."""
    text = json.dumps(value) if isinstance(value, dict) else value
    if isinstance(text, str) and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


ROUTES: list[tuple[str, type[RequestHandler]]] = [
    ("", MyMachinePage),
    ("quotas", QuotasPage),
    ("audit", AuditPage),
    ("usage", UsagePage),
    ("cohorts", CohortsPage),
    ("inventory", InventoryPage),
    ("colocated", ColocatedPage),
    ("leaderboards", LeaderboardsPage),
    (r"runs/([^/]+)", RunPage),
    ("api/me", MeApi),
    (r"api/me/server()/gpus", MyGpusApi),
    (r"api/me/servers/([^/]+)/gpus", MyGpusApi),
    (r"api/me/server()/gpus/([^/]+)", MyGpuApi),
    (r"api/me/servers/([^/]+)/gpus/([^/]+)", MyGpuApi),
    ("api/quotas", QuotasApi),
    (r"api/quotas/(site)()", QuotaRuleApi),
    (r"api/quotas/(cohort|user)/([^/]+)", QuotaRuleApi),
    (r"api/users/([^/]+)/quota", UserQuotaApi),
    ("api/audit", AuditApi),
    ("api/usage", UsageApi),
    ("api/inventory", InventoryApi),
    ("api/colocated", ColocatedApi),
    (r"api/devices/([^/]+)/owner", DeviceOwnerApi),
    (r"api/devices/([^/]+)/loan", DeviceLoanApi),
    (r"api/machines/([^/]+)/release", ReleaseMachineApi),
    (r"api/runs/([^/]+)", RunManifestApi),
    (r"api/runs/([^/]+)/launch", LaunchAgainApi),
    (r"api/kits/([^/]+)/submissions", KitSubmissionsApi),
    (r"api/kits/([^/]+)/leaderboard", LeaderboardApi),
    ("api/cohorts", CohortsApi),
    (r"api/cohorts/([^/]+)", CohortApi),
]
