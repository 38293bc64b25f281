"""What a stack's build (the request's code, run as the build account) cannot get root
to do: write through the links it planted, change what they name, open closed folders
through a ``#!`` line it wrote, or outlive the build; and the build's deadline holds when
the builder says nothing.

The agent's tests (``hostagent_build``) start processes and accounts (root): run under
``flock /tmp/heavy.lock``. The others are in-process.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composespawner.hostagent.accounts import open_the_way, stack_program_refusal
from composespawner.launchers.environments import StackBuildError
from composespawner.launchers.stack_builds import make_roots, processes_of, relay
from composespawner.launchers.stack_sources import prune_sources, stale_sources
from tests.hostagent.hosts import Host, start_request, status_of
from tests.support.stacks import COMMON, make_lock

pytestmark = pytest.mark.timeout(120)

BUILDER, OTHER = 42_001, 42_002  # uids of no account: the walk only compares them

# The request's stack_manifest.py, as an attacker writes it: plants links where root
# wrote before (the notebook side's partial file, a folder in the middle of
# site-packages, the environment itself), a set-uid group-writable program, a
# notebook server whose #! names a closed folder, and a process that outlives the build.
HOSTILE_MANIFEST = """
import argparse, os, subprocess, sys, sysconfig
parser = argparse.ArgumentParser()
for flag in ("--stack", "--variant", "--lock", "--out"):
    parser.add_argument(flag)
args = parser.parse_args()
site = sysconfig.get_path("purelib")
os.unlink(os.path.join(site, "repro.py"))
os.symlink(VICTIM, os.path.join(site, ".repro.py.partial"))
os.rename(os.path.join(site, "composespawner"), os.path.join(site, "composespawner.moved"))
os.symlink(VICTIM_DIR, os.path.join(site, "composespawner"))
os.symlink(VICTIM, os.path.join(sys.prefix, "escape"))
evil = os.path.join(sys.prefix, "bin", "evil")
open(evil, "w").close()
os.chmod(evil, 0o6777)
os.chmod(sys.prefix, 0o777)
server = os.path.join(sys.prefix, "bin", "jupyterhub-singleuser")
with open(server, "w") as file:
    file.write("#!" + CLOSED + "/python\\n")
os.chmod(server, 0o755)
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["sleep", "300"], start_new_session=True, **quiet)
with open(args.out, "w") as file:
    file.write("{}\\n")
