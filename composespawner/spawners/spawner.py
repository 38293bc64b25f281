"""JupyterHub glue: the spawn form, start/stop/poll, state and progress.

:class:`ComposeMixin` adds composition to any JupyterHub spawner that knows how
to launch a notebook (the *launcher*): a machine is composed before the
launcher's ``start`` and released on every way a server ends. Concrete classes
pair it with a launcher: :class:`ComposeSpawner` runs the notebook as a local
process (the embedded default); a Kubernetes launcher plugs in the same way.

This module holds no allocation logic: it parses and renders, then asks the
:class:`~composespawner.services.composer.Composer` (one per hub process) to do the work.
Its collaborators are its siblings: the form (:mod:`.form`), the progress page
(:mod:`.progress`), the options checked (:mod:`.options`), the saved state
(:mod:`.state`), the notebook's environment (:mod:`.notebook_env`) and refusals
(:mod:`.refusals`). JupyterHub's internals are reached only through
:mod:`composespawner.launchers.jupyterhub_internals`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

from jupyterhub.spawner import Spawner
from traitlets import Float, Unicode, default

from composespawner.domain.catalog import Catalog, Kit
from composespawner.domain.machine import ComposedMachine
from composespawner.domain.manifest import run_manifest
from composespawner.domain.request import MachineRequest
from composespawner.launchers.base import KitNotDelivered, Launcher, SpawnRefused
from composespawner.launchers.jupyterhub_internals import (
    guard_stored_user_options,
    is_new_record,
    log_name,
)
from composespawner.launchers.kits import HOME_FOLDER
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.local_container import PodmanLauncher
from composespawner.ledger import SchemaNotCurrent
from composespawner.services.admission import Admission
from composespawner.services.composer import Composer
from composespawner.services.settings import ComposeSettings, shared_composer
from composespawner.spawners.form import render_form, render_unavailable
from composespawner.spawners.notebook_env import compose_env, kit_default_url
from composespawner.spawners.options import (
    LinkChoices,
    UserRequests,
    options_to_start,
    stack_asked_for,
)
from composespawner.spawners.progress import StartProgress
from composespawner.spawners.refusals import (
    forget_refused,
    ledger_upgrading,
    options_to_store,
    refused_compose,
    refused_if_ended,
)
from composespawner.spawners.state import ComposeState, restored_state, saved_state


class ConfirmLinkChoices(Exception):
    """A spawn link's options were checked; the form shows them for the user to submit.

    Raised from options_from_query: the hub then serves the form (status 200, and
    no error box, since ``jupyterhub_message`` is empty) instead of spawning.
    """

    jupyterhub_message = ""


class ComposeMixin(ComposeSettings, Launcher, Spawner):
    """Compose a machine over the fabric around whatever launches the notebook.

    Its knobs (ledger, fabric, catalog, quota) are :class:`ComposeSettings`'s.
    """

    form_fabric_timeout = Float(
        1.0,
        config=True,
        help="""Seconds the spawn form waits for a fresh fabric inventory. A slower read
        goes on in the background while the form shows the last inventory with its age
        (or, with none read yet, says the fabric is not answering). The default keeps
        the form within 2 s with time left for login, redirects and a loaded hub.
        Raise it only if your fabric's inventory read regularly takes longer.""",
    )

    portal_url = Unicode(
        "",
        config=True,
        help="""The GPU portal's address as notebooks reach it (the portal service's own
        url and prefix, e.g. ``http://127.0.0.1:8002/services/compose/``), given to them
        as $COMPOSE_PORTAL_URL for ``composespawner.client``. Empty: notebooks cannot
        use the client.""",
    )

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return _options_read_at_start

    @default("options_form")
    def _default_options_form(self) -> Any:
        return ComposeMixin.render_options_form

    def __init__(self, **kwargs: Any) -> None:
        # JupyterHub has no start-up hook for its spawner class, and stores a start's
        # options after making its spawner: the first spawner made installs the guard.
        guard_stored_user_options(options_to_store)
        super().__init__(**kwargs)
        self.machine: ComposedMachine | None = None
        self.kit: Kit | None = None  # the starter kit this start asked for
        self._steps = StartProgress()
        self._composer: Composer | None = None
        # The options of the last start that composed a machine (kept in state):
        # what the form pre-selects and what a request without options reuses.
        self.accepted_options: dict[str, Any] = {}
        self._link_choices = LinkChoices()
        # A hub record with no activity yet was created for this spawn: a
        # refusal removes it, so it counts toward no named-server limit.
        self._record_is_new = is_new_record(self)
        # What the running server runs on (composespawner.domain.manifest), while it runs.
        self.run_manifest: dict[str, Any] | None = None
        # start_timeout as configured, before a start that builds its stack adds to it.
        self._configured_start_timeout: float = self.start_timeout

    # -- the shared composer -------------------------------------------------

    @property
    def composer(self) -> Composer:
        # Looked up once per spawner: the shared composer's key reads every setting.
        if self._composer is None:
            try:
                self._composer = shared_composer(self, self.log)
            except SchemaNotCurrent as e:
                self.log.error("The ledger cannot be used: %s", e)
                raise ledger_upgrading() from e
        return self._composer

    @property
    def catalog(self) -> Catalog:
        return self.composer.catalog

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(g.name for g in self.user.groups)

    def _requests(self) -> UserRequests:
        return UserRequests(self.composer, self.user.name, self.groups, self.log, log_name(self))

    # -- the form --------------------------------------------------------------

    async def render_options_form(self) -> str:
        try:
            offer = await self.composer.offer(
                self.user.name, self.groups, within=self.form_fabric_timeout
            )
        except Exception:
            self.log.exception("Could not read the fabric for %s's spawn form", self.user.name)
            return render_unavailable()
        link_choices = self._link_choices.take(self.handler)
        previous = link_choices or self.accepted_options
        return render_form(self.catalog, offer, previous, from_link=link_choices is not None)

    async def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        try:
            return await self._requests().from_form(formdata)
        except SpawnRefused:
            forget_refused(self, self.accepted_options, self._record_is_new)
            raise

    async def options_from_query(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """A spawn link's options fill in the form; only the form's POST spawns.

        A GET can come from any page on the web (a link, an image, a script), and
        the hub's cookies go with it, so it must not claim hardware. The form's
        POST carries the hub's XSRF token, which no other site can read.
        """
        self._link_choices.keep(self.handler, await self._requests().from_form(query))
        raise ConfirmLinkChoices(f"{log_name(self)}: spawn link shown as a form to confirm")

    # -- start -----------------------------------------------------------------

    async def start(self) -> Any:
        self._steps.begin()
        try:
            try:
                options = options_to_start(self.user_options, self.accepted_options, self.name)
                admitted = await self.composer.admission_for(self.user.name, self.groups)
                request = await self._requests().for_start(options, admitted)
                self.stack = self.catalog.stack(request.stack) if request.stack else None
                self.kit = self.catalog.kit(request.kit) if request.kit else None
                if self.stack is not None:  # before anything is claimed
                    self.check_stack(self.stack)
                else:
                    self.check_without_stack()
                if self.kit is not None:
                    self.check_kit(self.kit)
                self.machine = await self._compose(request, admitted)
                self.share = self.machine.share  # what the launcher holds the notebook to
            except SpawnRefused:
                forget_refused(self, self.accepted_options, self._record_is_new)
                raise
            self.accepted_options = request.to_options()
            try:
                return await self._launch()
            except BaseException as e:
                await asyncio.shield(self._release(self.machine, f"launch failed: {e!r}", True))
                raise
        finally:
            self._steps.end()

    async def _compose(self, request: MachineRequest, admitted: Admission) -> ComposedMachine:
        with refused_compose():
            return await self.composer.compose(
                user=self.user.name,
                groups=self.groups,
                server=self.name,
                request=request,
                progress=self._progress,
                then=("launching", "starting notebook"),
                admitted=admitted,
            )

    def allow_time_for(self, options: dict[str, Any]) -> None:
        """Give a start that builds its stack's environment first the time to do it.

        Called before start() (JupyterHub reads ``start_timeout`` as it calls it),
        with the options not yet checked: start() checks them.
        """
        options = options if isinstance(options, dict) and options else self.accepted_options
        stack = stack_asked_for(self.catalog, options)
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
        with refused_if_ended():
            await self.composer.record(
                self.machine.machine_id, "running", "notebook started", self.run_manifest
            )
        return url

    async def _deliver_kit(self, kit: Kit) -> None:
        """Put the kit in the home; without it the server is still worth starting."""
        self._progress(f"putting the {kit.label} kit in ~/{HOME_FOLDER}/{kit.id}")
        try:
            await self.deliver_kit(kit)
        except KitNotDelivered as e:
            self.log.warning("%s: kit %s not merged: %s", log_name(self), kit.id, e)
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
            environment={
                **self.launcher_env(),
                **compose_env(machine, self.stack, self.portal_url),
            },
            started_at=datetime.now(UTC),
            image=self.run_image,
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
        if machine is not None and not self._steps.under_way:
            await self._release(machine, f"notebook exited (status {status})")

    async def _release(
        self, machine: ComposedMachine | None, reason: str, failed: bool = False
    ) -> None:
        if machine is None:
            return
        if self.machine is machine:
            self.machine = None
        await release_in_background(self.composer, machine, reason, failed, self.log)

    # -- state ---------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        kept = ComposeState(self.machine, self.accepted_options, self.run_manifest)
        return {**super().get_state(), **saved_state(kept)}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        restored = restored_state(state)
        if restored.machine is not None:
            self.machine = restored.machine
            self.share = restored.machine.share
        if restored.accepted_options is not None:
            self.accepted_options = restored.accepted_options
        if restored.run_manifest is not None:
            self.run_manifest = restored.run_manifest

    def clear_state(self) -> None:
        super().clear_state()
        self.machine = None
        self.share = None
        self.run_manifest = None

    # -- what the notebook sees --------------------------------------------------

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(compose_env(self.machine, self.stack, self.portal_url))
        if self.kit is not None:
            env["JUPYTERHUB_DEFAULT_URL"] = kit_default_url(self.kit)
        return env

    # -- progress ------------------------------------------------------------

    def _progress(self, message: str) -> None:
        # The user sees these; the log gets one line per compose (Composer.compose).
        self.log.debug("%s: %s", log_name(self), message)
        self._steps.add(message)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        async with aclosing(self._steps.follow()) as steps:
            async for event in steps:
                yield event


class ComposeSpawner(ComposeMixin, LocalLauncher):
    """Compose a machine, then run the notebook as a local process (the embedded default)."""


class ComposePodmanSpawner(ComposeMixin, PodmanLauncher):
    """Compose a machine, then run the notebook in a container of its own from its stack's
    image (``c.JupyterHub.spawner_class = "compose-podman"``)."""


def _options_read_at_start(spawner: Spawner, user_options: dict[str, Any]) -> None:
    """ComposeMixin validates and applies ``user_options`` in start(), against fresh data.

    Here it only allows the start the time its stack needs.
    """
    if isinstance(spawner, ComposeMixin):
        spawner.allow_time_for(user_options)


async def release_in_background(
    composer: Composer,
    machine: ComposedMachine,
    reason: str,
    failed: bool,
    log: logging.Logger | logging.LoggerAdapter[Any],
) -> None:
    """Give ``machine`` back without waiting for the fabric to confirm.

    The fabric may take long to confirm (timeouts and retries): nobody waits
    for it. The devices stay held in the ledger until it does.
    """
    try:
        await composer.release_in_background(machine.machine_id, reason=reason, failed=failed)
    except Exception:
        log.exception("Could not mark %s stopping; releasing anyway", machine.machine_id)
        composer.release_soon(machine.machine_id, reason=reason, failed=failed)
