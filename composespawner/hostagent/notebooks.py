"""What the agent does on its host: start, stop, poll, list and watch notebooks.

A start checks first and does after: the account (never a system one), the
GPUs (present, and not another notebook's), the share (fits beside the
running ones), all under the state folder's lock, so nothing is done for a
refused request. Then it makes the cgroup, starts the process as the account
and writes the record; a failure after any of that undoes it.

How the process is started: :mod:`.starting`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from composespawner.domain.hardware import Share
from composespawner.hostagent.accounts import (
    create_account,
    existing_account,
    open_the_way,
    stack_program_refusal,
)
from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.decisions import Record, notebook_env, start_refusal
from composespawner.hostagent.starting import (
    Say,
    StartFailed,
    deliver,
    notebook_command,
    popen_as,
    resolved_gpus,
    stack_environment,
)
from composespawner.hostagent.state import StateDir, alive
from composespawner.launchers.accounts import AccountError
from composespawner.launchers.agent_protocol import Refused, StartNotebook, reply
from composespawner.launchers.cgroups import (
    REMOVE_TIMEOUT,
    CgroupError,
    Hierarchy,
    Limits,
    balance_cpu_weight,
    cgroup_name,
    find_hierarchies,
    make_cgroup,
    new_token,
    pids_limit,
    plan_cgroup,
    remove_cgroups,
    unconfined,
)
from composespawner.launchers.gpu_devices import gpu_device_rules
from composespawner.launchers.ipc import remove_ipc_of
from composespawner.launchers.processes import process_started

STOP_GRACE = 8.0  # seconds between SIGTERM and what is left being killed
WATCH_EVERY = 0.5  # seconds between a watch's looks at the notebooks
log = logging.getLogger("composespawner.hostagent")
DAY = 86_400.0  # seconds

__all__ = ["Notebooks", "StartFailed"]


class Notebooks:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state = StateDir(config.state_dir)

    # -- start ---------------------------------------------------------------------

    def start(self, request: StartNotebook, say: Say) -> dict[str, Any]:
        """Start the notebook; Refused (nothing done) or StartFailed (undone)."""
        listen = self.config.listen_address
        if not listen:
            raise StartFailed("no listen_address configured, and SSH_CONNECTION is not set")
        # Compared, held and given to the notebook by the UUIDs the host lists, whatever
        # names the request used.
        request = replace(request, gpus=resolved_gpus(request, self.config))
        with self.state.locked():
            self._check_fits(request)
            account = existing_account(request.user, self.config)
            if account is None:
                try:
                    account = create_account(request.user, self.config)
                except AccountError as e:
                    raise StartFailed(str(e)) from e
        environment = stack_environment(request, self.config, say)
        command = notebook_command(self.config, environment)
        try:  # the configured command's way, never one a stack's files name (see open_the_way)
            open_the_way(self.config.notebook_command)
        except AccountError as e:
            raise StartFailed(str(e)) from e
        if environment is not None:
            configured = self.config.notebook_command[0]
            refusal = stack_program_refusal(command[0], environment.path, configured)
            if refusal:
                raise StartFailed(refusal)
        with self.state.locked():
            self._check_fits(request)  # again: another start may have come meanwhile
            return self._launch(request, account, command, environment)

    def _share(self, request: StartNotebook) -> Share:
        if request.cores is None or request.memory_gib is None:  # the whole host
            return Share(self.config.cores, self.config.memory_gib)
        return Share(request.cores, request.memory_gib)

    def _limits(self, request: StartNotebook) -> Limits:
        share = self._share(request)
        devices = gpu_device_rules(request.gpus, self.config.nvidia_proc_dir)
        return Limits(share, pids_limit(share, self.config.pids_per_gib), devices)

    def _hierarchies(self) -> tuple[Hierarchy, ...]:
        found = find_hierarchies()
        for missing in unconfined(found):
            log.warning("notebooks here are not held to %s", missing)
        return found

    def _check_fits(self, request: StartNotebook) -> None:
        share = self._share(request)
        refusal = start_refusal(
            request.machine,
            request.gpus,
            (share.cores, share.memory_gib),
            self.running(),
            (self.config.cores, self.config.memory_gib),
            request.gpu_share,
        )
        if refusal:
            raise Refused(refusal)

    def _launch(
        self, request: StartNotebook, account: Any, command: list[str], environment: Any
    ) -> dict[str, Any]:
        """Under the lock: port, cgroup, run manifest, process, record; undone on failure."""
        from composespawner.launchers.ports import NoFreePort, notebook_port

        listen = self.config.listen_address
        try:
            port = notebook_port(listen, {r.port for r in self.state.records()})
        except NoFreePort as e:
            raise StartFailed(str(e)) from e
        share = self._share(request)
        name = cgroup_name(request.user, request.server, new_token())
        try:
            plan = plan_cgroup(
                self._hierarchies(), self.config.cgroup_parent, name, self._limits(request)
            )
            make_cgroup(plan)
        except CgroupError as e:
            raise StartFailed(f"cannot hold the notebook to its share: {e}") from e
        process: subprocess.Popen[bytes] | None = None
        try:
            self._balance(plan.cgroups)
            extra = deliver(request, account, environment)
            bin_dir = str(environment.bin) if environment else str(Path(command[0]).parent)
            env = notebook_env(
                request.env,
                (account.pw_name, account.pw_dir, account.pw_shell),
                request.gpus,
                (listen, port),
                bin_dir,
                extra,
            )
            output = self.state.log_path(request.machine)
            process = popen_as(account, [*command, *request.args], env, plan.procs, output)
            started = process_started(process.pid)
            if started is None:
                raise StartFailed(
                    f"the notebook exited at once (status {process.wait()}); its output is in"
                    f" {self.state.log_path(request.machine)} on the host"
                )
            record = Record(
                machine=request.machine,
                user=account.pw_name,
                uid=account.pw_uid,
                server=request.server,
                pid=process.pid,
                started=started,
                port=port,
                gpus=request.gpus,
                cores=share.cores,
                memory_gib=share.memory_gib,
                cgroups=tuple(str(c) for c in plan.cgroups),
                gpu_share=request.gpu_share,
            )
            self.state.write(record)
        except BaseException as e:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            self._remove_cgroups(plan.cgroups)
            if isinstance(e, StartFailed | Refused):
                raise
            raise StartFailed(f"the notebook could not be started: {e}") from e
        log.info(
            "started %s's notebook for machine %s: pid %d on %s:%d, %d cores, %d GiB, GPUs %s",
            account.pw_name,
            request.machine,
            process.pid,
            listen,
            port,
            share.cores,
            share.memory_gib,
            ",".join(request.gpus) or "none",
        )
        return {"ip": listen, "port": port, "pid": process.pid}

    # -- the other ops -----------------------------------------------------------------

    def stop(self, machine: str) -> dict[str, Any]:
        """SIGTERM, a grace, then whatever is left in its cgroups is killed."""
        with self.state.locked():  # a start of it now under way has written its record
            record = self.state.read(machine)
        if record is None:
            return {"status": None}
        if alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGTERM)  # its session's group (start_new_session)
            deadline = time.monotonic() + STOP_GRACE
            while alive(record) and time.monotonic() < deadline:
                time.sleep(0.05)  # the process is not ours to wait for: /proc says
        self.end(record)
        log.info("stopped %s's notebook for machine %s (pid %d)", record.user, machine, record.pid)
        return {"status": None}

    def poll(self, machine: str) -> dict[str, Any]:
        record = self.state.read(machine)
        if record is not None and alive(record):
            return {"running": True, "status": None}
        if record is not None:
            self.end(record)
            log.info("machine %s's notebook (pid %d) has exited", machine, record.pid)
        return {"running": False, "status": None}

    def running(self) -> list[Record]:
        """The notebooks still running; those that are gone are cleaned up (under the lock)."""
        records = []
        for record in self.state.records():
            if alive(record):
                records.append(record)
            else:
                self.end(record, locked=True)
        return records

    def listed(self) -> dict[str, Any]:
        return {"notebooks": [record.listed() for record in self.running()]}

    def watch(self, say: Say, closed_fd: int, every: float = WATCH_EVERY) -> None:
        """Say each notebook that exits, until ``closed_fd`` (stdout) is closed by the hub."""
        # The request ended with EOF on stdin, so the channel's end is seen on stdout:
        # a pipe whose reader went away polls POLLERR (sshd's, once the channel closes).
        poller = select.poll()
        poller.register(closed_fd, select.POLLERR | select.POLLHUP)
        while True:
            for record in self.state.records():
                if not alive(record):
                    self.end(record)
                    log.info(
                        "machine %s's notebook (pid %d) has exited", record.machine, record.pid
                    )
                    say(reply(exited=record.machine, status=None))
            if poller.poll(int(every * 1000)):
                return

    def end(self, record: Record, locked: bool = False) -> None:
        """Remove a notebook's cgroups (ending what is left in them), then its record
        (under the lock, which ``locked`` says is held: a start may be writing a new one)."""
        self._remove_cgroups(tuple(Path(c) for c in record.cgroups))
        if locked:
            self._forget(record)
        else:
            with self.state.locked():
                self._forget(record)
        # Its log stays for a while (why did it exit?); older ones go, or they pile up.
        self.state.prune_logs(older_than=time.time() - self.config.keep_logs_days * DAY)

    def _forget(self, record: Record) -> None:
        """Under the lock: its record gone, and what the account left in shared memory
        too where nothing of it runs any more (another of its notebooks, a login, a cron
        job, a process its cgroup's removal could not end: :func:`remove_ipc_of` looks):
        no start of its next notebook meanwhile."""
        self.state.remove(record)
        removed = remove_ipc_of(record.uid)
        if removed:
            log.info("removed %d shared-memory objects %s left", removed, record.user)

    def _remove_cgroups(self, cgroups: tuple[Path, ...]) -> None:
        try:
            remove_cgroups(cgroups, REMOVE_TIMEOUT)
        except CgroupError as e:
            log.error("%s; remove it (rmdir) once its processes have ended", e)
        self._balance(cgroups)

    def _balance(self, cgroups: tuple[Path, ...]) -> None:
        try:
            balance_cpu_weight({cgroup.parent for cgroup in cgroups})
        except CgroupError as e:
            log.warning("%s; notebooks share CPU as one process", e)
