"""The steps of a start that touch the host, one function each (see :mod:`.notebooks`).

The notebook's process: Popen forks the agent, and the child, still root,
enters the notebook's cgroups, takes the account's groups and ids, forbids
itself new privileges (no setuid program lifts it back) and enters the home;
only then does it exec the notebook with the request's environment. No root
process ever runs with what the hub sent (an LD_PRELOAD, had it passed the
protocol, would load only into the user's own process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from composespawner.domain.hardware import Share
from composespawner.hostagent import logsink
from composespawner.hostagent.config import NOTEBOOK_SERVER, AgentConfig
from composespawner.hostagent.decisions import notebook_env, parse_gpu_list, resolve_gpus
from composespawner.launchers import notebook_files
from composespawner.launchers.accounts import becoming
from composespawner.launchers.agent_protocol import StartNotebook, reply
from composespawner.launchers.cgroups import (
    REMOVE_TIMEOUT,
    CgroupError,
    CgroupPlan,
    Limits,
    balance_cpu_weight,
    cgroup_name,
    find_hierarchies,
    join_then,
    make_cgroup,
    new_token,
    pids_limit,
    plan_cgroup,
    remove_cgroups,
    unconfined,
)
from composespawner.launchers.gpu_devices import gpu_device_rules

GPU_LIST_TIMEOUT = 15.0  # seconds for nvidia-smi, which can be slow on a busy host
MANIFEST_TIMEOUT = 30.0  # seconds to write the run manifest: a home on NFS may be slow
LOG_CAP = 64 << 20  # bytes of a notebook's output kept in state_dir (the most recent)
# The pids of the log sinks this agent forked: not waited for here (they end with their
# notebooks, after this agent has exited); a test in one process waits for them.
SINKS: list[int] = []
log = logging.getLogger("composespawner.hostagent")
Say = Callable[[bytes], None]


class StartFailed(Exception):
    """The start failed on the host (what was begun is undone); the message says why."""


class NotebookStart(Protocol):
    """One notebook being started, in the steps the agent takes: :meth:`plan` under its
    state lock (what the reservation names), :meth:`popen` outside it, :meth:`undo` on
    any failure after the plan. :class:`ProcessStart` and
    :class:`~composespawner.hostagent.containers.ContainerStart` are the two."""

    container: str  # the container's name, or "" (the process runtime)
    cgroups: tuple[Path, ...]  # the cgroups the agent made for it (none for a container)

    def plan(self, share: Share) -> tuple[Path, ...]:
        """The cgroups the notebook will run in, named (made by :meth:`popen`)."""
        ...

    def popen(self, port: int, share: Share, log_path: Path) -> subprocess.Popen[bytes]:
        """The notebook's process, its output in ``log_path``."""
        ...

    def undo(self) -> None:
        """What the start made, gone."""
        ...


class ProcessStart:
    """One notebook's process being started as its account, in cgroups of the agent's
    (made first, so that a failure anywhere removes them: :meth:`undo`)."""

    container = ""  # none: the process runtime

    def __init__(
        self,
        config: AgentConfig,
        request: StartNotebook,
        account: pwd.struct_passwd,
        command: list[str],
        environment: Any,
    ) -> None:
        self.config, self.request, self.account = config, request, account
        self.command, self.environment = command, environment
        self.cgroups: tuple[Path, ...] = ()
        self._plan: CgroupPlan | None = None

    def plan(self, share: Share) -> tuple[Path, ...]:
        """The notebook's cgroups, named (not made yet: :meth:`popen` makes them)."""
        request = self.request
        found = find_hierarchies()
        for missing in unconfined(found):
            log.warning("notebooks here are not held to %s", missing)
        devices = gpu_device_rules(request.gpus, self.config.nvidia_proc_dir)
        limits = Limits(share, pids_limit(share, self.config.pids_per_gib), devices)
        name = cgroup_name(request.user, request.server, new_token())
        try:
            self._plan = plan_cgroup(found, self.config.cgroup_parent, name, limits)
        except CgroupError as e:
            raise StartFailed(f"cannot hold the notebook to its share: {e}") from e
        self.cgroups = self._plan.cgroups
        return self.cgroups

    def popen(self, port: int, share: Share, log_path: Path) -> subprocess.Popen[bytes]:
        request, account, plan = self.request, self.account, self._plan
        assert plan is not None, "planned first"
        try:
            make_cgroup(plan)
        except CgroupError as e:
            raise StartFailed(f"cannot hold the notebook to its share: {e}") from e
        balance(plan.cgroups)
        extra = deliver(request, account, self.environment)
        environment = self.environment
        bin_dir = str(environment.bin) if environment else str(Path(self.command[0]).parent)
        env = notebook_env(
            request.env,
            (account.pw_name, account.pw_dir, account.pw_shell),
            request.gpus,
            (self.config.listen_address, port),
            bin_dir,
            extra,
        )
        return popen_as(account, [*self.command, *request.args], env, plan.procs, log_path)

    def undo(self) -> None:
        remove_cgroups_of(self.cgroups)


