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
from collections.abc import Iterable
from pathlib import Path

SYSVIPC = Path("/proc/sysvipc")
SHM = Path("/dev/shm")
MQUEUE = Path("/dev/mqueue")
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
    """Remove every System V object and every file in ``folders`` that ``uid`` owns;
    how many went. Root's objects are never anyone's to remove. A failure is logged and
    the rest removed: what is left is what was there before."""
    if uid == 0:
        return 0
    removed = sum(_remove_sysv(uid, kind, sysvipc) for kind, _ in KINDS)
    for folder in folders:
        removed += _remove_files(uid, folder)
    return removed


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
    """Every entry ``uid`` owns under ``folder``, walked without following links."""
    removed = 0
    try:
        walk = list(os.walk(folder, topdown=False, followlinks=False))
    except OSError:
        return 0
    for here, folders, files in walk:
        for name in files + folders:
            path = Path(here) / name
            try:
                found = path.lstat()
                if found.st_uid != uid:
                    continue
                if stat.S_ISDIR(found.st_mode):
                    path.rmdir()
                else:
                    path.unlink()
                removed += 1
            except OSError as e:  # gone meanwhile, or a folder still holding others' files
                log.warning("cannot remove %s of uid %d: %s", path, uid, e.strerror)
    return removed
