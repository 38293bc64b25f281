"""Which Jupyter kernel holds a GPU: the kernel a process belongs to, from ``/proc``.

Jupyter Server starts every kernel with its connection file on the command line
(``python -m ipykernel_launcher -f …/kernel-<id>.json``; other kernels' ``argv`` pass
``{connection_file}`` the same way), and jupyter_client names that file after the
kernel's id. The process holding a GPU may be the kernel or one it started (a data
loader's worker, a ``multiprocessing`` child), so the parents are walked up to the
first kernel.

Only where the pids NVML gives are this process's own: NVML names processes as the
host's PID namespace sees them, so a reclaimer inside a container (a PID namespace of
its own) would look up other processes under those numbers. There every holder is
left unknown (:func:`own_pid_namespace`), and the reclaimer falls back on what it does
without names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from composespawner.domain.activity import Holder

PROC = Path("/proc")
MOST_PARENTS = 64  # a chain of processes deeper than this is not a kernel's workers
_KERNEL_FILE = re.compile(r"(?:^|[/=])kernel-([\w-]+)\.json$")


def kernel_id_in(argv: Sequence[str]) -> str | None:
    """The kernel id of the connection file named in ``argv``, or None."""
    for arg in argv:
        found = _KERNEL_FILE.search(arg)
        if found:
            return found.group(1)
    return None


def parent_in(stat: str) -> int:
    """The parent pid in a ``/proc/<pid>/stat`` line (the command, in parentheses, may
    hold spaces and parentheses itself: the fields after its last ``)`` are counted)."""
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def kernel_of(pid: int, proc: Path = PROC) -> str | None:
    """The kernel ``pid`` is or descends from; None when it is none's or has ended."""
    seen: set[int] = set()
    while pid > 1 and pid not in seen and len(seen) < MOST_PARENTS:
        seen.add(pid)
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
            stat = (proc / str(pid) / "stat").read_text()
        except (OSError, ValueError):  # ended meanwhile, or not ours to read
            return None
        found = kernel_id_in([arg.decode(errors="replace") for arg in argv if arg])
        if found:
            return found
        try:
            pid = parent_in(stat)
        except (ValueError, IndexError):
            return None
    return None


def own_pid_namespace(proc: Path = PROC) -> bool:
    """Whether this process sees pids as the host does (its ``NSpid`` has one entry)."""
    try:
        status = (proc / "self" / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) == 2
    return False  # Linux before 4.1 shows no NSpid: which namespace it is cannot be told


def holders_of(pids: Iterable[int], proc: Path = PROC) -> tuple[Holder, ...]:
    """Each pid with the kernel it belongs to, in pid order."""
    return tuple(Holder(pid, kernel_of(pid, proc)) for pid in sorted(set(pids)))