def remove_cgroups_of(cgroups: tuple[Path, ...]) -> None:
    """A notebook's cgroups gone (what is left in them ended), its neighbours' CPU weights
    balanced again."""
    try:
        remove_cgroups(cgroups, REMOVE_TIMEOUT)
    except CgroupError as e:
        log.error("%s; remove it (rmdir) once its processes have ended", e)
    balance(cgroups)


def balance(cgroups: tuple[Path, ...]) -> None:
    """The CPU weights of the notebooks beside ``cgroups``, set by their shares."""
    try:
        balance_cpu_weight({cgroup.parent for cgroup in cgroups})
    except CgroupError as e:
        log.warning("%s; notebooks share CPU as one process", e)


def resolved_gpus(request: StartNotebook, config: AgentConfig) -> tuple[str, ...]:
    """The request's GPUs as this host's UUIDs (:func:`.decisions.resolve_gpus`): Refused
    for one the host lacks or names twice, or an index where the host lists no GPUs."""
    if not request.gpus:
        return ()
    if not config.gpu_list_command:
        log.warning("no gpu_list_command: not checking that %s are on this host", request.gpus)
        return resolve_gpus(request.gpus, None)
    try:
        done = subprocess.run(
            config.gpu_list_command,
            capture_output=True,
            text=True,
            timeout=GPU_LIST_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StartFailed(f"cannot list this host's GPUs: {e}") from e
    if done.returncode != 0:
        raise StartFailed(f"cannot list this host's GPUs: {done.stderr.strip()[-300:]}")
    return resolve_gpus(request.gpus, parse_gpu_list(done.stdout))


def stack_environment(request: StartNotebook, config: AgentConfig, say: Say) -> Any:
    """The request's stack environment (a StackEnvironment), built if need be; None without."""
    if request.stack is None:
        return None
    from composespawner.hostagent.stacks import environment_for
    from composespawner.launchers.environments import StackBuildError

    def progress(message: str, percent: int) -> None:
        say(reply(progress=message, percent=percent))

    try:
        return environment_for(request.stack, config, progress)
    except StackBuildError as e:
        raise StartFailed(str(e)) from e


def notebook_command(config: AgentConfig, environment: Any) -> list[str]:
    """The configured command; a stack's own notebook server replaces the default one."""
    command = list(config.notebook_command)
    if environment is not None and Path(command[0]).name == NOTEBOOK_SERVER:
        command[0] = str(environment.bin / NOTEBOOK_SERVER)
    return command


def deliver(request: StartNotebook, account: pwd.struct_passwd, environment: Any) -> dict[str, str]:
    """The run manifest in the home (as the local launcher writes it), and the
    variables that say where it and the stack's environment are."""
    extra: dict[str, str] = {}
    if environment is not None:
        extra["VIRTUAL_ENV"] = str(environment.path)
        extra["COMPOSE_STACK_MANIFEST"] = str(environment.manifest)
        if request.stack is not None:
            extra["COMPOSE_STACK_LOCK_SHA256"] = request.stack.lock_sha256
    if request.manifest is not None:
        name = f"{request.server or 'default'}.run.json"
        path = Path(account.pw_dir) / ".composespawner" / name
        data = (json.dumps(request.manifest, indent=2) + "\n").encode()
        write_as(account, path, data)
        extra["COMPOSE_RUN_MANIFEST"] = str(path)
    return extra


def write_as(account: pwd.struct_passwd, path: Path, data: bytes) -> None:
    """Write ``path`` in the home as the account itself, as the local launcher writes it
    (:func:`~composespawner.launchers.notebook_files.write_for_notebook`: a 0444 file
    made exclusively, no link followed), by a forked child switched to the account.

    Not as root: on a root-squashed NFS home root is nobody, and may not write there.
    Not in ``state_dir`` instead: that is root's alone, and the manifest stays where
    the local launcher puts it. As the account, no link it planted can take a write
    anywhere it could not write itself. A fork, not a new program: a Python started
    for this was a tenth of a start's work on the host. Once its ids are the account's
    the child may not be traced or dumped by it (the kernel's rule for a process whose
    ids changed), and it ends by ``MANIFEST_TIMEOUT``'s alarm if the home hangs.
    """
    why = f"cannot write the run manifest {path} as {account.pw_name}"
    become = becoming(account, account.pw_dir)
    reader, writer = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(reader)
        os.close(writer)
        raise StartFailed(f"{why}: {e}") from e
    if pid == 0:
        _write_in_child(become, path, data, reader, writer)
    os.close(writer)
    with os.fdopen(reader, "rb") as said:
        error = said.read(4096).decode(errors="replace")
    _, wait_status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    if code != 0:
        raise StartFailed(f"{why}: {error or f'ended by signal {-code}'}")


def _write_in_child(
    become: Callable[[], None], path: Path, data: bytes, reader: int, writer: int
) -> NoReturn:
    """In :func:`write_as`'s child: ``become`` the account, write, and exit (never
    return); what failed goes to ``writer``."""
    status = 1
    try:
        os.close(reader)
        signal.alarm(int(MANIFEST_TIMEOUT))  # its default action ends this child
        become()
        notebook_files.write_for_notebook(path, data, None)
        status = 0
    except BaseException as e:  # the parent says why; this child only ends
        with contextlib.suppress(OSError):
            os.write(writer, f"{type(e).__name__}: {e}"[-300:].encode())
    finally:
        os._exit(status)


def popen_as(
    account: pwd.struct_passwd,
    command: list[str],
    env: dict[str, str],
    procs: tuple[Path, ...],
    log_path: Path,
    cap: int = LOG_CAP,
) -> subprocess.Popen[bytes]:
    """The notebook's process as ``account`` in the cgroups of ``procs``, its output in
    ``log_path`` (root's: not in the home, where the user could swap it for a link),
    through :mod:`.logsink`, which keeps the log under ``cap`` bytes."""
    # Entering the cgroups goes first: it needs root, which the rest gives up.
    become = join_then(procs, becoming(account, account.pw_dir))
    return popen_logged(command, env, log_path, become, procs=procs, cap=cap)


def popen_logged(
    command: list[str],
    env: dict[str, str],
    log_path: Path,
    preexec: Callable[[], Any] | None,
    procs: tuple[Path, ...] = (),
    cap: int = LOG_CAP,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own, after ``preexec``, its output in ``log_path``
    through its log sink (:func:`fork_sink`: in the cgroups of ``procs``, it ends with
    them, or when the output ends)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW
    log_fd = os.open(log_path, flags, 0o600)
    reader, writer = os.pipe()
    try:
        SINKS.append(fork_sink(reader, log_fd, cap, procs))
        return subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=writer,
            stderr=writer,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=pass_fds,
        )
    finally:  # the sink sees EOF once the notebook (and what it started) is gone
        for fd in (log_fd, reader, writer):
            os.close(fd)


def fork_sink(source: int, log_fd: int, cap: int, procs: tuple[Path, ...]) -> int:
    """A log sink (:func:`.logsink.drain` of ``source`` into ``log_fd``, under ``cap``
    bytes) in a session of its own and the cgroups of ``procs``; its pid.

    A fork of this agent, which has its code loaded already: a Python started for it
    would cost every notebook's start about 15 ms of CPU more, and a class starts at
    once. It keeps no descriptor but its own two: one of sshd's pipes held open would
    keep the hub's channel from ending.
    """
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        os.setsid()
        with contextlib.suppress(OSError):  # outside them it still ends at the output's end
            join_then(procs, None)()
        os.dup2(source, 0)
        os.dup2(log_fd, 1)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2:
                with contextlib.suppress(OSError):  # the listing's own, closed already
                    os.close(fd)
        logsink.drain(0, 1, cap)
        status = 0
    finally:
        os._exit(status)
