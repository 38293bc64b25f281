"""What a local notebook finds ready when it starts: its stack's environment, the
kit merged into its home, its run manifest, the account it runs as.

The local launcher decides when each is done; how is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import sys
from pathlib import Path

from composespawner.domain.catalog import Kit, Stack
from composespawner.launchers.accounts import (
    notebook_account_for,
    switch_account_command,
    useradd_command,
)
from composespawner.launchers.base import KitNotDelivered, SpawnRefused
from composespawner.launchers.environments import StackEnvironments

KIT_MERGE_TIMEOUT = 60.0  # seconds: a few small files, on a home that may be slow

# One builder per folder in a hub: two first starts on a stack share one build.
_builders: dict[tuple[str, Path, float], StackEnvironments] = {}


def stack_builder(
    root: str, stack: Stack, build_timeout: float, log: logging.Logger
) -> StackEnvironments:
    """The hub's builder of environments for ``stack``'s common lock under ``root``."""
    assert stack.common is not None
    key = (root, stack.common, build_timeout)
    builder = _builders.get(key)
    if builder is None:
        builder = StackEnvironments(Path(root), stack.common, build_timeout=build_timeout, log=log)
        _builders[key] = builder
    return builder


def notebook_account(shared_account: bool, configured: str) -> pwd.struct_passwd | None:
    """The account notebooks run as, or None for the hub's own."""
    name = notebook_account_for(shared_account, os.geteuid(), configured)
    if name is None:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise SpawnRefused(
            f"The notebook account {name!r} does not exist, so no notebook can start. "
            "An administrator creates it with "
            f"`{' '.join(useradd_command(name))}` (composespawner demo does).",
            reason="no-notebook-account",
            status_code=503,
        ) from None


async def merge_kit(kit: Kit, account: pwd.struct_passwd | None, home: Path) -> str:
    """Merge ``kit`` into ``home`` as ``account``: it writes nowhere the notebook could
    not. What the merge said; :class:`KitNotDelivered` if it failed or took too long."""
    merge = [
        sys.executable,
        "-I",
        "-m",
        "composespawner.launchers.kits",
        str(kit.folder),
        str(home),
        kit.id,
    ]
    process = await asyncio.create_subprocess_exec(
        *switch_account_command(account),
        *merge,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd="/",
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), KIT_MERGE_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise KitNotDelivered(f"merging took over {KIT_MERGE_TIMEOUT:.0f} s") from None
    if process.returncode != 0:
        raise KitNotDelivered(err.decode(errors="replace").strip()[-500:] or "it failed")
    return out.decode().strip()


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
        raise SpawnRefused(
            f"{folder} is not a folder (it may be a link): remove it and start again.",
            reason="home",
            status_code=409,
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
