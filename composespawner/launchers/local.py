"""The local-process launcher: the notebook runs as a process on the hub's machine.

A launcher is the part of a spawner that runs the notebook: JupyterHub's own
``start``/``stop``/``poll`` of some spawner class.
:class:`~composespawner.spawners.spawner.ComposeMixin` composes the machine around
it: before its ``start`` the machine is composed and its description is in
``get_env()``; on every way the notebook ends the machine is released. A launcher
tells the mixin at once when it sees its notebook exit, through
:meth:`notebook_exited`. The Kubernetes launcher is KubeSpawner in the same place.

With a stack chosen, the notebook runs in that stack's environment, built from
its CPU lock on first use (:mod:`.environments`): a command named
``jupyterhub-singleuser`` is the stack's own.

On a shared host the notebook gets only its machine's share of the host's cores
and memory: a cgroup of its own enforces it (:class:`.local_process.CgroupLimitedSpawner`,
:mod:`.cgroups`), and ``CUDA_VISIBLE_DEVICES``/``NVIDIA_VISIBLE_DEVICES`` name its own
GPUs by UUID.

With ``shared_account`` (the embedded demo) users need no system accounts: each
gets a home under ``home_dir_template``, and notebooks run as
``notebook_account`` when the hub runs as root, else as the hub's own account.
Without it, each user needs a system account, as with JupyterHub's
LocalProcessSpawner.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shlex
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any, ClassVar

from traitlets import Bool, Unicode, default

from composespawner.domain.catalog import Kit
from composespawner.domain.machine import nvidia_visible_devices
from composespawner.launchers.accounts import (
    DEFAULT_NOTEBOOK_ACCOUNT,
    make_home,
    switch_account_command,
)
from composespawner.launchers.base import Launcher, SpawnRefused
from composespawner.launchers.environments import (
    StackBuildError,
    StackEnvironment,
)
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.local_files import (
    merge_kit,
    notebook_account,
    write_for_notebook,
)
from composespawner.launchers.local_process import (
    CgroupLimitedSpawner,
    process_started,
    watch_exit,
)
from composespawner.launchers.local_stack_settings import LocalStackSettings
from composespawner.launchers.ports import NoFreePort, notebook_port
from composespawner.ledger.runner import whole_in_thread

NOTEBOOK_SERVER = "jupyterhub-singleuser"


class LocalLauncher(LocalStackSettings, Launcher, CgroupLimitedSpawner):
    """Run the notebook as a local process, held to its share; say at once when it exits."""

    shared_account = Bool(
        False,
        config=True,
        help="""Run every notebook under one account: ``notebook_account`` when the hub
        is root, the hub's own otherwise (demo and tests only: users are not isolated
        from each other, and a hub that is not root is not isolated from its notebooks).""",
    )
    notebook_account = Unicode(
        DEFAULT_NOTEBOOK_ACCOUNT,
        config=True,
        help="""With shared_account and a hub running as root: the unprivileged system
        account notebooks run as, so that they cannot read the hub's state, environment
        or secrets. `composespawner demo` creates it (useradd --system). Change it if
        that name is taken; empty runs notebooks as root (they then need --allow-root).""",
    )
    home_dir_template = Unicode(
        "/tmp/composespawner-homes/{username}",
        config=True,
        help="""With shared_account: each user's home and working directory, owned by the
        account notebooks run as (mode 0700). Every folder above it must be open to it.""",
    )

    # Every launcher of this hub, so that no two of its notebooks get one port.
    _launchers: ClassVar[weakref.WeakSet[LocalLauncher]] = weakref.WeakSet()
    _assigned_port = 0  # the port start chose (not configured), chosen afresh each start

    stack_variant = "cpu"
    _environment: StackEnvironment | None = None
    _run_manifest: str | None = None  # where this start's run manifest is, for the notebook
    # What start() writes there, just before the notebook: (path, content, owner).
    _manifest_file: tuple[Path, bytes, pwd.struct_passwd | None] | None = None

    # -- the stack's environment -----------------------------------------------

    async def prepare_launch(self) -> None:
        self._environment = self._run_manifest = self._manifest_file = None
        if self.stack is None:
            return
        try:
            self._environment = await self._builder(self.stack).ensure(
                self.stack, self.launch_progress
            )
        except StackBuildError as e:
            raise SpawnRefused(str(e), reason="stack", status_code=503) from e

    async def deliver_run_manifest(self, manifest: dict[str, Any]) -> str | None:
        """``~/.composespawner/<server>.run.json``, the hub's and read-only (0444).

        Its folder is the notebook's (composespawner.client writes there too). The
        file is written as the notebook starts, just before its process, off the
        hub's loop (see :meth:`start`).
        """
        owner = self._runs_as() if self.shared_account else self._system_account()
        home = Path(self._home()) if self.shared_account else Path(self._system_home())
        path = home / ".composespawner" / f"{self.name or 'default'}.run.json"
        self._manifest_file = (path, (json.dumps(manifest, indent=2) + "\n").encode(), owner)
        self._run_manifest = str(path)
        return self._run_manifest

    async def deliver_kit(self, kit: Kit) -> None:
        """Merge as the notebook's account: it writes nowhere the notebook could not."""
        if self.shared_account:
            account, home = self._runs_as(), Path(self._home())
            make_home(home, account)
        else:
            account, home = self._system_account(), Path(self._system_home())
        said = await merge_kit(kit, account, home)
        self.log.info("%s: kit %s merged into %s: %s", log_name(self), kit.id, home, said)

    def _system_account(self) -> pwd.struct_passwd | None:
        """The user's own system account, when the hub may hand files to it (as root)."""
        return pwd.getpwnam(self.user.name) if os.geteuid() == 0 else None

    def _system_home(self) -> str:
        return pwd.getpwnam(self.user.name).pw_dir

    def _in_stack(self, command: list[str]) -> list[str]:
        """The notebook server a stack brings replaces the configured one."""
        if self._environment is None or Path(command[0]).name != NOTEBOOK_SERVER:
            return command
        return [str(self._environment.bin / NOTEBOOK_SERVER), *command[1:]]

    def launcher_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self._environment is not None:
            env["VIRTUAL_ENV"] = str(self._environment.path)
            env["COMPOSE_STACK_MANIFEST"] = str(self._environment.manifest)
            if self.stack is not None and self.stack.cpu is not None:
                env["COMPOSE_STACK_LOCK_SHA256"] = self.stack.cpu.lock_sha256
        if self._run_manifest is not None:
            env["COMPOSE_RUN_MANIFEST"] = self._run_manifest
        if self.machine is not None:  # for a container runtime the notebook runs (Apptainer)
            env["NVIDIA_VISIBLE_DEVICES"] = nvidia_visible_devices(self.machine)
        return env

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(self.launcher_env())
        if self._environment is not None:
            env["PATH"] = f"{self._environment.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    # -- starting --------------------------------------------------------------

    async def start(self) -> Any:
        """LocalProcessSpawner's start, with the notebook's files made, and its process
        created, in a worker thread (:meth:`launch`)."""
        if self.port in (0, self._assigned_port):  # type: ignore[has-type]  # an untyped trait
            self.port = self._assigned_port = self._free_port()
        env = self.get_env()
        command = self._in_stack([*self.cmd, *self.get_args()])
        if self.shell_cmd:
            command = [*self.shell_cmd, shlex.join(command)]
        owner = self._runs_as()
        home = Path(self._home()) if self.shared_account else None
        manifest, self._manifest_file = self._manifest_file, None

        def make_files() -> None:
            if home is not None:
                make_home(home, owner)
            if manifest is not None:
                write_for_notebook(*manifest)

        await self.launch(command, env, make_files)
        return (self.ip or "127.0.0.1", self.port)

    async def launch(
        self, command: list[str], env: dict[str, str], make_files: Callable[[], None]
    ) -> None:
        """Make the notebook's files (``make_files``), then run its ``command``, and
        watch for its exit.

        Popen returns only once its child has called exec (vfork): under load
        that child waits for a CPU, and a 200-user storm held the hub's loop
        for 1.6 s (a tenth of the storm) in those waits. From a worker thread
        the loop goes on meanwhile (CPython drops the GIL around vfork from
        3.11.6 on). The files the notebook needs first, its home and the run
        manifest, are made there too, just before: they wait on the
        filesystem's journal, which the hub's own database commits keep busy.
        """
        cmd, env = self.notebook_process(command, env)
        self.log.info("Spawning %s", shlex.join(cmd))
        popen_kwargs = {
            "preexec_fn": self.make_preexec_fn(self.user.name),
            "start_new_session": True,  # don't forward signals
            **self.popen_kwargs,
            "env": env,  # config does not override it
        }
        started: list[Popen[bytes]] = []
        start_times: list[int | None] = []

        def create() -> None:
            make_files()
            try:
                started.append(self.popen_in_share(Popen, cmd, popen_kwargs))
                start_times.append(process_started(started[0].pid))  # a /proc read: here too
            except PermissionError:
                self.log.error("Permission denied trying to run %r", shutil.which(cmd[0]) or cmd[0])
                raise

        try:
            await whole_in_thread(create)
        finally:
            # Also when the start was cancelled meanwhile (its timeout): the process
            # may have started, and the stop that follows must find it to end it.
            if started:
                self.proc = started[0]
                self.pid = self.proc.pid
                self._pid_started = start_times[0] if start_times else None
        self._watch_exit(self.proc)

    def notebook_process(
        self, command: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """The process that runs the notebook's ``command``, and its environment: the
        command itself, as the notebook's account."""
        return [*switch_account_command(self._runs_as()), *command], env

    def _free_port(self) -> int:
        self._launchers.add(self)
        others = {launcher.port for launcher in self._launchers if launcher is not self}
        try:
            return notebook_port(self.ip, others)
        except NoFreePort as e:
            self.log.error("Cannot start %s's notebook: %s", log_name(self), e)
            raise SpawnRefused(
                "This machine has no free port for another notebook. "
                "Try again in a few minutes, or tell the hub's administrators.",
                reason="no-port",
                status_code=503,
            ) from e

    def _home(self) -> str:
        return self.home_dir_template.format(username=self.user.name)

    def _runs_as(self) -> pwd.struct_passwd | None:
        """The account notebooks run as, or None for the hub's own."""
        return notebook_account(self.shared_account, self.notebook_account)

    def notebook_uid(self) -> int | None:
        if not self.shared_account:
            return super().notebook_uid()
        owner = self._runs_as()
        return owner.pw_uid if owner is not None else os.geteuid()

    @default("popen_kwargs")
    def _default_popen_kwargs(self) -> dict[str, Any]:
        # With shared_account the notebook starts in the user's home through
        # Popen's cwd, and changes account through setpriv in front of its
        # command (see start), not through a preexec_fn or Popen's user=: with
        # neither, Popen can use vfork, which costs the same whatever the hub's
        # size. A fork copies the hub's page tables: about 15 ms a launch for a
        # 300 MB hub (60 ms for 1.5 GB), on the event loop, while a storm waits.
        return {"cwd": self._home()} if self.shared_account else {}

    def make_preexec_fn(self, name: str) -> Any:
        if not self.shared_account:
            return super().make_preexec_fn(name)
        home = self._home()  # made by start, just before the process
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

    # -- a notebook that exits is seen at once ---------------------------------

    def _watch_exit(self, proc: Popen[bytes] | None) -> None:
        """Tell notebook_exited when the process exits, not at the hub's next poll
        (see :func:`~composespawner.launchers.local_process.watch_exit`)."""
        if proc is None:
            return

        def exited() -> None:
            if self.proc is proc:  # not a newer start's process
                self._exit_seen = asyncio.ensure_future(self.notebook_exited(proc.poll()))
                self.remove_leftovers()

        watch_exit(proc.pid, exited, self.log, log_name(self))
