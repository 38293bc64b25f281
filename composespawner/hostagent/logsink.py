"""A notebook's output into its log in ``state_dir``, never past a cap.

The agent forks a sink beside each notebook (:func:`.starting.fork_sink`, as root, in
the notebook's cgroups so it ends with it): its stdin is the notebook's stdout and
stderr, its stdout the log, opened by the agent for appending. A log that would pass
the cap starts again from empty with a line saying so, so what is kept is the most
recent output (why a notebook exited is at its end). A write that fails (a full disk)
is skipped, never waited on: the notebook must not block on its output. A limit on
the notebook itself (RLIMIT_FSIZE) would kill it at the cap instead.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os

CHUNK = 1 << 16
NOTE = b"[composespawner-host: this log passed its cap; the output before this was dropped]\n"


def drain(source: int, log: int, cap: int) -> None:
    """Copy ``source`` to ``log`` (opened O_APPEND) until EOF, ``log`` kept under ``cap``."""
    written = os.lseek(log, 0, os.SEEK_END)
    while chunk := os.read(source, CHUNK):
        if written + len(chunk) > cap:
            with contextlib.suppress(OSError):
                os.ftruncate(log, 0)
            written = _write(log, NOTE)
        written += _write(log, chunk)


def _write(log: int, data: bytes) -> int:
    try:
        return os.write(log, data)  # a log file: whole, or an error
    except OSError:
        return 0