"""


def gone(pid: int) -> bool:
    try:
        return status_of(pid)["State"].startswith("Z")
    except FileNotFoundError:
        return True


def hostile_stack(host: Host, victim: Path, victim_dir: Path, closed: Path) -> dict[str, object]:
    (host.root / "wheels").mkdir(mode=0o755)
    text = make_lock(host.root / "wheels").read_text()
    common = {p.name: p.read_text() for p in COMMON.glob("*.py")}
    common["stack_manifest.py"] = (
        f"VICTIM = {str(victim)!r}\nVICTIM_DIR = {str(victim_dir)!r}\nCLOSED = {str(closed)!r}\n"
        + HOSTILE_MANIFEST
    )
    return {
        "id": "hostile",
        "label": "Hostile 1.0",
        "lock_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "lock": text,
        "common": common,
    }


def acl_of(path: Path) -> list[str]:
    return [name for name in os.listxattr(path) if name.startswith("system.posix_acl")]


@pytest.mark.host_processes
def test_a_builds_links_and_shebang_get_root_to_write_or_open_nothing(host: Host) -> None:
    victim = host.root / "victim"
    victim.write_text("untouched\n")
    os.chown(victim, OTHER, OTHER)
    victim.chmod(0o666)
    victim_dir = host.root / "victim-dir"
    victim_dir.mkdir()
    os.chown(victim_dir, OTHER, OTHER)
    victim_dir.chmod(0o777)
    (victim_dir / "kept").write_text("kept\n")
    closed = host.root / "closed"
    closed.mkdir(mode=0o700)
    stacks, builder = host.root / "stacks", host.new_user()
    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")  # replaced: the stack's
    host.reconfigure(
        stacks_dir=str(stacks), build_account=builder, notebook_command=[str(singleuser)]
    )
    stack = hostile_stack(host, victim, victim_dir, closed)

    lines, status, stderr = host.ask(start_request(host.new_user(), "m1", stack=stack))

    assert any("building the Hostile 1.0 stack" in line.get("progress", "") for line in lines)
    assert status == 1, (lines, stderr)  # its notebook server's interpreter is not there
    assert victim.read_text() == "untouched\n"
    found = victim.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (OTHER, 0o666)
    assert sorted(p.name for p in victim_dir.iterdir()) == ["kept"]
    found = victim_dir.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (OTHER, 0o777)
    assert acl_of(closed) == []  # the #! line a build wrote opens nothing
    (environment,) = (p for p in stacks.iterdir() if p.name.startswith("hostile-"))
    for path in [environment, *environment.rglob("*")]:
        mode = path.lstat()
        assert mode.st_uid == 0, path
        if not stat.S_ISLNK(mode.st_mode):
            assert stat.S_IMODE(mode.st_mode) & 0o7022 == 0, path  # no write but root's, no set-id
    assert stat.S_IMODE(environment.lstat().st_mode) == 0o755
    assert (environment / "escape").is_symlink()  # the link itself made root's, left as it was
    left = host.processes_of(builder)  # what the build left running: gone (a zombie runs nothing)
    assert all(gone(pid) for pid in left), left


def test_the_walk_makes_entries_roots_never_what_links_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    os.chown(victim, OTHER, OTHER)
    victim.chmod(0o666)
    environment = tmp_path / "environment"
    site = environment / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "module.py").write_text("")
    (site / "module.py").chmod(0o6777)
    (site / "composespawner").symlink_to(tmp_path)  # a folder in the middle, as a link
    (environment / "escape").symlink_to(victim)
    os.link(victim, environment / "hard")  # another account's file, linked in
    for path in [environment, *environment.rglob("*")]:
        os.chown(path, BUILDER, BUILDER, follow_symlinks=False)
        if not path.is_symlink() and path.is_dir():
            path.chmod(0o777)
    os.chown(victim, OTHER, OTHER)  # the hard link's owner, put back

    make_roots(environment, BUILDER)

    found = victim.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (OTHER, 0o666)
    assert tmp_path.stat().st_uid == 0  # pytest's own folder, not chowned to anyone else
    assert not (environment / "hard").exists()  # removed, not made root's
    assert stat.S_IMODE((site / "module.py").stat().st_mode) == 0o755
    for path in [environment, *environment.rglob("*")]:
        found = path.lstat()
        assert (found.st_uid, found.st_gid) == (0, 0), path
        if not stat.S_ISLNK(found.st_mode):
            assert stat.S_IMODE(found.st_mode) & 0o7022 == 0, path


def test_a_link_in_place_of_the_environment_is_not_walked(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    os.chown(target, OTHER, OTHER)
    (tmp_path / "environment").symlink_to(target)
    make_roots(tmp_path / "environment", BUILDER)
    assert target.stat().st_uid == OTHER


def test_a_builder_that_says_nothing_is_given_up_on_at_its_deadline() -> None:
    read, write = os.pipe()
    try:
        began = time.monotonic()
        with pytest.raises(StackBuildError, match="longer than"):
            relay(read, lambda message, percent: None, began + 0.3)
        assert time.monotonic() - began < 5
    finally:
        os.close(read)
        os.close(write)


def test_the_builders_progress_is_passed_on_and_its_last_word_kept() -> None:
    read, write = os.pipe()
    os.write(write, b'{"progress": "building", "percent": 5}\nnoise\n{"ok": true}')
    os.close(write)
    seen: list[tuple[str, int]] = []
    try:
        last = relay(read, lambda message, percent: seen.append((message, percent)), 1e12)
    finally:
        os.close(read)
    assert seen == [("building", 5)]
    assert last == {"ok": True}


def test_a_process_the_build_left_holding_its_output_does_not_hold_the_start() -> None:
    read, write = os.pipe()  # ``write`` stays open, as a process the builder left holds it
    os.write(write, b'{"ok": true}\n')
    try:
        last = relay(read, lambda message, percent: None, time.monotonic() + 30, lambda: True)
    finally:
        os.close(read)
        os.close(write)
    assert last == {"ok": True}


def test_sources_unused_for_long_are_pruned_but_not_the_one_in_use(tmp_path: Path) -> None:
    assert stale_sources({"a": 10.0, "b": 50.0, "c": 5.0}, 20.0, "c") == ["a"]
    for name in ("old", "new", "used"):
        (tmp_path / name / "common").mkdir(parents=True)
    for name in ("old", "used"):
        os.utime(tmp_path / name, (1.0, 1.0))
    prune_sources(tmp_path, time.time() - 3600, tmp_path / "used")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "used"]


def test_a_stacks_notebook_program_must_stay_in_its_environment(tmp_path: Path) -> None:
    environment = tmp_path / "environment"
    (environment / "bin").mkdir(parents=True)
    inside = environment / "bin" / "jupyterhub-singleuser"
    inside.write_text("#!/bin/sh\n")
    assert stack_program_refusal(str(inside), environment, "/usr/bin/configured") is None
    python = environment / "bin" / "python"
    python.symlink_to(sys.executable)  # as venv makes it: the agent's own Python
    assert stack_program_refusal(str(python), environment, "/usr/bin/configured") is None
    inside.unlink()
    inside.symlink_to("/bin/sh")
    refusal = stack_program_refusal(str(inside), environment, "/usr/bin/configured")
    assert refusal is not None
    assert "outside its environment" in refusal


def test_the_way_opened_is_the_configured_commands_and_the_agents_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from composespawner.hostagent import accounts

    opened: list[Path] = []
    monkeypatch.setattr(accounts, "let_group_in", lambda folders: opened.extend(folders))
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    script = tmp_path / "notebook"
    script.write_text(f"#!{closed}/python\n")  # the administrator's: trusted
    open_the_way([str(script)])
    assert closed in opened
    python = Path(sys.executable)
    assert opened[-len(accounts.folders_to_open([python])) :] == accounts.folders_to_open([python])
    opened.clear()
    open_the_way()  # the build account's way: the agent's Python alone
    assert closed not in opened


def test_a_process_whose_first_thread_left_is_still_found_by_its_running_thread() -> None:
    # The zombie-led planter of tests/hostagent/test_probe.py: /proc shows its leader as a
    # zombie while its second thread runs. The sweep of the build account finds it.
    code = (
        "import ctypes, sys, threading\n"
        "threading.Thread(target=sys.stdin.read).start()\n"
        "print(flush=True)\n"
        "ctypes.CDLL(None).syscall(60, 0)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as planter:
        assert planter.stdin is not None
        assert planter.stdout is not None
        planter.stdout.readline()
        deadline = time.monotonic() + 10
        while status_of(planter.pid)["State"][0] != "Z":  # the leader has left
            assert time.monotonic() < deadline
            time.sleep(0.01)  # polling /proc: the condition itself
        assert planter.pid in processes_of(os.getuid())
        planter.stdin.close()
