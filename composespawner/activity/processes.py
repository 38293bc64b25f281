"""Which Jupyter kernel holds a GPU: the kernel a process belongs to, from ``/proc``.

Jupyter Server starts every kernel with its connection file on the command line
(``python -m ipykernel_launcher -f …/kernel-<id>.json``; other kernels' ``argv`` pass
``{connection_file}`` the same way), and jupyter_client names that file after the
kernel's id. The process holding a GPU may be the kernel or one it started (a data
loader's worker, a ``multiprocessing`` child, a kernel papermill started from a cell),
so the parents are walked up to the server: the outermost kernel on the way is the
one the notebook server runs.

Unknown is not "no kernel's": a process that cannot be read (gone since NVML listed
it, hidden by ``hidepid``, a parent not ours to read) makes the GPU's holders unknown
for this reading, and the reclaimer falls back on what it does without names. So does
a reclaimer outside the host's initial PID namespace: NVML names processes by the
host's pids, which another namespace's ``/proc`` would show as other processes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from composespawner.domain.activity import Holder

PROC = Path("/proc")
MOST_PARENTS = 64  # a chain of processes deeper than this is not a kernel's workers
# The initial PID namespace's inode (PROC_PID_INIT_INO in the kernel's proc_ns.h): the
# one the host's processes, and so NVML's pids, are numbered in.
INITIAL_PID_NAMESPACE = 0xEFFFFFFC
_KERNEL_FILE = re.compile(r"(?:^|[/=])kernel-([\w-]+)\.json$")


class ProcessUnreadable(Exception):
    """A process (or one of its parents) could not be read: whose it is is unknown."""


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
    """The outermost kernel ``pid`` is or descends from; None when it descends from none.

    Raises :class:`ProcessUnreadable` when it or a parent cannot be read.
    """
    kernel = None
    seen: set[int] = set()
    while pid > 1 and pid not in seen and len(seen) < MOST_PARENTS:
        seen.add(pid)
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
            stat = (proc / str(pid) / "stat").read_text()
            parent = parent_in(stat)
        except (OSError, ValueError, IndexError) as e:
            raise ProcessUnreadable(f"process {pid}: {e}") from e
        kernel = kernel_id_in([arg.decode(errors="replace") for arg in argv if arg]) or kernel
        pid = parent
    return kernel


def in_initial_pid_namespace(proc: Path = PROC) -> bool:
    """Whether this process's ``/proc`` numbers processes as the host does."""
    try:
        return os.stat(proc / "self" / "ns" / "pid").st_ino == INITIAL_PID_NAMESPACE
    except OSError:
        return False


def holders_of(pids: Iterable[int], proc: Path = PROC) -> tuple[Holder, ...] | None:
    """Each pid with the kernel it belongs to, in pid order; None when any cannot be told
    (:class:`ProcessUnreadable`) or this process does not see the host's pids."""
    if not in_initial_pid_namespace(proc):
        return None
    try:
        return tuple(
            Holder(pid, kernel_of(pid, proc), uid_of(pid, proc)) for pid in sorted(set(pids))
        )
    except ProcessUnreadable:
        return None


def uid_of(pid: int, proc: Path = PROC) -> int:
    """The account ``pid`` runs as (its real uid); :class:`ProcessUnreadable` if gone."""
    try:
        status = (proc / str(pid) / "status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration, ValueError, IndexError) as e:
        raise ProcessUnreadable(f"process {pid}: no Uid read ({e!r})") from e
