"""What a local notebook finds ready when it starts: its stack's environment, the
kit merged into its home, its run manifest, the account it runs as.

The local launcher decides when each is done; how is here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import sys
from pathlib import Path

from composespawner.domain.catalog import Kit, Stack
from composespawner.launchers import notebook_files
from composespawner.launchers.accounts import (
    BUILD_ACCOUNT,
    notebook_account_for,
    switch_account_command,
    useradd_command,
)
from composespawner.launchers.base import KitNotDelivered, SpawnRefused
from composespawner.launchers.cgroups import PIDS_PER_GIB, parent_parts
from composespawner.launchers.local_stacks import LocalStackBuilds
from composespawner.launchers.notebook_files import NotAFolder

KIT_MERGE_TIMEOUT = 60.0  # seconds: a few small files, on a home that may be slow

# One builder per folder in a hub: two first starts on a stack share one build.
_builders: dict[tuple[object, ...], LocalStackBuilds] = {}


def stack_builder(
    root: str,
    stack: Stack,
    build_timeout: float,
    log: logging.Logger,
    *,
    account: str = BUILD_ACCOUNT,
    cgroup_parent: str = "composespawner",
    pids_per_gib: int = PIDS_PER_GIB,
) -> LocalStackBuilds:
    """The hub's builder of environments for ``stack``'s common lock under ``root``."""
    assert stack.common is not None
    key = (root, stack.common, build_timeout, account, cgroup_parent, pids_per_gib)
    builder = _builders.get(key)
    if builder is None:
        builder = LocalStackBuilds(
            Path(root),
            stack.common,
            build_timeout=build_timeout,
            account=account,
            cgroup_parent=parent_parts(cgroup_parent),
            pids_per_gib=pids_per_gib,
            log=log,
        )
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
    """:func:`.notebook_files.write_for_notebook`, refused to the user as a spawn error."""
    try:
        notebook_files.write_for_notebook(path, data, owner)
    except NotAFolder as e:
        raise SpawnRefused(str(e), reason="home", status_code=409) from e
