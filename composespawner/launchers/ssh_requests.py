"""What the SSH launcher sends a host's agent, and what it tells people when it cannot.

Pure, apart from reading a stack's files and the known_hosts file it names.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import asyncssh

from composespawner.domain.catalog import Stack
from composespawner.domain.hardware import Share
from composespawner.domain.machine import ComposedMachine, gpu_selection
from composespawner.launchers.agent_protocol import (
    ENV_REFUSED_PREFIXES,
    ENV_SET_BY_AGENT,
    StackSource,
    StartNotebook,
    encode_request,
)
from composespawner.launchers.base import SpawnRefused
from composespawner.ledger.lifecycle import STOPPING, TERMINAL

SSH_PORT = 22
# A machine in these states is over: its notebook, if one runs, is to be stopped.
ENDED = TERMINAL | {STOPPING}
# Paths of the hub's machine (its Python, its environments): nothing on a host.
HUB_ONLY_ENV = frozenset(
    {
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "CONDA_ROOT",
        "CONDA_DEFAULT_ENV",
        "CONDA_PREFIX",
        "COMPOSE_STACK_MANIFEST",  # the agent sets these two: the paths are the host's
        "COMPOSE_RUN_MANIFEST",
    }
)


def parse_address(where: str) -> tuple[str, int]:
    """``"address"``, ``"address:port"`` or ``"[v6-address]:port"`` → (address, port)."""
    text = where.strip()
    if text.startswith("["):
        address, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if rest and not port:
            raise ValueError(f"{where!r}: expected [address]:port")
    elif text.count(":") == 1:
        address, port = text.split(":")
    else:  # a name, an IPv4 address, or a bare IPv6 address
        address, port = text, ""
    if not address:
        raise ValueError(f"{where!r} names no address")
    if not port:
        return address, SSH_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{where!r}: {port!r} is not a port")
    return address, int(port)


def request_env(env: Mapping[str, str]) -> dict[str, str]:
    """The spawner's environment as the host's agent takes it: without what the agent
    sets itself (PATH, HOME, the GPUs), what it refuses (LD_*), and the hub's paths."""
    return {
        name: value
        for name, value in env.items()
        if name not in ENV_SET_BY_AGENT
        and name not in HUB_ONLY_ENV
        and not name.startswith(ENV_REFUSED_PREFIXES)
    }


def start_request(
    *,
    user: str,
    server: str,
    machine: ComposedMachine,
    env: Mapping[str, str],
    args: Sequence[str],
    share: Share | None,
    stack: StackSource | None,
    manifest: dict[str, Any] | None,
    image: str | None = None,
) -> StartNotebook:
    """The start of ``machine``'s notebook, checked as the agent will (raises Refused)."""
    selection = gpu_selection(machine)
    request = StartNotebook(
        user=user,
        server=server,
        machine=machine.machine_id,
        gpus=tuple(selection.split(",")) if selection else (),
        cores=share.cores if share is not None else None,
        memory_gib=share.memory_gib if share is not None else None,
        env=tuple(sorted(request_env(env).items())),
        args=tuple(args),
        stack=stack,
        manifest=manifest,
        gpu_share=machine.gpu_share,
        image=image,
    )
    encode_request(request)
    return request


def orphans(listed: Iterable[str], states: Mapping[str, str], held: Collection[str]) -> list[str]:
    """Which of the notebooks a host's agent ``listed`` to stop: those whose machine the
    ledger has (``states``) as ended and no launcher of this hub runs (``held``).

    A machine the ledger does not know is left alone (another hub's, on a shared host),
    and so is one it has as live: a start under way is ``launching``.
    """
    return [m for m in listed if states.get(m) in ENDED and m not in held]


def stack_refusal(stack: Stack, *, readable: bool) -> SpawnRefused:
    """A stack the hosts cannot build: none of its CPU lock, or its files unreadable."""
    if readable:
        return SpawnRefused(
            f"The {stack.label} stack cannot run on this hub's compute hosts: they build a"
            " stack's environment from its CPU lock, which it has none of. Choose another"
            " stack, or ask the hub's administrators to add one.",
            reason="stack",
            status_code=409,
        )
    return SpawnRefused(
        f"The {stack.label} stack is not available right now. Tell the hub's administrators"
        " (the hub's log says what is wrong with it).",
        reason="stack",
        status_code=503,
    )


