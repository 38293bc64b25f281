"""Which process a notebook is, known by its pid and its start time.

After a hub (or a host agent) restarts, a notebook is known by its pid and
its start time: a zombie, or another process given the same pid since, must
not pass for it. Standard library only: the host agent imports this on every
SSH channel, so it stays lean (no JupyterHub, no traitlets).
"""

from __future__ import annotations

from pathlib import Path


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
