"""Files the hub (or a host's agent) hands a notebook: written as root into its folders.

Standard library only: the host agent (:mod:`composespawner.hostagent`) writes the
run manifest with it too, in a child switched to the notebook's account.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from pathlib import Path


class NotAFolder(Exception):
    """Where the file goes is not a folder (it may be a link); the message says what to do."""


def write_for_notebook(path: Path, data: bytes, owner: pwd.struct_passwd | None) -> None:
    """Write ``path`` (mode 0444, the hub's) into a folder of the notebook's (``owner``'s).

    The notebook owns the folder, so as root nothing is trusted by name: the
    folder is opened without following a symlink, and the file made in it by
    descriptor, exclusively, so no link the notebook planted is written through.
    It is written in place, not renamed into place: it is written before the
    notebook starts, so nothing reads it half-written, and each metadata write
    saved is one fewer for the hub database's next fsync to wait on (ext4).
    """
    folder = path.parent
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o755)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        where = os.open(folder, flags)
    except OSError as e:
        raise NotAFolder(
            f"{folder} is not a folder (it may be a link): remove it and start again."
        ) from e
    try:
        found = os.fstat(where)
        if owner is not None and (found.st_uid, found.st_gid) != (owner.pw_uid, owner.pw_gid):
            os.fchown(where, owner.pw_uid, owner.pw_gid)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=where)  # the last start's, or a link planted there
        created = os.open(
            path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444, dir_fd=where
        )
        with os.fdopen(created, "wb") as file:
            file.write(data)
    finally:
        os.close(where)