HOST_REFUSALS = {
    "unknown": "the hub does not know how to reach the host",
    "refused": "the host refused it",
    "failed": "it failed to start there",
}


def host_refusal(host_id: str, why: str) -> SpawnRefused:
    """A start the host did not do (``why``: a key of HOST_REFUSALS); the log says more."""
    return SpawnRefused(
        f"Your server was not started on compute host {host_id}: {HOST_REFUSALS[why]}."
        " Your devices were given back. Try again in a few minutes; if it fails again,"
        " tell the hub's administrators (the hub's log says why).",
        reason=f"host-{why}",
        status_code=503,
    )


def host_key_problem(known_hosts: str, address: str, port: int) -> str:
    """Why a host's key was not trusted: not listed in ``known_hosts``, or another key."""
    try:
        listed = asyncssh.read_known_hosts(known_hosts).match(address, address, port)[0]
    except (OSError, ValueError) as e:
        return f"known_hosts {known_hosts} cannot be read ({e})"
    if not listed:
        return (
            f"{address} port {port} is not in known_hosts {known_hosts}: add its host key"
            " (the deployment's composespawner_hosts role writes them)"
        )
    return (
        f"{address} port {port} showed another host key than the one in known_hosts"
        f" {known_hosts}: if the host was reinstalled, put its new key there; if not,"
        " something else may be answering at its address: find out before trusting it"
    )


def unreachable(
    error: BaseException, host_id: str, where: str, detail: str, connect_timeout: float
) -> tuple[str, SpawnRefused]:
    """The hub's log line and the user's refusal for a start that could not reach its host."""
    reason, check = _diagnosis(error, connect_timeout)
    log_line = f"cannot start on compute host {host_id} ({where}): {detail}. {check}"
    why = {
        "host-key": "the hub could not verify the host's identity (its SSH host key), so it"
        " did not connect",
        "host-login": "the host refused the hub's login",
    }.get(reason, "the hub could not reach the host")
    refusal = SpawnRefused(
        f"Your server was not started on compute host {host_id}: {why}. Your devices were"
        " given back. Try again in a few minutes; if it fails again, tell the hub's"
        " administrators (the hub's log says what to check).",
        reason=reason,
        status_code=503,
    )
    return log_line, refusal


def _diagnosis(error: BaseException, connect_timeout: float) -> tuple[str, str]:
    """(reason, what an administrator checks) for an error reaching a host."""
    if isinstance(error, asyncssh.HostKeyNotVerifiable):
        return "host-key", "The hub refuses hosts whose key it cannot verify."
    if isinstance(error, asyncssh.PermissionDenied):
        return "host-login", (
            "Check that the login account's authorized_keys on the host holds the hub's"
            " public key (with the composespawner-host forced command) and that sshd"
            " allows it (PermitRootLogin forced-commands-only for root)."
        )
    if isinstance(error, ConnectionRefusedError):
        return "host-down", (
            "Nothing accepts SSH there: check that sshd runs on the host and that"
            " c.SSHLauncher.hosts has its address and port."
        )
    if isinstance(error, TimeoutError):
        return "host-down", (
            f"No answer within the time allowed (connect_timeout {connect_timeout:g} s):"
            " check that the host is up and that the hub may reach its SSH port."
        )
    if isinstance(error, asyncssh.ChannelOpenError):
        return "host-down", (
            "The host's sshd refused the request's channel: check that"
            " c.SSHLauncher.max_sessions is not above the hosts' sshd MaxSessions."
        )
    if isinstance(error, asyncssh.Error | OSError):
        return "host-down", (
            "The connection failed or broke: check the host, its sshd's log, and the"
            " network between them."
        )
    return "host-agent", (
        "The host's forced command did not answer as composespawner-host does: check the"
        " command= of the hub's key on the host and the agent's log there."
    )
