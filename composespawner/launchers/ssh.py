"""The SSH launcher: the notebook runs on the composed host, started by its agent.

After composing, the hub reaches the machine's host over SSH, with the host's
key pinned in ``known_hosts`` and the hub's own key, which each host authorizes
only for one forced command: ``composespawner-host``, the host agent
(:mod:`composespawner.hostagent`). The launcher asks it to start the notebook
as the user's account on that host, held to the machine's share and shown only
its GPUs (:mod:`.agent_protocol`); the notebook listens on the host's address,
where the hub's proxy routes. The host's agent also reports each notebook's
exit as it happens, over a channel the hub keeps open per host: the machine is
released then, not at the next poll.

A notebook whose stop could not reach its host (or whose start the hub gave up
on) is not left there: each time a host's watch is made, the hub lists what its
agent runs and stops every notebook whose machine the ledger has as ended
(stopping, released or failed). One the ledger does not know (another hub's)
is left alone: unknown is not dead.

Which address a host has comes from ``hosts``, the hub's host table, keyed by
the fabric's ``ComputerSystem`` Id: the address and the key pinned for it in
``known_hosts`` come from the same trusted source (the deployment's inventory),
whereas a fabric's ``HostName`` is the fabric manager's label, not what SSH pins.

One SSH connection per host serves every launcher of the hub (:mod:`.ssh_links`).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, ClassVar

import asyncssh
from jupyterhub.spawner import Spawner

from composespawner.domain.catalog import Kit, Stack
from composespawner.domain.machine import nvidia_visible_devices
from composespawner.launchers.agent_protocol import (
    PollNotebook,
    Progress,
    Refused,
    StackSource,
    StopNotebook,
)
from composespawner.launchers.base import Launcher, SpawnRefused
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.ssh_links import (
    LIST_TIMEOUT,
    AgentFailed,
    AgentRefused,
    AgentUnintelligible,
    HostLink,
    HostLinks,
    LinkHooks,
    LinkSettings,
    Trips,
    describe,
)
from composespawner.launchers.ssh_requests import (
    host_key_problem,
    host_refusal,
    orphans,
    parse_address,
    stack_refusal,
    start_request,
    unreachable,
)
from composespawner.launchers.ssh_settings import SSHSettings
from composespawner.launchers.stack_sources import stack_source as read_stack_source
from composespawner.ledger import LedgerRunner

# What reaching a host can raise (the agent's own answers aside).
UNREACHABLE = (OSError, TimeoutError, asyncssh.Error, AgentUnintelligible)
# Of those, the ones raised before a request could reach the agent: nothing started.
NEVER_SENT = (
    ConnectionRefusedError,
    asyncssh.HostKeyNotVerifiable,
    asyncssh.PermissionDenied,
    asyncssh.ChannelOpenError,  # the host's sshd refused the channel
)

# The ledger's state of each of the machines asked about that it knows.
MachineStates = Callable[[Collection[str]], Awaitable[Mapping[str, str]]]


class SSHLauncher(SSHSettings, Launcher, Spawner):
    """Start the notebook on the machine's host through that host's agent, over SSH."""

    # Every host's link of this hub process, and which launcher runs which machine on
    # which host: the host's exit watch tells the right one.
    links: ClassVar[HostLinks] = HostLinks()
    _running: ClassVar[dict[tuple[str, str], weakref.ref[SSHLauncher]]] = {}
    # Notebooks whose stop could not reach their host, by ((address, port), machine): the
    # host is watched until it is reached again, and they are stopped then.
    _owed: ClassVar[set[tuple[tuple[str, int], str]]] = set()
    # How the hosts' orphans are told from the notebooks this hub runs (the ledger's states).
    _ledger_states: ClassVar[MachineStates | None] = None

    _where = ""  # the host's address:port the notebook runs at
    _host_id = ""
    _machine_id = ""
    _exit_status: int | None = None  # the status its host's watch saw it exit with
    _asked_at = 0.0  # when its host last said it runs (monotonic)
    _manifest: dict[str, Any] | None = None
    _run_manifest: str | None = None
    _stack_source: StackSource | None = None
    _late_stop: asyncio.Future[None] | None = None  # the stop of a start given up on

    # -- before the start -------------------------------------------------------------

    def check_stack(self, stack: Stack) -> None:
        if self.host_runtime == "containers":
            self.check_image(stack)  # the host runs it: nothing is built or sent
            return
        if stack.cpu is None:
            raise stack_refusal(stack, readable=True)
        try:
            self._stack_source = read_stack_source(stack)
        except (OSError, ValueError) as e:
            self.log.error("%s: stack %s cannot be sent to a host: %s", log_name(self), stack.id, e)
            raise stack_refusal(stack, readable=False) from e

    def check_without_stack(self) -> None:
        if self.host_runtime == "containers":
            raise SpawnRefused(
                "Notebooks on this hub run in a software stack's image: choose one of the"
                " stacks on the form.",
                reason="stack",
                status_code=400,
            )

    def check_kit(self, kit: Kit) -> None:
        raise SpawnRefused(
            f"The {kit.label} starter kit cannot be delivered to this hub's compute hosts"
            " yet. Start your server without it.",
            reason="kit",
            status_code=409,
        )

    def extra_start_time(self, stack: Stack | None) -> float:
        # Whether the host has built this stack already is the host's to know.
        return 0.0 if stack is None else self.stack_build_timeout

    async def prepare_launch(self) -> None:
        self._manifest = self._run_manifest = None
        if self.stack is None or self.host_runtime == "containers":
            self._stack_source = None
        self.run_image = None
        if self.stack is not None and self.host_runtime == "containers":
            self.run_image = self.check_image(self.stack)

    async def deliver_run_manifest(self, manifest: dict[str, Any]) -> str | None:
        """Sent with the start: the agent writes it, read-only, in the notebook's home
        on the host (whose path the hub does not know)."""
        self._manifest = manifest
        self._run_manifest = f"~/.composespawner/{self.name or 'default'}.run.json"
        return self._run_manifest

    def launcher_env(self) -> dict[str, str]:
        """What the agent adds that the hub knows of (the run manifest records it)."""
        env = self.stack_lock_env(self.stack, self.run_image)
        if self._run_manifest is not None:
            env["COMPOSE_RUN_MANIFEST"] = self._run_manifest
        if self.machine is not None:
            env["NVIDIA_VISIBLE_DEVICES"] = nvidia_visible_devices(self.machine)
        return env

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(self.launcher_env())  # what the agent sets itself is left out of the request
        return env

    # -- the host -----------------------------------------------------------------------

    def machine_states(self) -> MachineStates | None:
        """How to ask the ledger what became of machines; the composing spawner says
        (None: no ledger, and no notebook on a host is ever taken for an orphan)."""
        return None

    def _link(self, where: str) -> HostLink:
        states = self.machine_states()
        if states is not None:
            SSHLauncher._ledger_states = states
        return self.links.link(self.link_settings(where), HOOKS, self.log)

    # -- start ----------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        machine = self.machine
        assert machine is not None, "the mixin composes the machine before start"
        where = self.hosts.get(machine.host)
        if not where or not self.known_hosts:
            raise _unconfigured(self, machine.host)
        try:
            request = start_request(
                user=self.user.name,
                server=self.name,
                machine=machine,
                env=self.get_env(),
                args=self.get_args(),
                share=self.share,
                stack=self._stack_source if self.stack is not None else None,
                manifest=self._manifest,
                image=self.run_image,
            )
        except Refused as e:
            self.log.error("%s: the host's agent would refuse the start: %s", log_name(self), e)
            raise SpawnRefused(
                f"Your server cannot run on the compute hosts: {e}. Tell the hub's administrators.",
                reason="host-refused",
                status_code=409,
            ) from e
        self._where, self._host_id, self._machine_id = where, machine.host, machine.machine_id
        link = self._link(where)
        began, trips = time.monotonic(), Trips()
        answer = asyncio.ensure_future(
            link.request(request, self.start_timeout, self._progress_line, trips)
        )
        try:
            done = await asyncio.shield(answer)
        except asyncio.CancelledError:
            answer.add_done_callback(_late_start(self, where, machine.machine_id))
            raise
        except (AgentRefused, AgentFailed) as e:
            self._where = self._machine_id = ""  # nothing runs there: no stop to send
            raise _host_answered(self, machine.host, e) from e
        except UNREACHABLE as e:
            if isinstance(e, NEVER_SENT):
                self._where = self._machine_id = ""
            else:  # it may have started there: stopped once the host is reached
                _owe(link, machine.machine_id)
            raise _unreachable(self, machine.host, where, e) from e
        self._asked_at, self._exit_status = time.monotonic(), None
        _running_on(self, where)
        self.log.info(
            "%s: notebook %s started on %s (%s) as pid %s in %.2f s; SSH: %d channel(s)"
            " and %d new connection(s) this start, %d connections and %d channels opened"
            " by this hub",
            log_name(self),
            machine.machine_id,
            machine.host,
            where,
            done.get("pid"),
            time.monotonic() - began,
            trips.channels,
            trips.connections,
            link.counters.connections,
            link.counters.channels,
        )
        return (str(done["ip"]), int(done["port"]))

    def _progress_line(self, progress: Progress) -> None:
        self.launch_progress(progress.message, progress.percent)

    # -- stop and poll -------------------------------------------------------------------

    async def stop(self, now: bool = False) -> None:
        """Stop the notebook on its host. A host that cannot be reached is logged, and the
        release goes on: the fabric takes the machine's devices away from the host."""
        del now  # the agent stops it as fast as it ends (SIGTERM, then SIGKILL)
        where, machine_id = self._where, self._machine_id
        if not where or not machine_id:
            return
        _not_running(where, machine_id)
        await _stop_on(self, where, machine_id)

    async def poll(self) -> int | None:
        """None while the notebook runs, or while its host cannot say (unknown is not dead)."""
        where, machine_id = self._where, self._machine_id
        if not where or not machine_id:
            return 0
        if self._exit_status is not None:  # its host's watch saw it exit
            return self._exit_status
        link = self._link(where)
        if link.watching and time.monotonic() - self._asked_at < self.poll_host_every:
            return None  # the host's watch is open and has not seen it exit
        try:
            answer = await link.request(PollNotebook(machine_id), self.request_timeout)
        except (AgentRefused, AgentFailed, *UNREACHABLE) as e:
            self.log.warning(
                "%s: cannot ask %s (%s) about notebook %s (%s); taken as running",
                log_name(self),
                self._host_id or where,
                where,
                machine_id,
                describe(e),
            )
            return None
        if answer.get("running"):
            self._asked_at = time.monotonic()
            _running_on(self, where)  # after a hub restart: its exit is watched again
            return None
        _not_running(where, machine_id)
        status = answer.get("status")
        return status if isinstance(status, int) and not isinstance(status, bool) else 0

    # -- state ----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self._machine_id:
            # The address, not just the host's Id: a later host table must not lose it.
            state["ssh_host"] = self._where
            state["ssh_host_id"] = self._host_id
            state["ssh_machine"] = self._machine_id
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        where, machine = state.get("ssh_host"), state.get("ssh_machine")
        if isinstance(where, str) and isinstance(machine, str):
            self._where, self._machine_id = where, machine
            self._host_id = str(state.get("ssh_host_id", ""))

    def clear_state(self) -> None:
        super().clear_state()
        if self._where and self._machine_id:
            _not_running(self._where, self._machine_id)
        self._where = self._host_id = self._machine_id = ""
        self._manifest = self._run_manifest = self._exit_status = None


