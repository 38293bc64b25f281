"""One SSH channel's request, run in this process: what ``composespawner-host`` does.

Reads one request from stdin (to EOF), answers on stdout, logs to stderr (and
``log_file``). Exit status 0 when the request was done, 1 when it was refused
or failed, 2 when the agent itself is misconfigured. The forced command (``handoff``)
runs this itself where no server takes its channel; the server's child for each
channel handed to it runs it on the channel's descriptors (``server``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from composespawner.hostagent.agent import command_refusal, handle, refuse
from composespawner.hostagent.config import ConfigError, load_config
from composespawner.launchers.agent_protocol import MAX_REQUEST_BYTES, reply

log = logging.getLogger("composespawner.hostagent")
LOG_FORMAT = "%(asctime)s composespawner-host[%(process)d] %(levelname)s %(message)s"
# sshd runs the forced command with root's PATH, /usr/local first: the programs the agent
# runs as root (useradd, setfacl, nvidia-smi) are looked up where only packages install.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run_channel(config: str | None, unserved: str | None = None, usage: str | None = None) -> int:
    """The request on stdin, answered on stdout; its exit status. ``config``: the agent's
    config file (None: every default); ``unserved``: why no server took the channel,
    logged where it is worth a look; ``usage``: what is wrong with the command's
    arguments, which makes the agent misconfigured."""
    os.environ["PATH"] = SYSTEM_PATH  # before anything looks a program up
    _log_to(logging.StreamHandler(sys.stderr))
    out = sys.stdout.buffer

    def say(line: bytes) -> None:
        out.write(line)
        out.flush()

    try:
        return _run(config, usage, say, out.fileno(), unserved)
    except BrokenPipeError:  # the hub closed the channel: nobody is left to answer
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, out.fileno())  # so the exit's flush does not fail again
        return 1


def _run(
    path: str | None,
    usage: str | None,
    say: Callable[[bytes], None],
    stdout_fd: int,
    unserved: str | None,
) -> int:
    # The config first, so that even a refused command reaches log_file.
    try:
        if usage is not None:
            raise ConfigError(usage)
        config = load_config(None if path is None else Path(path), os.environ)
    except ConfigError as e:
        config, broken = None, e
    if config is not None and config.log_file is not None:
        try:
            _log_to(logging.FileHandler(config.log_file))
        except OSError as e:
            log.error("cannot log to %s: %s", config.log_file, e.strerror)
    if unserved:
        log.warning("%s: this request runs in the forced command's own process", unserved)
    refusal = command_refusal(os.environ)
    if refusal:
        refuse(f"command={os.environ.get('SSH_ORIGINAL_COMMAND', '')!r}", refusal, say)
        return 1
    if config is None:
        log.error("cannot start: %s", broken)
        say(reply(ok=False, error=f"the host agent is misconfigured: {broken}"))
        return 2
    data = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    return 0 if handle(data, config, say, stdout_fd) else 1


def _log_to(handler: logging.Handler) -> None:
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
