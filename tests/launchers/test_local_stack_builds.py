"""The local launcher's stack builds, as a hub run as root makes them: in the builder
child, as the build account, in a cgroup killed whole, then made root's; never as root
and never in the hub's own process.

The stacks are small ones made on the spot (a wheel and a hashed lock), so each build
is real (venv, pip with hashes, ``stack_manifest.py``) and takes seconds. Needs root
(accounts, cgroups).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.launchers.accounts import closed_dirs
from composespawner.launchers.environments import StackBuildError
from composespawner.launchers.local_files import stack_builder
from composespawner.launchers.local_stacks import PACKAGE
from composespawner.launchers.stack_builds import processes_of
from tests.support.builds import PLANTING_MANIFEST, running_threads_of
from tests.support.stacks import COMMON, make_lock

pytestmark = [pytest.mark.host_processes, pytest.mark.timeout(240)]
LOG = logging.getLogger(__name__)

# Says as whom, and in which process, the build ran its stack_manifest.py.
WITNESS_MANIFEST = """
import argparse, json, os
parser = argparse.ArgumentParser()
for flag in ("--stack", "--variant", "--lock", "--out"):
    parser.add_argument(flag)
args = parser.parse_args()
with open(args.out, "w") as file:
    json.dump({"uid": os.getuid(), "ppids": PPIDS(os.getpid())}, file)
"""
PPIDS = """
def PPIDS(pid):
    found = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as file:
            pid = int(file.read().rsplit(")", 1)[1].split()[1])
        found.append(pid)
    return found
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder others may enter (pytest's own are closed to the build account)."""
    folder = Path(tempfile.mkdtemp(prefix="composespawner-builds-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def account() -> Iterator[str]:
    """A build account's name; the account (made by the first build) goes afterwards,
    with the way in it was given."""
    name = f"csbuild-{secrets.token_hex(3)}"
    yield name
    for folder in {d for p in (Path(sys.executable), PACKAGE) for d in closed_dirs(p.resolve())}:
        subprocess.run(["setfacl", "-x", f"u:{name}", str(folder)], capture_output=True)
    subprocess.run(["userdel", name], capture_output=True, timeout=30, check=False)


def tiny_stack(place: Path, stack_id: str, manifest: str | None = None) -> Stack:
    """A small stack: its wheel and lock under ``place``, its common files the images'
    (``manifest`` in place of ``stack_manifest.py``)."""
    folder = place / stack_id
    (folder / "common").mkdir(parents=True)
    folder.chmod(0o755)
    lock = make_lock(folder)
    for path in COMMON.glob("*.py"):
        shutil.copy(path, folder / "common" / path.name)
    if manifest is not None:
        (folder / "common" / "stack_manifest.py").write_text(manifest)
    sha256 = hashlib.sha256(lock.read_bytes()).hexdigest()
    return Stack(stack_id, stack_id, cpu=StackBuild(lock, sha256), common=folder / "common")


async def build(place: Path, stack: Stack, account: str) -> Path:
    builder = stack_builder(str(place / "stacks"), stack, 120.0, LOG, account=account)
    return (await builder.ensure(stack, lambda message, percent: None)).path


async def test_a_hub_as_root_builds_as_the_build_account_in_a_child_then_owns_it(
    place: Path, account: str
) -> None:
    stack = tiny_stack(place, "witness", PPIDS + WITNESS_MANIFEST)
    environment = await build(place, stack, account)

    said = json.loads((environment / "stack-manifest.json").read_text())
    builder = pwd.getpwnam(account)
    assert said["uid"] == builder.pw_uid  # not root
    # Run by the builder child, the hub's own child: never by the hub's process.
    assert said["ppids"][0] != os.getpid()
    assert said["ppids"][1] == os.getpid()
    for path in [environment, *environment.rglob("*")]:
        found = path.lstat()
        assert found.st_uid == 0, path  # root's now: the build account changes nothing
        if not stat.S_ISLNK(found.st_mode):
            assert stat.S_IMODE(found.st_mode) & 0o7022 == 0, path
    assert processes_of(builder.pw_uid) == []
    stacks = (place / "stacks").lstat()
    assert (stacks.st_uid, stacks.st_gid, stat.S_IMODE(stacks.st_mode)) == (
        0,
        builder.pw_gid,
        0o1775,
    )


async def test_a_build_that_leaves_a_zombie_led_process_plants_nothing_in_the_next(
    place: Path, account: str
) -> None:
    stacks = place / "stacks"
    planting = f"STACKS = {str(stacks)!r}\n" + PLANTING_MANIFEST
    await build(place, tiny_stack(place, "a", planting), account)
    assert running_threads_of(pwd.getpwnam(account).pw_uid) == []  # ended with the build

    second = await build(place, tiny_stack(place, "b"), account)
    (site,) = second.glob("lib/python*/site-packages")
    assert not (site / "planted.pth").exists()


async def test_a_lock_folder_the_build_account_made_is_not_taken_for_roots(
    place: Path, account: str
) -> None:
    stacks = place / "stacks"
    await build(place, tiny_stack(place, "first"), account)
    builder = pwd.getpwnam(account)
    # As a build could have, had the folder not been root's already: its own, open.
    shutil.rmtree(stacks / ".locks")
    (stacks / ".locks").mkdir(mode=0o777)
    os.chown(stacks / ".locks", builder.pw_uid, builder.pw_gid)

    await build(place, tiny_stack(place, "second"), account)
    found = (stacks / ".locks").lstat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o700)


async def test_a_failed_build_says_so_and_leaves_no_environment(place: Path, account: str) -> None:
    stack = tiny_stack(place, "failing", "raise SystemExit('no manifest today')\n")
    builder = stack_builder(str(place / "stacks"), stack, 120.0, LOG, account=account)
    path = builder.environment(stack).path
    with pytest.raises(StackBuildError, match=r"failing stack could not be built\. Try again"):
        await builder.ensure(stack, lambda message, percent: None)
    assert not path.exists()
    assert processes_of(pwd.getpwnam(account).pw_uid) == []


async def test_a_hub_not_run_as_root_builds_as_itself_in_the_child(place: Path) -> None:
    stack = tiny_stack(place, "own", PPIDS + WITNESS_MANIFEST)
    builder = stack_builder(str(place / "stacks"), stack, 120.0, LOG, account="csnone")
    builder.as_root = False  # as a hub of its own account builds (this test runs as root)
    environment = (await builder.ensure(stack, lambda message, percent: None)).path

    said = json.loads((environment / "stack-manifest.json").read_text())
    assert said["uid"] == os.getuid()
    assert said["ppids"][0] != os.getpid()  # the builder child's, not the hub's own
    assert said["ppids"][1] == os.getpid()
    with pytest.raises(KeyError):
        pwd.getpwnam("csnone")  # no build account was made
