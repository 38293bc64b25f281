"""A stack's environment on this host, built from the lock the hub sent.

The hub sends the stack's lock and common files (it has the catalog; the host
does not). They are kept under the state folder, by their hash, and the
environment is built under ``stacks_dir`` by the local launcher's builder
(:class:`~composespawner.launchers.environments.StackEnvironments`): on first
use, then found ready by every later start, by anyone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.launchers.agent_protocol import StackSource
from composespawner.launchers.environments import StackEnvironment, StackEnvironments

LOCK_FILE = "requirements.lock"


def source_key(source: StackSource) -> str:
    """What the stack's files are, as a folder name: its lock and its common files."""
    digest = hashlib.sha256(source.lock_sha256.encode())
    for name, text in source.common:
        digest.update(f"\0{name}\0{len(text)}\0".encode())
        digest.update(text.encode())
    return digest.hexdigest()[:32]


def stack_of(source: StackSource, folder: Path) -> Stack:
    """The catalog's Stack for ``source`` with its files in ``folder``."""
    return Stack(
        id=source.id,
        label=source.label or source.id,
        cpu=StackBuild(lock=folder / LOCK_FILE, lock_sha256=source.lock_sha256),
        common=folder / "common",
    )


def materialise(source: StackSource, sources: Path) -> Path:
    """Write the stack's lock and common files under ``sources`` (kept: found next time)."""
    folder = sources / source_key(source)
    (folder / "common").mkdir(mode=0o700, parents=True, exist_ok=True)
    files = [(folder / LOCK_FILE, source.lock)]
    files += [(folder / "common" / name, text) for name, text in source.common]
    for path, text in files:
        data = text.encode()
        if path.is_file() and path.read_bytes() == data:
            continue
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
    return folder


def build(
    source: StackSource,
    sources: Path,
    stacks_dir: Path,
    progress: Callable[[str, int], None],
) -> StackEnvironment:
    """The stack's environment, built first if needed; StackBuildError says why not."""
    stack = stack_of(source, materialise(source, sources))
    assert stack.common is not None
    builder = StackEnvironments(stacks_dir, stack.common)
    return asyncio.run(builder.ensure(stack, progress))