def _unreachable(
    launcher: SSHLauncher, host_id: str, where: str, error: BaseException
) -> SpawnRefused:
    """The refusal of a start that could not reach the host; the log says why."""
    detail = describe(error)
    if isinstance(error, asyncssh.HostKeyNotVerifiable):
        settings = launcher.link_settings(where)
        detail = host_key_problem(settings.known_hosts, settings.address, settings.port)
    log_line, refusal = unreachable(error, host_id, where, detail, launcher.connect_timeout)
    launcher.log.error("%s: %s", log_name(launcher), log_line)
    return refusal


def _unconfigured(launcher: SSHLauncher, host_id: str) -> SpawnRefused:
    """A host the hub cannot reach by its config: the log says what to set."""
    launcher.log.error(
        "%s: cannot reach compute host %s: %s",
        log_name(launcher),
        host_id,
        "c.SSHLauncher.known_hosts is not set (required: no trust on first use)"
        if not launcher.known_hosts
        else f"it is not in c.SSHLauncher.hosts (the hub's host table: {sorted(launcher.hosts)})",
    )
    return host_refusal(host_id, "unknown")


def _host_answered(
    launcher: SSHLauncher, host_id: str, error: AgentRefused | AgentFailed
) -> SpawnRefused:
    """The agent refused or failed the start: its reason to the log, the user a way on."""
    what = "refused the start" if isinstance(error, AgentRefused) else "failed the start"
    launcher.log.error("%s: the agent on %s %s: %s", log_name(launcher), host_id, what, error)
    return host_refusal(host_id, "refused" if isinstance(error, AgentRefused) else "failed")


