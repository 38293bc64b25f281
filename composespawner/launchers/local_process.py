"""The local notebook's process: which process it is, its share, and seeing it exit.

After a hub restart a notebook is known by its pid and its start time: a
zombie, or another process given the same pid since, must not pass for it.

On a shared host the process runs in a cgroup of its own that holds it to its
machine's share of the host (:class:`CgroupLimitedSpawner`, :mod:`.cgroups`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
from collections.abc import Callable, Sequence
from pathlib import Path
from subprocess import Popen
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Integer, TraitError, Unicode, validate

from composespawner.domain.hardware import Share
from composespawner.domain.machine import ComposedMachine, gpu_selection
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.cgroups import (
    PIDS_PER_GIB,
    REMOVE_TIMEOUT,
    CgroupError,
    CgroupPlan,
    Limits,
    balance_cpu_weight,
    cgroup_name,
    find_hierarchies,
    join_command,
    join_then,
    make_cgroup,
    new_token,
    parent_parts,
    pids_limit,
    plan_cgroup,
    remove_cgroups,
    unconfined,
)
from composespawner.launchers.gpu_devices import NVIDIA_PROC, gpu_device_rules
from composespawner.launchers.ipc import remove_ipc_of
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.processes import process_started, started_from_stat
from composespawner.ledger.runner import whole_in_thread

__all__ = [
    "CgroupLimitedSpawner",
    "KnownProcessSpawner",
    "process_started",
    "started_from_stat",
    "watch_exit",
]


def watch_exit(pid: int, exited: Callable[[], None], log: logging.Logger, whose: str) -> None:
    """Call ``exited`` on the running loop when process ``pid`` exits (a child or not),
    not at the hub's next poll.

    A pidfd becomes readable when the process exits: the event loop watches
    it like a socket, no thread and no busy loop. Without pidfds (Linux < 5.3)
    nothing is watched, and the hub's poll() finds the exit, as it would anyway.
    """
    if not hasattr(os, "pidfd_open"):
        return
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        log.info("Not watching %s's notebook for its exit (%s)", whose, e)
        return
    loop = asyncio.get_running_loop()

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        exited()

    loop.add_reader(pidfd, readable)


class KnownProcessSpawner(LocalProcessSpawner):
    """A LocalProcessSpawner that knows its notebook's process by pid and start time.

    After a hub restart LocalProcessSpawner knows the notebook by its pid alone: a
    zombie (the dead notebook of a crashed hub, not yet reaped) or another process
    given the same pid since would pass for it, keep its machine and get its stop's
    signals. The start time (clock ticks after boot, set by the start) says which
    process is the notebook.
    """

    _pid_started: int | None = None

    async def poll(self) -> int | None:
        """LocalProcessSpawner's poll, where the pid must name the process that started
        when the notebook did."""
        pid: int = self.pid  # type: ignore[has-type]  # an untyped trait
        if self.proc is None and pid and not self._is_the_notebook():
            self.log.info("%s: notebook process %d is gone", log_name(self), pid)
            self.pid = 0  # and so gone to LocalProcessSpawner's poll, which clears the state
        status: int | None = await super().poll()
        return status

    def _is_the_notebook(self) -> bool:
        started = process_started(self.pid)
        # A state saved before the start time was kept: the pid alone says.
        return started is not None and self._pid_started in (None, started)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.pid and self._pid_started is not None:
            state["pid_started"] = self._pid_started
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        started = state.get("pid_started")
        self._pid_started = started if isinstance(started, int) else None

    def clear_state(self) -> None:
        super().clear_state()
        self._pid_started = None


class CgroupLimitedSpawner(KnownProcessSpawner):
    """A LocalProcessSpawner whose notebook runs in a cgroup of its share, when it has one.

    Without a share (:attr:`share` None) nothing changes. With one, the start
    makes the cgroups, the process enters them before it execs, and every end
    (stop, an exit seen, a poll that finds it gone, a failed start) removes
    them with whatever the notebook left running in them.
    """

    cgroup_parent = Unicode(
        "composespawner",
        config=True,
        help="""The cgroup, below each hierarchy's root (/sys/fs/cgroup/... ), that holds a
        cgroup per notebook (<user>-<server>-<token>), which enforces the notebook's share
        of the host's cores and memory. Change it where that name is taken, or to nest
        the notebooks under a cgroup you manage.""",
    )
    cgroup_required = Bool(
        True,
        config=True,
        help="""Refuse a start whose share of the host cannot be enforced (the hub cannot
        write the cgroup hierarchy: not root, or /sys/fs/cgroup read-only or without the
        cpu and memory controllers). False runs such notebooks without limits, and logs
        a warning: then one notebook can take every core and all the memory of a host
        others share.""",
    )

    pids_per_gib = Integer(
        PIDS_PER_GIB,
        min=1,
        config=True,
        help="""Processes and threads a notebook may have per GiB of its share's memory
        (at least 64 whatever its size): a fork bomb in one notebook then stops at its
        own limit, and its neighbours and the hub can still start processes. Keep it
        so that this times the host's memory stays well under kernel.pid_max.""",
    )
    nvidia_proc_dir = Unicode(
        str(NVIDIA_PROC),
        config=True,
        help="""Where the NVIDIA driver lists each GPU's device minor (gpus/*/information):
        a notebook may open its own GPUs' device nodes and no other's (with the v1
        devices controller). Change it only where /proc is mounted elsewhere.""",
    )

    share: Share | None = None  # Launcher's: set by the composing mixin before start
    machine: ComposedMachine | None = None  # the mixin's; set before start
    _cgroups: tuple[Path, ...] = ()  # this notebook's cgroups, until removed
    _cgroups_removal: asyncio.Future[None] | None = None

    @validate("cgroup_parent")
    def _valid_parent(self, proposal: dict[str, Any]) -> str:
        try:
            parent_parts(proposal["value"])
        except ValueError as e:
            raise TraitError(f"cgroup_parent: {e}") from e
        return str(proposal["value"])

    def popen_in_share(
        self, popen: Callable[..., Popen[bytes]], cmd: Sequence[str], kwargs: dict[str, Any]
    ) -> Popen[bytes]:
        """``popen(cmd, **kwargs)`` in cgroups of :attr:`share` (in start's worker thread)."""
        plan = self._make_cgroups()
        if plan is None:
            return popen(list(cmd), **kwargs)
        preexec = kwargs.get("preexec_fn")
        if preexec is None:  # Popen may vfork: the command enters them itself
            cmd = join_command(plan.procs, cmd)
        else:  # it forks anyway: enter them before the preexec_fn drops root
            kwargs = {**kwargs, "preexec_fn": join_then(plan.procs, preexec)}
        try:
            return popen(list(cmd), **kwargs)
        except BaseException:
            self._cgroups = ()
            self._remove(plan.cgroups)
            raise

    def _make_cgroups(self) -> CgroupPlan | None:
        if self.share is None:
            return None
        if self._cgroups:  # an earlier start's, never removed
            cgroups, self._cgroups = self._cgroups, ()
            self._remove(cgroups)
        name = cgroup_name(self.user.name, self.name, new_token())
        share = self.share
        try:
            hierarchies = find_hierarchies()
            devices = gpu_device_rules(self.notebook_gpus(), Path(self.nvidia_proc_dir))
            limits = Limits(share, pids_limit(share, self.pids_per_gib), devices)
            plan = plan_cgroup(hierarchies, parent_parts(self.cgroup_parent), name, limits)
            make_cgroup(plan)
        except CgroupError as e:
            self._unenforced(self.share, e)
            return None
        for missing in unconfined(hierarchies):
            self.log.warning("%s: the notebook is not held to %s", log_name(self), missing)
        self._cgroups = plan.cgroups
        self._balance(plan.cgroups)
        return plan

    def notebook_gpus(self) -> tuple[str, ...]:
        """The GPUs (``GPU-<uuid>``) whose device nodes the notebook may open: its
        machine's. An index (a fabric without UUIDs) names no node: the driver lists
        none by index, so such a notebook opens no GPU's."""
        selection = gpu_selection(self.machine) if self.machine is not None else ""
        return tuple(selection.split(",")) if selection else ()

    def _balance(self, cgroups: tuple[Path, ...]) -> None:
        """The notebooks' parents weigh as their notebooks (see parent_cpu_weight)."""
        try:
            balance_cpu_weight({cgroup.parent for cgroup in cgroups})
        except CgroupError as e:
            self.log.warning("%s: %s; notebooks share CPU as one process", log_name(self), e)

    def _unenforced(self, share: Share, error: CgroupError) -> None:
        """Refuse the start (``cgroup_required``), or say that it runs unlimited."""
        fix = (
            "Run the hub as root with the cgroup controllers cpu and memory mounted"
            " read-write, or set c.LocalLauncher.cgroup_required = False to run such"
            " notebooks without limits."
        )
        if not self.cgroup_required:
            self.log.warning(
                "%s: runs without its share (%d cores, %d GiB) enforced: %s",
                log_name(self),
                share.cores,
                share.memory_gib,
                error,
            )
            return
        self.log.error("%s: its share cannot be enforced: %s. %s", log_name(self), error, fix)
        raise SpawnRefused(
            f"Your server was not started: this host cannot hold it to its share"
            f" ({share.cores} cores, {share.memory_gib} GiB of memory), so it would take"
            " from the servers beside it. Its devices were given back. Tell the hub's"
            " administrators (the hub's log says what to change).",
            reason="share",
            status_code=503,
        )

    def remove_leftovers(self) -> asyncio.Future[None]:
        """Remove this notebook's cgroups, taken now (a later start's are its own); done
        once every removal asked for before it is done too (a stop's is the last)."""
        cgroups, self._cgroups = self._cgroups, ()
        earlier = self._cgroups_removal
        self._cgroups_removal = asyncio.ensure_future(self._removed(cgroups, earlier))
        return self._cgroups_removal

    async def _removed(
        self, cgroups: tuple[Path, ...], earlier: asyncio.Future[None] | None
    ) -> None:
        if cgroups:
            await whole_in_thread(self._remove, cgroups)
        if earlier is not None:
            await asyncio.wait([earlier])

    def _remove(self, cgroups: tuple[Path, ...]) -> None:
        try:
            remove_cgroups(cgroups, REMOVE_TIMEOUT)
        except CgroupError as e:
            self.log.warning(
                "%s: %s; remove it (rmdir) once its processes have ended", log_name(self), e
            )
        self._balance(cgroups)
        self._remove_leftover_ipc()

    def notebook_uid(self) -> int | None:
        """The account the notebook runs as (LocalProcessSpawner's: the user's own);
        None where it has none here."""
        try:
            return pwd.getpwnam(self.user.name).pw_uid
        except KeyError:
            return None

    def _remove_leftover_ipc(self) -> None:
        """What the notebook's account left in shared memory (:mod:`.ipc`), once no
        process of it is left on the host (another notebook, after a hub restart too);
        never the hub's own."""
        uid = self.notebook_uid()
        if uid is None or uid == os.geteuid():
            return
        removed = remove_ipc_of(uid)
        if removed:
            self.log.info("%s: removed %d shared-memory objects left", log_name(self), removed)

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        await self.remove_leftovers()

    async def poll(self) -> int | None:
        status: int | None = await super().poll()
        if status is not None:  # the hub never calls stop() for a server poll found gone
            await self.remove_leftovers()
        return status

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self._cgroups:  # paths: a later cgroup_parent must not lose them
            state["cgroups"] = [str(cgroup) for cgroup in self._cgroups]
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        cgroups = state.get("cgroups")
        if isinstance(cgroups, list):
            self._cgroups = tuple(Path(cgroup) for cgroup in cgroups)
