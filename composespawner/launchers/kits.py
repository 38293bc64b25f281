"""Starter kits go into the user's home at every start, never over the user's work.

A kit (``images/kits/<id>/``: a notebook and the module it loads its data
with) is merged into ``~/starter-kits/<id>/`` as nbgitpuller merges a course's
repository into a home:

* a file the user has not changed is brought up to the kit's version;
* a file the user changed stays as the user left it: the user's changes win;
* a file the user deleted comes back;
* a file of the user's own that has the name of a kit file (one the kit never
  gave) is renamed, ``name-<n>.ext``, and the kit's file takes its place.

What the kit gave last is remembered, file by file, in
``~/.composespawner/kits/<id>.json``: a file still as it was given is one the
user did not change. :func:`plan` decides, from hashes alone; :func:`merge`
does it. The spawner runs :func:`merge` as the notebook's account
(``python -m composespawner.launchers.kits``), so a link the user made in their home can
point the merge nowhere but where the user could write anyway.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_FOLDER = "starter-kits"  # kits go to ~/starter-kits/<id>/
# What a kit folder holds that is not the kit: what running it leaves behind.
NOT_KIT = frozenset({"__pycache__", ".ipynb_checkpoints", "data", "runs"})


@dataclass(frozen=True, slots=True)
class Step:
    """One thing the merge does to one file of the kit."""

    path: str  # relative to the kit's folder, "/"-separated
    action: str  # "copy", "update", "keep" (the user's), "rename" (then copy), "same"

    @property
    def writes(self) -> bool:
        return self.action in ("copy", "update", "rename")


def plan(kit: Mapping[str, str], home: Mapping[str, str], given: Mapping[str, str]) -> list[Step]:
    """What to do with each kit file, from SHA-256s: of the kit's files, of those
    at the same paths in the home (absent: none there), and of what the kit gave
    last time (absent: never given)."""
    steps = []
    for path, wanted in sorted(kit.items()):
        there = home.get(path)
        if there is None:
            action = "copy"  # new, or deleted by the user: it comes back
        elif there == wanted:
            action = "same"
        elif path not in given:
            action = "rename"  # the user's own file, by chance of the kit's name
        elif there == given[path]:
            action = "update"  # as the kit gave it: the kit's newer version
        else:
            action = "keep"  # the user changed it
        steps.append(Step(path, action))
    return steps


def remembered(
    steps: list[Step], kit: Mapping[str, str], given: Mapping[str, str]
) -> dict[str, str]:
    """What the kit has given after ``steps``: a kept file keeps what was given before."""
    return {
        s.path: given[s.path] if s.action == "keep" else kit[s.path]
        for s in steps
        if s.action != "keep" or s.path in given
    }


def kit_files(folder: Path) -> dict[str, str]:
    """The kit's files under ``folder`` and their SHA-256s."""
    return {path: _sha256(folder / path) for path in _walk(folder)}


def _walk(folder: Path, below: str = "") -> Iterator[str]:
    for entry in sorted(os.scandir(folder / below), key=lambda e: e.name):
        if entry.name in NOT_KIT:
            continue
        path = f"{below}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(folder, f"{path}/")
        elif entry.is_file(follow_symlinks=False):
            yield path


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _home_sha256(path: Path) -> str | None:
    """The hash of the user's file; None where there is nothing. A link or a folder
    is the user's own: it never hashes to what the kit gave."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return "not a file"
    return _sha256(path) if path.exists() else None


def merge(kit_folder: Path, home: Path, kit_id: str) -> list[Step]:
    """Merge the kit in ``kit_folder`` into ``home``/starter-kits/``kit_id``; the steps taken."""
    into = home / HOME_FOLDER / kit_id
    memory = home / ".composespawner" / "kits" / f"{kit_id}.json"
    kit = kit_files(kit_folder)
    there = {path: sha for path in kit if (sha := _home_sha256(into / path)) is not None}
    given = _read_memory(memory)
    steps = plan(kit, there, given)
    for step in steps:
        target = into / step.path
        if step.action == "rename":
            target.rename(_free_name(target))
        if step.writes:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.partial")
            shutil.copyfile(kit_folder / step.path, partial)
            partial.replace(target)
    memory.parent.mkdir(parents=True, exist_ok=True)
    memory.write_text(json.dumps(remembered(steps, kit, given), indent=1, sort_keys=True) + "\n")
    return steps


def _read_memory(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # never merged, or the user broke it: every differing file is theirs
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _free_name(path: Path) -> Path:
    """``name-1.ext``, ``name-2.ext``, ...: the first that is free."""
    n = 1
    while True:
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
        n += 1


def main(argv: list[str] | None = None) -> int:
    """``python -m composespawner.launchers.kits FOLDER HOME KIT_ID``: merge, say what changed."""
    parser = argparse.ArgumentParser(
        prog="python -m composespawner.launchers.kits", description=__doc__
    )
    parser.add_argument("kit_folder", type=Path)
    parser.add_argument("home", type=Path)
    parser.add_argument("kit_id")
    args = parser.parse_args(argv)
    try:
        steps = merge(args.kit_folder, args.home, args.kit_id)
    except OSError as e:
        print(f"could not merge the {args.kit_id} kit into {args.home}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({s.path: s.action for s in steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