async def _stop_on(launcher: SSHLauncher, where: str, machine_id: str) -> None:
    """Stop the notebook; a host that cannot be reached has it stopped once it is again."""
    link = launcher._link(where)
    try:
        await link.request(StopNotebook(machine_id), launcher.request_timeout)
        SSHLauncher._owed.discard((_at(link.settings), machine_id))
    except (AgentRefused, AgentFailed, *UNREACHABLE) as e:
        answered = isinstance(e, AgentRefused | AgentFailed)
        if not answered:
            _owe(link, machine_id)
        launcher.log.warning(
            "%s: could not stop notebook %s on %s (%s): %s; its machine is released"
            " anyway, and the host loses its devices%s",
            log_name(launcher),
            machine_id,
            launcher._host_id or where,
            where,
            describe(e),
            "" if answered else " (the notebook is stopped when the host is reached again)",
        )


def _late_start(
    launcher: SSHLauncher, where: str, machine_id: str
) -> Callable[[asyncio.Future[dict[str, Any]]], None]:
    """A start the hub gave up on (its timeout) may still end on the host: stop it then."""

    def ended(answer: asyncio.Future[dict[str, Any]]) -> None:
        if answer.cancelled():
            return
        error = answer.exception()
        if error is None:
            whose = log_name(launcher)
            launcher.log.warning("%s: %s started after the hub gave up", whose, machine_id)
            launcher._late_stop = asyncio.ensure_future(_stop_on(launcher, where, machine_id))
        elif isinstance(error, UNREACHABLE) and not isinstance(error, NEVER_SENT):
            _owe(launcher._link(where), machine_id)  # it may have started there

    return ended


