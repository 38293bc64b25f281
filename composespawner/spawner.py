"""JupyterHub glue: the spawn form, start/stop/poll, state and progress.

:class:`ComposeMixin` adds composition to any JupyterHub spawner that knows how
to launch a notebook (the *launcher*): a machine is composed before the
launcher's ``start`` and released on every way a server ends. Concrete classes
pair it with a launcher: :class:`ComposeSpawner` runs the notebook as a local
process (the embedded default); a Kubernetes launcher plugs in the same way.

This module holds no allocation logic: it parses and renders, then asks the
:class:`~composespawner.composer.Composer` (one per hub process) to do the work.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import jinja2
from jupyterhub.spawner import LocalProcessSpawner, Spawner, SpawnException
from traitlets import Bool, Float, Integer, Unicode, default

from .catalog import Catalog
from .composer import ComposedMachine, ComposeFailed, Composer, ComposeRefused, Offer
from .fabric.base import FabricError
from .fabric.redfish import RedfishFabric, RedfishTimeouts
from .ledger import Ledger
from .request import MachineRequest, RequestError, check_server_name, parse_form, parse_options

STATE_VERSION = 1
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("composespawner", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


class ComposeRefusal(SpawnException):
    """A refusal shown to the user as-is: on the form, the progress page and in the API."""

    def __init__(self, message: str, *, reason: str, status_code: int) -> None:
        super().__init__(message, reason=reason, status_code=status_code)
        # The spawn form shows ``jupyterhub_message`` verbatim (str() adds a prefix).
        self.jupyterhub_message = message


class ComposeMixin(Spawner):
    """Compose a machine over the fabric around whatever launches the notebook."""

    catalog_file = Unicode(
        "catalog.toml",
        config=True,
        help="""TOML file listing what the spawn form offers (GPU models, networks,
        scratch sizes, co-located chassis). Relative paths are taken from the hub's
        working directory. Change it to offer different hardware.""",
    )
    ledger_url = Unicode(
        "sqlite:///composespawner.sqlite",
        config=True,
        help="""SQLAlchemy URL of the ledger (who holds which device). SQLite suits one
        hub; use postgresql+psycopg://... when the hub runs with PostgreSQL or in
        several replicas. The schema is migrated on first use.""",
    )
    fabric_url = Unicode(
        "http://127.0.0.1:8010",
        config=True,
        help="Base URL of the fabric's Redfish service (the part before /redfish/v1).",
    )
    fabric_username = Unicode(
        config=True, help="Redfish account; default $COMPOSE_FABRIC_USERNAME or 'admin'."
    )
    fabric_password = Unicode(
        config=True,
        help="Redfish password; default $COMPOSE_FABRIC_PASSWORD. Prefer the environment.",
    )
    fabric_request_timeout = Float(
        10.0, config=True, help="Seconds one Redfish request may take before it is retried."
    )
    fabric_operation_timeout = Float(
        60.0,
        config=True,
        help="""Seconds one fabric operation (an attach, with its retries and task polling)
        may take. Raise it for fabrics whose attach takes long.""",
    )
    fabric_max_requests = Integer(
        64,
        config=True,
        help="""Most Redfish requests in flight to the fabric at once, over all spawns.
        Lower it (8-16) for BMC-class services that fail under fan-out; raise it if
        spawns queue behind each other during a rush (a class starting at once).""",
    )
    hub_id = Unicode(
        config=True,
        help="""This hub's name in the fabric's composition tags. The reconciler only
        touches compositions carrying it, so every hub sharing a fabric needs its own.""",
    )
    max_gpus_per_user = Integer(
        4,
        config=True,
        help="""GPUs one user may hold at once, over all their servers (0: no limit).
        Checked in the same transaction as the claim, so racing spawns cannot exceed it.""",
    )
    inventory_cache_seconds = Float(
        3.0,
        config=True,
        help="How long the spawn form may show a fabric inventory before asking again.",
    )

    _composers: ClassVar[dict[tuple[str, ...], Composer]] = {}

    @default("hub_id")
    def _default_hub_id(self) -> str:
        return f"jupyterhub@{socket.gethostname()}"

    @default("fabric_username")
    def _default_fabric_username(self) -> str:
        return os.environ.get("COMPOSE_FABRIC_USERNAME", "admin")

    @default("fabric_password")
    def _default_fabric_password(self) -> str:
        return os.environ.get("COMPOSE_FABRIC_PASSWORD", "")

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return _options_read_at_start

    @default("options_form")
    def _default_options_form(self) -> Any:
        return ComposeMixin.render_options_form

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.machine: ComposedMachine | None = None
        self._events: list[dict[str, Any]] = []
        self._events_changed = asyncio.Event()
        self._starting = False

    # -- the shared composer -------------------------------------------------

    @property
    def composer(self) -> Composer:
        key = (self.ledger_url, self.fabric_url, self.catalog_file, self.hub_id)
        if key not in self._composers:
            self._composers[key] = self._make_composer()
        return self._composers[key]

    def _make_composer(self) -> Composer:
        ledger = Ledger(self.ledger_url)
        ledger.upgrade()
        fabric = RedfishFabric(
            self.fabric_url,
            username=self.fabric_username,
            password=self.fabric_password,
            timeouts=RedfishTimeouts(
                request=self.fabric_request_timeout, operation=self.fabric_operation_timeout
            ),
            log=self.log,
            max_in_flight=self.fabric_max_requests,
        )
        return Composer(
            ledger=ledger,
            fabric=fabric,
            catalog=Catalog.from_file(self.catalog_file),
            hub_id=self.hub_id,
            snapshot_ttl=self.inventory_cache_seconds,
            log=self.log,
        )

    @property
    def catalog(self) -> Catalog:
        return self.composer.catalog

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(g.name for g in self.user.groups)

    # -- the form --------------------------------------------------------------

    async def render_options_form(self) -> str:
        try:
            offer = await self.composer.offer(self.user.name, self.groups)
        except Exception:
            self.log.exception("Could not read the fabric for %s's spawn form", self.user.name)
            return _TEMPLATES.get_template("unavailable.html").render()
        previous = self.user_options or self.orm_spawner.user_options or {}
        return _TEMPLATES.get_template("compose_form.html").render(
            catalog=self.catalog,
            models=[m for m in self.catalog.gpu_models if m.id in offer.free],
            free=offer.free,
            previous=previous,
            quota=self._quota_view(offer),
        )

    def _quota_view(self, offer: Offer) -> dict[str, Any]:
        limit = self.max_gpus_per_user
        left = max(limit - offer.gpus_in_use, 0) if limit else None
        return {"limit": limit or None, "in_use": offer.gpus_in_use, "left": left}

    async def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        try:
            request = parse_form(formdata, self.catalog, await self._visible_model_ids())
        except RequestError as e:
            raise ComposeRefusal(str(e), reason="invalid-options", status_code=400) from e
        return request.to_options()

    async def _visible_model_ids(self) -> frozenset[str]:
        try:
            return await self.composer.visible_models(self.groups)
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
            request = await self._parse_request()
            self.machine = await self._compose(request)
            try:
                return await self._launch()
            except BaseException as e:
                await asyncio.shield(self._release(self.machine, f"launch failed: {e!r}", True))
                raise
        finally:
            self._starting = False
            self._notify()

    async def _parse_request(self) -> MachineRequest:
        try:
            check_server_name(self.name)
            return parse_options(
                self.user_options or {}, self.catalog, await self._visible_model_ids()
            )
        except RequestError as e:
            raise ComposeRefusal(str(e), reason="invalid-options", status_code=400) from e

    async def _compose(self, request: MachineRequest) -> ComposedMachine:
        try:
            return await self.composer.compose(
                user=self.user.name,
                groups=self.groups,
                server=self.name,
                request=request,
                gpu_limit=self.max_gpus_per_user or None,
                progress=self._progress,
                then=("launching", "starting notebook"),
            )
        except ComposeRefused as e:
            raise ComposeRefusal(str(e), reason="no-capacity", status_code=e.status) from e
        except ComposeFailed as e:
            raise ComposeRefusal(str(e), reason="fabric", status_code=503) from e

    async def _launch(self) -> Any:
        """Start the notebook on the composed machine (the ledger says ``launching``)."""
        assert self.machine is not None
        self._progress(f"starting notebook on {self.machine.host}")
        url = await super().start()
        await self.composer.record(self.machine.machine_id, "running", "notebook started")
        return url

    # -- stop and poll: every way a server ends releases its machine -----------

    async def stop(self, now: bool = False) -> None:
        machine, self.machine = self.machine, None  # our poll() inside stop() must not release
        await super().stop(now=now)
        await self._release(machine, "server stopped")

    async def poll(self) -> int | None:
        machine = self.machine
        status: int | None = await super().poll()
        if status is not None and machine is not None and not self._starting:
            # The hub never calls stop() for a server poll() found dead.
            await self._release(machine, f"notebook exited (status {status})")
        return status

    async def _release(
        self, machine: ComposedMachine | None, reason: str, failed: bool = False
    ) -> None:
        if machine is None:
            return
        if self.machine is machine:
            self.machine = None
        try:
            await self.composer.release(machine.machine_id, reason=reason, failed=failed)
        except Exception:
            self.log.exception(
                "Release of %s not confirmed; retrying in the background", machine.machine_id
            )
            self.composer.release_soon(machine.machine_id, reason=reason, failed=failed)

    # -- state ---------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.machine is not None:
            state["compose"] = {"version": STATE_VERSION, **self.machine.to_state()}
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        compose = state.get("compose")
        if compose:
            # version 1 is the first; later versions must keep reading it.
            self.machine = ComposedMachine.from_state(compose)

    def clear_state(self) -> None:
        super().clear_state()
        self.machine = None

    # -- what the notebook sees --------------------------------------------------

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        if self.machine is not None:
            env.update(machine_env(self.machine))
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


class ComposeSpawner(ComposeMixin, LocalProcessSpawner):
    """Compose a machine, then run the notebook as a local process.

    With ``shared_account`` (the embedded demo) notebooks run as the hub's own
    account with a home per user under ``home_dir_template``, so demo users need
    no system accounts. Without it, each user needs a system account, as with
    JupyterHub's LocalProcessSpawner.
    """

    shared_account = Bool(
        False,
        config=True,
        help="""Run every notebook as the hub's own system account (demo and tests only:
        users are not isolated from each other).""",
    )
    home_dir_template = Unicode(
        "/tmp/composespawner-homes/{username}",
        config=True,
        help="With shared_account: each user's home and working directory.",
    )

    def _home(self) -> str:
        return self.home_dir_template.format(username=self.user.name)

    @default("popen_kwargs")
    def _default_popen_kwargs(self) -> dict[str, Any]:
        # With shared_account the notebook starts in the user's home through
        # Popen's cwd, not a preexec_fn: with no Python code to run between
        # fork and exec, Popen can use vfork, which costs the same whatever the
        # hub's size. A fork copies the hub's page tables: about 15 ms a launch
        # for a 300 MB process, on the event loop, while a storm of spawns waits.
        return {"cwd": self._home()} if self.shared_account else {}

    def make_preexec_fn(self, name: str) -> Any:
        if not self.shared_account:
            return super().make_preexec_fn(name)
        home = self._home()
        Path(home).mkdir(parents=True, exist_ok=True)
        if self.popen_kwargs.get("cwd") == home:
            return None  # entered through Popen's cwd

        def enter_home() -> None:
            os.chdir(home)

        return enter_home

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        if not self.shared_account:
            result: dict[str, str] = super().user_env(env)
            return result
        env["USER"] = self.user.name
        env["HOME"] = self._home()
        return env


def _options_read_at_start(spawner: Spawner, user_options: dict[str, Any]) -> None:
    """ComposeMixin validates and applies ``user_options`` in start(), against fresh data."""
    del spawner, user_options


def machine_env(machine: ComposedMachine) -> dict[str, str]:
    """Environment that tells the notebook what it got."""
    gpus = [{"id": d.block_id, "model": d.model, "memory_gib": d.memory_gib} for d in machine.gpus]
    env = {
        "COMPOSE_MACHINE_ID": machine.machine_id,
        "COMPOSE_HOST": machine.host,
        "COMPOSE_ZONE": machine.zone,
        "COMPOSE_GPUS": json.dumps(gpus),
        "COMPOSE_GPU_MODELS": ",".join(d.model for d in machine.gpus),
        "COMPOSE_DEVICE_IDS": ",".join(d.block_id for d in (*machine.gpus, *_extras(machine))),
        # The host sees only the GPUs composed into it, numbered from 0 in the
        # order they were attached.
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(machine.gpus))),
        "COMPOSE_SCRATCH_GB": str(sum(d.capacity_gb or 0 for d in machine.drives)),
    }
    if machine.nic is not None:
        env["COMPOSE_NIC"] = f"{machine.nic.model} ({machine.nic.speed_gbps} Gb/s)"
    return env


def _extras(machine: ComposedMachine) -> tuple[Any, ...]:
    return ((machine.nic,) if machine.nic else ()) + machine.drives


def _percent(step: int) -> int:
    return min(10 + step * 12, 90)
