"""One channel's work: the request read, checked, done, answered, and logged.

Every refusal and failure is logged with the request's op, user and machine,
never its environment: that holds the notebook's API token.
"""

from __future__ import annotations

import json
import logging
import select
import signal
from collections.abc import Callable, Mapping
from typing import Any

from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.starting import StartFailed
from composespawner.launchers.agent_protocol import (
    ListNotebooks,
    PollNotebook,
    ReadActivity,
    Refused,
    Request,
    StartNotebook,
    StopNotebook,
    WatchExits,
    activity_fields,
    parse_request,
    reply,
)

ALLOWED_COMMAND = "composespawner-host"
ACTIVITY_SECONDS = 60  # NVML answers in milliseconds; the hub waits far less than this
log = logging.getLogger("composespawner.hostagent")
Say = Callable[[bytes], None]


def command_refusal(environ: Mapping[str, str]) -> str | None:
    """Why the SSH client's own command is refused: the hub's key runs this agent alone."""
    asked = environ.get("SSH_ORIGINAL_COMMAND")
    if asked is None or asked.strip() == ALLOWED_COMMAND:
        return None
    return "this key runs composespawner-host only; the command asked for was refused"


def who(data: bytes) -> str:
    """op, user and machine of a request, however bad, for the log (never its env)."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return "op=? (not JSON)"
    if not isinstance(body, dict):
        return "op=? (not an object)"
    return " ".join(f"{key}={_short(body.get(key))}" for key in ("op", "user", "machine"))


def describe(request: Request) -> str:
    user = getattr(request, "user", None)
    machine = getattr(request, "machine", None)
    return f"op={request.op} user={_short(user)} machine={_short(machine)}"


def handle(data: bytes, config: AgentConfig, say: Say, stdout_fd: int) -> bool:
    """Carry out the request in ``data``, answering through ``say``; whether it was done."""
    try:
        request = parse_request(data)
    except Refused as e:
        return refuse(who(data), str(e), say)
    except Exception as e:  # a request that breaks the parser still gets its line
        return crashed(who(data), e, say)
    try:
        if isinstance(request, ReadActivity):
            return read_activity(config, say)
        from composespawner.hostagent.notebooks import Notebooks

        fields = _dispatch(request, Notebooks(config), say, stdout_fd)
    except Refused as e:
        return refuse(describe(request), str(e), say)
    except StartFailed as e:
        return fail(describe(request), str(e), say)
    except Exception as e:  # the hub gets a line whatever broke; the log has the trace
        return crashed(describe(request), e, say)
    if fields is not None:
        say(reply(ok=True, **fields))
    return True


def read_activity(config: AgentConfig, say: Say) -> bool:
    """Answer with this host's GPUs as NVML reads them, each with the processes holding
    it and their kernels (the agent runs as root in the host's own PID namespace, so it
    can name every notebook's kernel: the hub's reclaimer then ends only those). A
    process names its kernel only for its own account: one of another account than the
    notebooks holding the GPU is no kernel of theirs, whatever its command line says.
    Any other failure is :func:`handle`'s, as for every request."""
    from composespawner.activity.nvml import NvmlUnreadable, read_gpus
    from composespawner.domain.activity import owned_by
    from composespawner.hostagent.decisions import owners_by_gpu
    from composespawner.hostagent.state import StateDir, alive

    # A driver stuck in a call is not interrupted by the hub giving up: the alarm ends
    # this process, so stuck reads do not pile up one per pass (and sshd session).
    signal.alarm(ACTIVITY_SECONDS)
    try:
        gpus = read_gpus()
    except NvmlUnreadable as e:
        return fail("op=activity", str(e), say)
    finally:
        signal.alarm(0)
    owners = owners_by_gpu(r for r in StateDir(config.state_dir).records() if alive(r))
    owned = [owned_by(gpu, owners.get(gpu.uuid, frozenset())) for gpu in gpus.values()]
    say(reply(ok=True, **activity_fields(owned)))
    return True


def _dispatch(request: Request, notebooks: Any, say: Say, stdout_fd: int) -> dict[str, Any] | None:
    if isinstance(request, StartNotebook):
        result: dict[str, Any] = notebooks.start(request, say)
        if channel_closed(stdout_fd):
            # The hub gave up on this start (a timeout, a cancel) while it ran: it does
            # not know of this notebook, and nothing else would ever stop it.
            notebooks.stop(request.machine)
            raise StartFailed("the hub closed the channel before the start was done: undone")
    elif isinstance(request, StopNotebook):
        result = notebooks.stop(request.machine)
    elif isinstance(request, PollNotebook):
        result = notebooks.poll(request.machine)
    elif isinstance(request, ListNotebooks):
        result = notebooks.listed()
    else:
        assert isinstance(request, WatchExits)
        notebooks.watch(say, stdout_fd)
        return None
    return result


def channel_closed(fd: int) -> bool:
    """Whether the reader of ``fd`` (the hub's channel) has gone: a pipe polls POLLERR."""
    poller = select.poll()
    poller.register(fd, select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


def refuse(whose: str, why: str, say: Say) -> bool:
    log.warning("refused %s: %s", whose, why)
    say(reply(ok=False, refused=why))
    return False


def crashed(whose: str, error: Exception, say: Say) -> bool:
    log.error("%s failed", whose, exc_info=error)
    say(reply(ok=False, error=f"the agent failed: {type(error).__name__}: {error}"))
    return False


def fail(whose: str, why: str, say: Say) -> bool:
    log.error("failed %s: %s", whose, why)
    say(reply(ok=False, error=why))
    return False


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text.encode("unicode_escape").decode()  # one log line, whatever was sent
    return text if len(text) <= 64 else text[:64] + "…"
