"""What a stack's environment is built from, as files a builder can read: its CPU lock
and its common files (``stack_manifest.py``, ``repro.py``).

The hub reads them from the catalog (:func:`stack_source`) and sends them to a
host's agent, or hands them to its own builder child; each side writes them
under a folder named by their hash (:func:`materialise`), so that the
environment's name (:func:`~composespawner.launchers.environments.environment_key`)
comes out the same wherever it is computed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.launchers.agent_protocol import FILE_NAME, StackSource

LOCK_FILE = "requirements.lock"
KEEP_SOURCES = 14 * 86_400.0  # seconds a stack's materialised files stay unused


def stack_source(stack: Stack) -> StackSource:
    """What ``stack``'s environment is built from: its CPU lock and common files."""
    if stack.cpu is None:
        raise ValueError(f"stack {stack.id} has no CPU lock")
    lock = stack.cpu.lock.read_text()
    if hashlib.sha256(lock.encode()).hexdigest() != stack.cpu.lock_sha256:
        raise ValueError(f"{stack.cpu.lock} does not hash to the catalog's lock_sha256")
    return StackSource(
        id=stack.id,
        label=stack.label,
        lock_sha256=stack.cpu.lock_sha256,
        lock=lock,
        common=common_files(stack.common),
    )


def common_files(folder: Path | None) -> tuple[tuple[str, str], ...]:
    """The plain files of a stack's common folder (caches and folders left out)."""
    if folder is None:
        return ()
    return tuple(
        (path.name, path.read_text())
        for path in sorted(folder.iterdir())
        if path.is_file() and FILE_NAME.fullmatch(path.name)
    )


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


def source_body(source: StackSource) -> dict[str, object]:
    """``source`` as the builder child reads it on its stdin."""
    return {
        "id": source.id,
        "label": source.label,
        "lock_sha256": source.lock_sha256,
        "lock": source.lock,
        "common": dict(source.common),
    }


def source_of_body(body: dict[str, object]) -> StackSource:
    """:func:`source_body`'s inverse (written by the root side that started the child)."""
    common = body["common"]
    assert isinstance(common, dict)
    return StackSource(
        id=str(body["id"]),
        label=str(body["label"]),
        lock_sha256=str(body["lock_sha256"]),
        lock=str(body["lock"]),
        common=tuple(sorted((str(k), str(v)) for k, v in common.items())),
    )


def materialise(source: StackSource, sources: Path) -> Path:
    """Write the stack's lock and common files under ``sources`` (kept: found next time;
    touched, so that :func:`prune_sources` sees it in use)."""
    folder = sources / source_key(source)
    (folder / "common").mkdir(mode=0o755, parents=True, exist_ok=True)
    files = [(folder / LOCK_FILE, source.lock)]
    files += [(folder / "common" / name, text) for name, text in source.common]
    for path, text in files:
        data = text.encode()
        if path.is_file() and path.read_bytes() == data:
            continue
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
    os.utime(folder)
    return folder


def stale_sources(found: dict[str, float], older_than: float, in_use: str) -> list[str]:
    """Which materialised stacks (name: last used, epoch s) to remove: unused since
    ``older_than``, and not the one in use now."""
    return sorted(name for name, used in found.items() if used < older_than and name != in_use)


def prune_sources(sources: Path, older_than: float, in_use: Path) -> None:
    """Remove the stacks' files under ``sources`` unused since ``older_than`` (epoch s)."""
    found = {}
    for folder in sources.iterdir():
        with contextlib.suppress(OSError):
            found[folder.name] = folder.lstat().st_mtime
    for name in stale_sources(found, older_than, in_use.name):
        shutil.rmtree(sources / name, ignore_errors=True)
