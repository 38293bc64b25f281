"""The local notebook's process: which process it is, and seeing it exit.

After a hub restart a notebook is known by its pid and its start time: a
zombie, or another process given the same pid since, must not pass for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot); None if it is gone or a zombie."""
    try:
        return started_from_stat(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def started_from_stat(stat: str) -> int | None:
    """The start time in a ``/proc/PID/stat`` line; None for a zombie (proc(5))."""
    # The command's name, in parentheses, may hold spaces and parentheses itself:
    # the fields that follow start after the last ")".
    fields = stat[stat.rfind(")") + 1 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])  # field 22, starttime


def watch_exit(
    proc: Popen[bytes], exited: Callable[[], None], log: logging.Logger, whose: str
) -> None:
    """Call ``exited`` on the running loop when ``proc`` exits, not at the hub's next poll.

    A pidfd becomes readable when the process exits: the event loop watches
    it like a socket, no thread and no busy loop. Without pidfds (Linux < 5.3)
    nothing is watched, and the hub's poll() finds the exit, as it would anyway.
    """
    if not hasattr(os, "pidfd_open"):
        return
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError as e:
        log.info("Not watching %s's notebook for its exit (%s)", whose, e)
        return
    loop = asyncio.get_running_loop()

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        exited()

    loop.add_reader(pidfd, readable)
