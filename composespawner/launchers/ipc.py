"""What a user's notebooks leave in the host's shared memory, removed after their last.

Files in ``/dev/shm`` (POSIX shared memory: PyTorch's DataLoader passes tensors
through it, multiprocessing's queues and semaphores live there), POSIX message
queues and System V segments, queues and semaphore sets outlive the processes that
made them: a notebook that stops leaves them pinned in memory, charged to no
notebook's limit, readable by the next process of that account. systemd-logind's
``RemoveIPC=yes`` removes them when a user's last session ends; a notebook is no
login session, so the launcher does the same when the account's last notebook on
the host ends (never while another of its notebooks may be using them).

Deciding what is whose is pure (:func:`sysv_objects_of`); the removal is
:func:`remove_ipc_of`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

SYSVIPC = Path("/proc/sysvipc")
SHM = Path("/dev/shm")
MQUEUE = Path("/dev/mqueue")
PROC = Path("/proc")
MOST_DEPTH = 32  # folders down a shared-memory folder that are walked
IPC_RMID = 0
# Each kind of System V object: its /proc file, its id column, and how it is removed.
KINDS = (("shm", "shmid"), ("msg", "msqid"), ("sem", "semid"))
log = logging.getLogger(__name__)


def sysv_objects_of(uid: int, kind: str, table: str) -> list[int]:
    """The ids of the objects in ``table`` (``/proc/sysvipc/<kind>``) that ``uid`` owns
    or made (logind removes both: a creator may have given an object away)."""
    lines = table.splitlines()
    if not lines:
        return []
    header = lines[0].split()
    id_column = dict(KINDS)[kind]
    columns = [header.index(name) for name in (id_column, "uid", "cuid")]
    found = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) < len(header):
            continue
        ident, owner, creator = (int(fields[c]) for c in columns)
        if uid in (owner, creator):
            found.append(ident)
    return found


def remove_ipc_of(
    uid: int, sysvipc: Path = SYSVIPC, folders: Iterable[Path] = (SHM, MQUEUE)
) -> int:
    """Remove every System V object and every file in ``folders`` that ``uid`` owns, once
    no process of ``uid`` is left on the host (as logind waits for a user's last
    session: a login or a cron job of that account may be using them); how many went.
    Root's objects are never anyone's to remove. A failure is logged and the rest
    removed: what is left is what was there before."""
    if uid == 0 or runs_as(uid):
        return 0
    removed = sum(_remove_sysv(uid, kind, sysvipc) for kind, _ in KINDS)
    for folder in folders:
        removed += _remove_files(uid, folder)
    return removed


def runs_as(uid: int, proc: Path = PROC) -> bool:
    """Whether any thread on the host runs as ``uid`` (a zombie's runs nothing)."""
    return any(thread_runs_as(uid, status) for status in proc.glob("[0-9]*/task/[0-9]*/status"))


def thread_runs_as(uid: int, status: Path) -> bool:
    """Whether the thread of ``status`` (``/proc/<pid>/task/<tid>/status``) runs as
    ``uid`` (by any of its ids): not a zombie (it runs nothing, and goes once reaped)."""
    try:
        lines = status.read_text().splitlines()
    except OSError:  # gone meanwhile
        return False
    fields = {key: value for key, _, value in (line.partition(":") for line in lines)}
    if fields.get("State", "").split()[:1] in (["Z"], ["X"]):
        return False
    return str(uid) in fields.get("Uid", "").split()


def _remove_sysv(uid: int, kind: str, sysvipc: Path) -> int:
    try:
        table = (sysvipc / kind).read_text()
    except OSError:  # no System V IPC in this kernel
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    remove = {
        "shm": lambda ident: libc.shmctl(ident, IPC_RMID, None),
        "msg": lambda ident: libc.msgctl(ident, IPC_RMID, None),
        "sem": lambda ident: libc.semctl(ident, 0, IPC_RMID),
    }[kind]
    removed = 0
    for ident in sysv_objects_of(uid, kind, table):
        if remove(ident) == 0:
            removed += 1
        else:  # gone meanwhile (EINVAL, EIDRM), or refused: logged, never raised
            log.warning(
                "cannot remove System V %s %d of uid %d: errno %d",
                kind,
                ident,
                uid,
                ctypes.get_errno(),
            )
    return removed


def _remove_files(uid: int, folder: Path) -> int:
    """Every entry ``uid`` owns under ``folder``, walked by folder descriptor, never
    through a link (a folder swapped for a link to /etc meanwhile is not entered: its
    open fails), without recursion, at most :data:`MOST_DEPTH` folders down."""
    try:
        top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0
    removed = 0
    # Each open folder: its descriptor, its names left, and (its parent's descriptor, its
    # name, whether it is uid's) to remove it once emptied.
    stack: list[tuple[int, Iterator[str], tuple[int, str, bool] | None]] = [
        (top, iter(os.listdir(top)), None)
    ]
    try:
        while stack:
            fd, names, made = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                os.close(fd)
                if made is not None and made[2]:
                    removed += _removed(os.rmdir, made[0], made[1], uid)
                continue
            try:
                found = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(found.st_mode) and len(stack) < MOST_DEPTH:
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    try:
                        entries = iter(os.listdir(child))
                    except OSError:
                        os.close(child)
                        raise
                    stack.append((child, entries, (fd, name, found.st_uid == uid)))
                elif not stat.S_ISDIR(found.st_mode) and found.st_uid == uid:
                    removed += _removed(os.unlink, fd, name, uid)
            except FileNotFoundError:  # gone meanwhile
                continue
            except OSError as e:  # swapped for a link, unreadable
                log.warning("cannot look at %s/%s for uid %d: %s", folder, name, uid, e.strerror)
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return removed


def _removed(remove: Callable[..., None], folder: int, name: str, uid: int) -> int:
    """1 once ``remove`` (unlink, rmdir) removed ``name`` in the folder of descriptor
    ``folder``; 0, logged unless it was gone already, if it could not."""
    try:
        remove(name, dir_fd=folder)
    except FileNotFoundError:
        return 0
    except OSError as e:  # a folder still holding another's files stays
        log.warning("cannot remove %s of uid %d: %s", name, uid, e.strerror)
        return 0
    return 1
