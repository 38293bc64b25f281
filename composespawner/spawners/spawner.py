"""JupyterHub glue: the spawn form, start/stop/poll, state and progress.

:class:`ComposeMixin` adds composition to any JupyterHub spawner that knows how
to launch a notebook (the *launcher*): a machine is composed before the
launcher's ``start`` and released on every way a server ends. Concrete classes
pair it with a launcher: :class:`ComposeSpawner` runs the notebook as a local
process (the embedded default); a Kubernetes launcher plugs in the same way.

This module holds no allocation logic: it parses and renders, then asks the
:class:`~composespawner.services.composer.Composer` (one per hub process) to do the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from jupyterhub import orm
from jupyterhub.spawner import Spawner
from jupyterhub.utils import maybe_future
from sqlalchemy import event
from tornado.log import app_log
from traitlets import Float, Unicode, default

from composespawner.domain.catalog import Catalog, Kit, Stack
from composespawner.domain.colocation import Registration
from composespawner.domain.machine import ComposedMachine, machine_env
from composespawner.domain.manifest import run_manifest
from composespawner.domain.request import (
    MAX_OPTIONS_BYTES,
    MachineRequest,
    RequestError,
    check_server_name,
    check_size,
    options_size,
    parse_form,
    parse_options,
    settle_stack,
)
from composespawner.fabric.base import FabricError
from composespawner.launchers.base import KitNotDelivered, Launcher
from composespawner.launchers.kits import HOME_FOLDER
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.refusal import ComposeRefusal
from composespawner.ledger import SchemaNotCurrent
from composespawner.services.admission import Admission
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.settings import ComposeSettings, shared_composer
from composespawner.spawners.form import render_form, render_unavailable

STATE_VERSION = 1


class ConfirmLinkChoices(Exception):
    """A spawn link's options were checked; the form shows them for the user to submit.

    Raised from options_from_query: the hub then serves the form (status 200, and
    no error box, since ``jupyterhub_message`` is empty) instead of spawning.
    """

    jupyterhub_message = ""


def _refusal(error: RequestError) -> ComposeRefusal:
    return ComposeRefusal(str(error), reason="invalid-options", status_code=error.status)


@event.listens_for(orm.Spawner.user_options, "set", retval=True)
def _keep_oversized_options_out(
    target: orm.Spawner, value: Any, previous: Any, initiator: Any
) -> Any:
    """JupyterHub writes requested ``user_options`` to its database before start().

    Oversized ones would stay there (a 10 MB body grew the database by as
    much) and be offered to the next start: what was stored stays instead.
    start() refuses the request itself (``Spawner.user_options`` keeps it).
    """
    del initiator
    size = 0 if value is None else options_size(value)
    if size <= MAX_OPTIONS_BYTES:
        return value
    app_log.warning("Not storing %d bytes of user_options for server %r", size, target.name)
    return previous if isinstance(previous, dict) else None


class ComposeMixin(ComposeSettings, Launcher, Spawner):
    """Compose a machine over the fabric around whatever launches the notebook.

    Its knobs (ledger, fabric, catalog, quota) are :class:`ComposeSettings`'s.
    """

    form_fabric_timeout = Float(
        1.5,
        config=True,
        help="""Seconds the spawn form waits for a fresh fabric inventory. A slower read
        goes on in the background while the form shows the last inventory with its age
        (or, with none read yet, says the fabric is not answering). Raise it only if
        your fabric's inventory read regularly takes longer.""",
    )

    portal_url = Unicode(
        "",
        config=True,
        help="""The GPU portal's address as notebooks reach it (the portal service's own
        url and prefix, e.g. ``http://127.0.0.1:8002/services/compose/``), given to them
        as $COMPOSE_PORTAL_URL for ``composespawner.client``. Empty: notebooks cannot
        use the client.""",
    )

    # Removals of refused servers' records, kept referenced until they finish.
    _removals: ClassVar[set[asyncio.Future[None]]] = set()

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return _options_read_at_start

    @default("options_form")
    def _default_options_form(self) -> Any:
        return ComposeMixin.render_options_form

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.machine: ComposedMachine | None = None
        self.kit: Kit | None = None  # the starter kit this start asked for
        self._events: list[dict[str, Any]] = []
        self._events_changed = asyncio.Event()
        self._starting = False
        self._composer: Composer | None = None
        # The options of the last start that composed a machine (kept in state):
        # what the form pre-selects and what a request without options reuses.
        self.accepted_options: dict[str, Any] = {}
        # Choices a spawn link asked for, checked, for the form that answers
        # that same request (JupyterHub sets ``handler`` for each form request).
        self._link_choices: tuple[Any, dict[str, Any]] | None = None
        # A hub record with no activity yet was created for this spawn: a
        # refusal removes it, so it counts toward no named-server limit.
        orm_spawner = self.orm_spawner
        self._record_is_new = orm_spawner is not None and orm_spawner.last_activity is None
        # What the running server runs on (composespawner.domain.manifest), while it runs.
        self.run_manifest: dict[str, Any] | None = None
        # start_timeout as configured, before a start that builds its stack adds to it.
        self._configured_start_timeout: float = self.start_timeout

    # -- the shared composer -------------------------------------------------

    @property
    def composer(self) -> Composer:
        # Looked up once per spawner: the shared composer's key reads every setting.
        if self._composer is None:
            self._composer = self._shared_composer()
        return self._composer

    def _shared_composer(self) -> Composer:
        try:
            return shared_composer(self, self.log)
        except SchemaNotCurrent as e:
            self.log.error("The ledger cannot be used: %s", e)
            raise ComposeRefusal(
                "The GPU pool is not available right now: it is being upgraded."
                " Try again later, and tell the admins if it persists.",
                reason="ledger-schema",
                status_code=503,
            ) from e

    @property
    def catalog(self) -> Catalog:
        return self.composer.catalog

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(g.name for g in self.user.groups)

    # -- the form --------------------------------------------------------------

    async def render_options_form(self) -> str:
        try:
            offer = await self.composer.offer(
                self.user.name, self.groups, within=self.form_fabric_timeout
            )
        except Exception:
            self.log.exception("Could not read the fabric for %s's spawn form", self.user.name)
            return render_unavailable()
        link_choices = self._choices_from_link()
        previous = link_choices or self.accepted_options
        return render_form(self.catalog, offer, previous, from_link=link_choices is not None)

    def _choices_from_link(self) -> dict[str, Any] | None:
        link, self._link_choices = self._link_choices, None
        if link is None or link[0] is not self.handler:
            return None  # none, or a link's whose form was never shown
        return link[1]

    async def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        try:
            return await self._checked_form(formdata)
        except ComposeRefusal:
            self._forget_refused()
            raise

    async def options_from_query(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """A spawn link's options fill in the form; only the form's POST spawns.

        A GET can come from any page on the web (a link, an image, a script), and
        the hub's cookies go with it, so it must not claim hardware. The form's
        POST carries the hub's XSRF token, which no other site can read.
        """
        self._link_choices = (self.handler, await self._checked_form(query))
        raise ConfirmLinkChoices(f"{self._log_name}: spawn link shown as a form to confirm")

    async def _checked_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        try:
            request = parse_form(formdata, self.catalog, await self._visible_model_ids())
        except RequestError as e:
            raise _refusal(e) from e
        return request.to_options()

    async def _visible_model_ids(
        self, registrations: Mapping[str, Registration] | None = None
    ) -> frozenset[str]:
        try:
            return await self.composer.pool.visible_models(
                self.user.name, self.groups, registrations
            )
        except FabricError as e:
            # Nothing is claimed before this read, so there is nothing to undo.
            self.log.warning("Fabric unreadable for %s's spawn: %s", self._log_name, e)
            raise ComposeRefusal(
                "The GPU fabric is not answering right now, so nothing was claimed."
                " Try again in a few minutes, and tell the admins if it persists.",
                reason="fabric",
                status_code=503,
            ) from e

    # -- start -----------------------------------------------------------------

    async def start(self) -> Any:
        self._events.clear()
        self._starting = True
        try:
            try:
                options = self._options_to_start()
                admitted = await self.composer.admission_for(self.user.name, self.groups)
                request = await self._parse_request(options, admitted)
                request = self._settled(request, admitted)
                self.stack = self.catalog.stack(request.stack) if request.stack else None
                self.kit = self.catalog.kit(request.kit) if request.kit else None
                if self.stack is not None:  # before anything is claimed
                    self.check_stack(self.stack)
                if self.kit is not None:
                    self.check_kit(self.kit)
                self.machine = await self._compose(request, admitted)
            except ComposeRefusal:
                self._forget_refused()
                raise
            self.accepted_options = request.to_options()
            try:
                return await self._launch()
            except BaseException as e:
                await asyncio.shield(self._release(self.machine, f"launch failed: {e!r}", True))
                raise
        finally:
            self._starting = False
            self._notify()

    def _options_to_start(self) -> dict[str, Any]:
        """This start's options, their size and the server's name checked before anything
        is read for them. Without options of its own a start reuses the last accepted ones."""
        options = self.user_options or self.accepted_options
        try:
            check_server_name(self.name)
            check_size(options)
        except RequestError as e:
            raise _refusal(e) from e
        return options

    async def _parse_request(self, options: dict[str, Any], admitted: Admission) -> MachineRequest:
        # The admission read brought the portal's registrations: not read again.
        visible = await self._visible_model_ids(admitted.registrations)
        try:
            return parse_options(options, self.catalog, visible)
        except RequestError as e:
            raise _refusal(e) from e

    def _settled(self, request: MachineRequest, admitted: Admission) -> MachineRequest:
        try:
            return settle_stack(request, self.catalog, admitted.stacks)
        except RequestError as e:
            raise _refusal(e) from e

    def _forget_refused(self) -> None:
        """Leave nothing of a refused request: its options, or a record made for it.

        JupyterHub stored the options before start() and would pass them to
        the next start without options, and to the form.
        """
        self.user_options = dict(self.accepted_options)
        if self.orm_spawner is not None:
            self.orm_spawner.user_options = dict(self.accepted_options)
        if self.name and self._record_is_new:
            removal = asyncio.ensure_future(self._remove_record())
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)

    async def _remove_record(self) -> None:
        """Delete this named server's hub record once the hub has finished failing its spawn.

        As the hub's own DELETE with ``remove`` does it. The record counts
        toward ``named_server_limit_per_user`` however it ended.
        """
        spawn = self._spawn_future
        if spawn is not None:
            await asyncio.wait([spawn])
        user = self.user
        if user.spawners.get(self.name) is not self or self.active:
            return  # a newer request for this name took over
        try:
            await maybe_future(self.delete_forever())
            user.spawners.pop(self.name, None)
            user.db.delete(self.orm_spawner)
            user.db.commit()
        except Exception:
            self.log.exception("Could not remove the record of refused server %s", self._log_name)
            user.db.rollback()
            return
        self.log.info("Removed the record of %s: its first start was refused", self._log_name)

    async def _compose(self, request: MachineRequest, admitted: Admission) -> ComposedMachine:
        try:
            return await self.composer.compose(
                user=self.user.name,
                groups=self.groups,
                server=self.name,
                request=request,
                progress=self._progress,
                then=("launching", "starting notebook"),
                admitted=admitted,
            )
        except ComposeRefused as e:
            raise ComposeRefusal(str(e), reason="no-capacity", status_code=e.status) from e
        except ComposeFailed as e:
            raise ComposeRefusal(str(e), reason="fabric", status_code=503) from e

    def allow_time_for(self, options: dict[str, Any]) -> None:
        """Give a start that builds its stack's environment first the time to do it.

        Called before start() (JupyterHub reads ``start_timeout`` as it calls it),
        with the options not yet checked: start() checks them.
        """
        options = options if isinstance(options, dict) and options else self.accepted_options
        wanted = options.get("stack")
        kit = self.catalog.kit(options["kit"]) if isinstance(options.get("kit"), str) else None
        if not wanted and kit is not None:
            wanted = kit.stack
        if not wanted:
            stack = self.catalog.default_stack
        else:
            stack = self.catalog.stack(wanted) if isinstance(wanted, str) else None
        self.start_timeout = self._configured_start_timeout + self.extra_start_time(stack)

    def launch_progress(self, message: str, percent: int) -> None:
        del percent  # the message has it; the bar counts steps
        self._progress(message)

    async def _launch(self) -> Any:
        """Start the notebook on the composed machine (the ledger says ``launching``)."""
        assert self.machine is not None
        await self.prepare_launch()
        if self.kit is not None:
            await self._deliver_kit(self.kit)
        await self._write_run_manifest(self.machine)
        self._progress(f"starting notebook on {self.machine.host}")
        url = await super().start()
        try:
            await self.composer.record(
                self.machine.machine_id, "running", "notebook started", self.run_manifest
            )
        except ComposeRefused as e:
            raise ComposeRefusal(str(e), reason="machine-ended", status_code=e.status) from e
        return url

    async def _deliver_kit(self, kit: Kit) -> None:
        """Put the kit in the home; without it the server is still worth starting."""
        self._progress(f"putting the {kit.label} kit in ~/{HOME_FOLDER}/{kit.id}")
        try:
            await self.deliver_kit(kit)
        except KitNotDelivered as e:
            self.log.warning("%s: kit %s not merged: %s", self._log_name, kit.id, e)
            self._progress(
                f"the {kit.label} kit could not be put in your home ({e}); your server starts"
                " without it. Free some space or remove what is in its way, and start again."
            )

    async def _write_run_manifest(self, machine: ComposedMachine) -> None:
        """What this server runs on: for the notebook and this server's state (and the
        ledger, with the step into ``running``)."""
        manifest = run_manifest(
            user=self.user.name,
            server=self.name,
            options=self.accepted_options,
            stack=self.stack,
            variant=self.stack_variant,
            machine=machine,
            # What composespawner gives the notebook: not get_env(), which holds tokens
            # (and costs a storm's hub as much again as the rest of this).
            environment={**self.launcher_env(), **self._compose_env()},
            started_at=datetime.now(UTC),
        )
        await self.deliver_run_manifest(manifest)
        self.run_manifest = manifest

    # -- stop and poll: every way a server ends releases its machine -----------

    async def stop(self, now: bool = False) -> None:
        """Stop the notebook and give its machine back, waiting on the fabric only briefly.

        A healthy fabric confirms in a fraction of a second, so the stop ends with
        the devices free (and a hub shutting down leaves the fabric clean). After
        ``fabric_wait_timeout`` the release goes on in the background instead.
        """
        machine, self.machine = self.machine, None  # our poll() inside stop() must not release
        await super().stop(now=now)
        await self._release(machine, "server stopped")
        if machine is not None:
            await self.composer.wait_released(machine.machine_id, within=self.composer.fabric_wait)

    async def poll(self) -> int | None:
        machine = self.machine  # the launcher's poll clears our state when it finds an exit
        status: int | None = await super().poll()
        if status is not None:
            # The hub never calls stop() for a server poll() found dead.
            await self._notebook_gone(machine, status)
        return status

    async def notebook_exited(self, status: int | None) -> None:
        """The launcher saw the notebook exit: give the machine back now, not at the next poll."""
        await self._notebook_gone(self.machine, status)

    async def _notebook_gone(self, machine: ComposedMachine | None, status: int | None) -> None:
        # Both poll and the launcher may see the same exit: releasing is idempotent.
        # A stop clears the machine first; a start under way releases on its own failure.
        if machine is not None and not self._starting:
            await self._release(machine, f"notebook exited (status {status})")

    async def _release(
        self, machine: ComposedMachine | None, reason: str, failed: bool = False
    ) -> None:
        if machine is None:
            return
        if self.machine is machine:
            self.machine = None
        # The fabric may take long to confirm (timeouts and retries): nobody waits
        # for it. The devices stay held in the ledger until it does.
        try:
            await self.composer.release_in_background(
                machine.machine_id, reason=reason, failed=failed
            )
        except Exception:
            self.log.exception("Could not mark %s stopping; releasing anyway", machine.machine_id)
            self.composer.release_soon(machine.machine_id, reason=reason, failed=failed)

    # -- state ---------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.machine is not None:
            state["compose"] = {"version": STATE_VERSION, **self.machine.to_state()}
        if self.accepted_options:
            # Kept across stops (clear_state leaves it): the next start's defaults.
            state["compose_options"] = self.accepted_options
        if self.run_manifest is not None:
            state["run_manifest"] = self.run_manifest
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        compose = state.get("compose")
        if compose:
            # version 1 is the first; later versions must keep reading it.
            self.machine = ComposedMachine.from_state(compose)
        if isinstance(state.get("compose_options"), dict):
            self.accepted_options = state["compose_options"]
        if isinstance(state.get("run_manifest"), dict):
            self.run_manifest = state["run_manifest"]

    def clear_state(self) -> None:
        super().clear_state()
        self.machine = None
        self.run_manifest = None

    # -- what the notebook sees --------------------------------------------------

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(self._compose_env())
        if self.kit is not None:  # the server opens on the kit's notebook
            env["JUPYTERHUB_DEFAULT_URL"] = (
                f"/lab/tree/{HOME_FOLDER}/{self.kit.id}/{self.kit.notebook}"
            )
        return env

    def _compose_env(self) -> dict[str, str]:
        """What the notebook is told of its machine, its stack and the portal."""
        env: dict[str, str] = {}
        if self.machine is not None:
            env.update(machine_env(self.machine))
        if self.portal_url:
            env["COMPOSE_PORTAL_URL"] = self.portal_url
        if self.stack is not None:
            env.update(stack_env(self.stack))
        return env

    # -- progress ------------------------------------------------------------

    def _progress(self, message: str) -> None:
        # The user sees these; the log gets one line per compose (Composer.compose).
        self.log.debug("%s: %s", self._log_name, message)
        self._events.append({"progress": _percent(len(self._events)), "message": message})
        self._notify()

    def _notify(self) -> None:
        self._events_changed.set()
        self._events_changed = asyncio.Event()

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        shown = 0
        while True:
            changed = self._events_changed
            while shown < len(self._events):
                yield self._events[shown]
                shown += 1
            if not self._starting:
                return
            await changed.wait()


class ComposeSpawner(ComposeMixin, LocalLauncher):
    """Compose a machine, then run the notebook as a local process (the embedded default)."""


def _options_read_at_start(spawner: Spawner, user_options: dict[str, Any]) -> None:
    """ComposeMixin validates and applies ``user_options`` in start(), against fresh data.

    Here it only allows the start the time its stack needs.
    """
    if isinstance(spawner, ComposeMixin):
        spawner.allow_time_for(user_options)


def stack_env(stack: Stack) -> dict[str, str]:
    """What a notebook on ``stack`` is given: the stack's own settings, and which it is."""
    return {**dict(stack.env), "COMPOSE_STACK": stack.id}


def _percent(step: int) -> int:
    return min(10 + step * 12, 90)