# -- which launcher runs which machine, for the hosts' exit watches -------------------------


def _running_on(launcher: SSHLauncher, where: str) -> None:
    SSHLauncher._running[where, launcher._machine_id] = weakref.ref(launcher)


def _not_running(where: str, machine_id: str) -> None:
    SSHLauncher._running.pop((where, machine_id), None)


def _watch_wanted(settings: LinkSettings) -> bool:
    """Whether a notebook of this hub runs at the host ``settings`` reach, or one is to be
    stopped there."""
    at = _at(settings)
    return any(parse_address(where) == at for where, _ in SSHLauncher._running) or any(
        owed_at == at for owed_at, _ in SSHLauncher._owed
    )


def _at(settings: LinkSettings) -> tuple[str, int]:
    return settings.address, settings.port


def _owe(link: HostLink, machine_id: str) -> None:
    """The notebook of ``machine_id`` may run on ``link``'s host, which cannot be reached:
    the host is watched until it can, and its orphans are stopped then."""
    SSHLauncher._owed.add((_at(link.settings), machine_id))
    link.ensure_watch()


async def _listed(link: HostLink, machines: list[str]) -> None:
    """The host's watch was made: stop the notebooks there whose machines have ended."""
    at = _at(link.settings)
    held = {m for (where, m) in SSHLauncher._running if parse_address(where) == at}
    states = SSHLauncher._ledger_states
    known = await states(machines) if states is not None and machines else {}
    unsettled = set()
    for machine_id in orphans(machines, known, held):
        try:
            await link.request(StopNotebook(machine_id), LIST_TIMEOUT)
        except (AgentRefused, AgentFailed, *UNREACHABLE) as e:
            unsettled.add(machine_id)
            link.log.warning(
                "SSH: could not stop orphaned notebook %s on %s (%s)",
                machine_id,
                link.settings.where,
                describe(e),
            )
            continue
        link.log.warning(
            "SSH: stopped notebook %s on %s: the ledger has its machine %s (a stop or start"
            " that could not reach the host left it running)",
            machine_id,
            link.settings.where,
            known[machine_id],
        )
    # What was owed there is settled: stopped, gone, or not this hub's to stop.
    SSHLauncher._owed -= {(at, m) for owed_at, m in SSHLauncher._owed if owed_at == at}
    SSHLauncher._owed |= {(at, m) for m in unsettled}


async def ledger_states(runner: LedgerRunner, machine_ids: Collection[str]) -> dict[str, str]:
    """The ledger's state of each of ``machine_ids`` it knows (those it does not, left out)."""
    found = {}
    for machine_id in machine_ids:
        machine = await runner.run(runner.ledger.machine, machine_id)
        if machine is not None:
            found[machine_id] = machine.state
    return found


async def _exit_seen(settings: LinkSettings, machine_id: str, status: int | None) -> None:
    """A host's agent saw a notebook exit: its launcher's machine is released now."""
    found = [
        (where, ref())
        for (where, machine), ref in list(SSHLauncher._running.items())
        if machine == machine_id and parse_address(where) == (settings.address, settings.port)
    ]
    for where, launcher in found:
        _not_running(where, machine_id)
        if launcher is not None and launcher._machine_id == machine_id:
            launcher.log.info("%s: notebook %s exited on its host", log_name(launcher), machine_id)
            launcher._exit_status = status if status is not None else 0  # for the hub's poll
            await launcher.notebook_exited(status)


HOOKS = LinkHooks(exited=_exit_seen, listed=_listed, watched=_watch_wanted)
