"""What the agent does on its host: start, stop, poll, list and watch notebooks.

A start checks first and does after: the account (never a system one), the
GPUs (present, and not another notebook's), the share (fits beside the
running ones), so nothing is done for a refused request. The state folder's
lock is held only to decide: the checks, then (again, after the account is
made and the stack's environment built or its image pulled) the reservation of
the share, GPUs, port and names, as a record of the starting agent's own
process. The notebook is started outside it and its record written; a failure
after the reservation undoes it, and a reservation whose agent died ends as a
notebook that is gone does.

How: :mod:`.starting` (the process runtime: a cgroup made, the process started as the
account) and :mod:`.containers` (the containers runtime: ``podman run`` of the stack's
image, pulled first, outside the lock).
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
from composespawner.hostagent.containers import (
    ContainerStart,
    pull_once,
    remove_container,
    stop_container,
)
from composespawner.hostagent.decisions import Record, runtime_refusal, start_refusal
from composespawner.hostagent.starting import (
    NotebookStart,
    ProcessStart,
    Say,
    StartFailed,
    notebook_command,
    remove_cgroups_of,
    resolved_gpus,
    stack_environment,
)
from composespawner.hostagent.state import StateDir, alive
from composespawner.launchers.accounts import AccountError
from composespawner.launchers.agent_protocol import Refused, StartNotebook, reply
from composespawner.launchers.ipc import remove_ipc_of
from composespawner.launchers.processes import process_started

SETTLE_TIMEOUT = 60.0  # seconds a stop waits for a start of the same machine to be done
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
        refusal = runtime_refusal(self.config.runtime, request.image)
        if refusal:
            raise Refused(refusal)
        # Compared, held and given to the notebook by the UUIDs the host lists, whatever
        # names the request used.
        request = replace(request, gpus=resolved_gpus(request, self.config))
        with self.state.locked():
            self._check_fits(request)
        account = self._account(request.user)
        if request.image is not None:  # the runtime is containers
            _open_the_way(())  # the agent's Python writes the run manifest as the account
            pull = pull_once(self.config, request.image, say)
            starting: NotebookStart = ContainerStart(self.config, request, account, pull)
        else:
            starting = self._process_start(request, account, say)
        with self.state.locked():
            self._check_fits(request)  # again: another start may have come meanwhile
            reservation = self._reserve(request, account, starting)
        return self._launch(request, starting, reservation)

    def _account(self, user: str) -> Any:
        """The user's account, made where the config says; outside the state lock, as
        many at a time as start (useradd holds the passwd files' own lock while it
        writes them, and one made meanwhile by another start is taken as it is)."""
        account = existing_account(user, self.config)
        if account is not None:
            return account
        try:
            return create_account(user, self.config)
        except AccountError as e:
            raise StartFailed(str(e)) from e

    def _process_start(self, request: StartNotebook, account: Any, say: Say) -> ProcessStart:
        """The process runtime's start: the stack's environment built (outside the lock)."""
        environment = stack_environment(request, self.config, say)
        command = notebook_command(self.config, environment)
        _open_the_way(self.config.notebook_command)
        if environment is not None:
            configured = self.config.notebook_command[0]
            refusal = stack_program_refusal(command[0], environment.path, configured)
            if refusal:
                raise StartFailed(refusal)
        return ProcessStart(self.config, request, account, command, environment)

    def _share(self, request: StartNotebook) -> Share:
        if request.cores is None or request.memory_gib is None:  # the whole host
            return Share(self.config.cores, self.config.memory_gib)
        return Share(request.cores, request.memory_gib)

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

    def _reserve(self, request: StartNotebook, account: Any, starting: NotebookStart) -> Record:
        """Under the lock: the notebook's port, cgroups and container named, and held by a
        record of this agent's own process (``starting``): every later check counts it,
        and should this agent die before the notebook runs, its record ends like any
        other notebook's that is gone, with what it named."""
        from composespawner.launchers.ports import NoFreePort, notebook_port

        try:
            port = notebook_port(self.config.listen_address, {r.port for r in self.state.records()})
        except NoFreePort as e:
            raise StartFailed(str(e)) from e
        share = self._share(request)
        agent = os.getpid()
        started = process_started(agent)
        assert started is not None  # this very process
        reservation = Record(
            machine=request.machine,
            user=account.pw_name,
            uid=account.pw_uid,
            server=request.server,
            pid=agent,
            started=started,
            port=port,
            gpus=request.gpus,
            cores=share.cores,
            memory_gib=share.memory_gib,
            cgroups=tuple(str(c) for c in starting.plan(share)),
            gpu_share=request.gpu_share,
            container=starting.container,
            starting=True,
        )
        self.state.write(reservation)
        return reservation

    def _launch(
        self, request: StartNotebook, starting: NotebookStart, reservation: Record
    ) -> dict[str, Any]:
        """Outside the lock: the notebook started on its reservation, which becomes its
        record (under the lock, briefly); undone on failure."""
        share, port = self._share(request), reservation.port
        process: subprocess.Popen[bytes] | None = None
        try:
            output = self.state.log_path(request.machine)
            process = starting.popen(port, share, output)
            started = process_started(process.pid)
            if started is None:
                raise StartFailed(
                    f"the notebook exited at once (status {process.wait()}); its output is in"
                    f" {output} on the host"
                )
            record = replace(reservation, pid=process.pid, started=started, starting=False)
            with self.state.locked():
                if self.state.read(request.machine) != reservation:
                    raise StartFailed("the notebook was stopped while it started")
                self.state.write(record)
        except BaseException as e:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            starting.undo()
            with self.state.locked():
                self.state.remove(reservation)
            if isinstance(e, StartFailed | Refused):
                raise
            raise StartFailed(f"the notebook could not be started: {e}") from e
        log.info(
            "started %s's notebook for machine %s: pid %d on %s:%d, %d cores, %d GiB, GPUs %s%s",
            record.user,
            request.machine,
            process.pid,
            self.config.listen_address,
            port,
            share.cores,
            share.memory_gib,
            ",".join(request.gpus) or "none",
            f", in container {starting.container} of {request.image}" if starting.container else "",
        )
        return {"ip": self.config.listen_address, "port": port, "pid": process.pid}

    # -- the other ops -----------------------------------------------------------------

    def stop(self, machine: str) -> dict[str, Any]:
        """SIGTERM, a grace, then whatever is left in its cgroups is killed."""
        record = self._settled(machine)
        if record is None:
            return {"status": None}
        if alive(record) and record.container:
            stop_container(self.config, record.container, STOP_GRACE)
        if alive(record):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGTERM)  # its session's group (start_new_session)
            deadline = time.monotonic() + STOP_GRACE
            while alive(record) and time.monotonic() < deadline:
                time.sleep(0.05)  # the process is not ours to wait for: /proc says
        self.end(record)
        log.info("stopped %s's notebook for machine %s (pid %d)", record.user, machine, record.pid)
        return {"status": None}

    def _settled(self, machine: str) -> Record | None:
        """The machine's record once a start of it under way has its notebook running
        (or has failed), waited for a while; after that, the reservation as it is (its
        end ends what the start made)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            record = self.state.read(machine)
            if record is None or not record.starting or not alive(record):
                return record
            if time.monotonic() > deadline:
                log.warning("machine %s is still starting: stopping what it has", machine)
                return record
            time.sleep(0.05)  # the start's own agent writes the record: a file to look at

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
        """Remove a notebook's cgroups (ending what is left in them) or its container, then
        its record (under the lock, which ``locked`` says is held: a start may be writing
        a new one)."""
        if record.container:
            remove_container(self.config, record.container, record.machine)
        remove_cgroups_of(tuple(Path(c) for c in record.cgroups))
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


def _open_the_way(configured: tuple[str, ...]) -> None:
    """The way to the configured command and the agent's Python open to the accounts,
    never one a stack's files name (see open_the_way)."""
    try:
        open_the_way(configured)
    except AccountError as e:
        raise StartFailed(str(e)) from e
