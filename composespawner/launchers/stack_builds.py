"""Building a stack's environment without trusting the build.

A build runs what its stack brought: pip installs the lock's wheels and the
environment's Python runs the common ``stack_manifest.py`` (and any ``.pth``
file a wheel put in). As root that would give whoever wrote the stack the
machine (a host's agent is given stacks by the hub; a hub's catalog by its
administrators, a course's by its teachers). So the build runs in a child
(:mod:`.stack_builder`), never in the agent's or the hub's own process:

- as root's caller (a host's agent, a hub run as root): as the system account
  ``BuildPlace.account``, without new privileges, in a cgroup of its own
  (:func:`build_cgroup`) killed whole once it is done, so nothing it started outlives
  it, however dead it looks to ``/proc``; then every process of the build account is
  ended, and only then is the environment made root's and written by root alone
  (:func:`make_roots`): walked by folder descriptor, never through a link, so that no
  later build can change what notebooks run. The stacks folder is root's with the
  sticky bit and writable by that account's group (it makes new environments there,
  and cannot rename or remove root's). Root never writes into an environment, nor
  through anything in it: the build may have planted links anywhere
  (``/root/.ssh/authorized_keys``, a folder in the middle of site-packages). So an
  environment keeps the notebook side it was built with (its name covers it).
- as anyone else (a hub run as its own account): as that account, whose notebooks
  the environments serve (:func:`build_own`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from composespawner.domain.hardware import Share
from composespawner.launchers.accounts import becoming
from composespawner.launchers.agent_protocol import StackSource
from composespawner.launchers.cgroups import (
    CgroupError,
    Limits,
    cgroup_name,
    find_hierarchies,
    join_then,
    make_cgroup,
    new_token,
    pids_limit,
    plan_cgroup,
    remove_cgroups,
)
from composespawner.launchers.environments import StackBuildError, StackEnvironment
from composespawner.launchers.gpu_devices import BASIC_DEVICES
from composespawner.launchers.ipc import remove_ipc_of, thread_runs_as
from composespawner.launchers.stack_sources import source_body

BUILD_LOCK = ".build.lock"  # in the locks folder: one build at a time
END_TIMEOUT = 15.0  # seconds for the build account's processes to be gone once killed
LINE_LIMIT = 1 << 20  # bytes: a builder's line longer than this is not one of ours
POLL_EVERY = 0.5  # seconds between looks at whether the builder has ended
BUILDER = "composespawner.launchers.stack_builder"
log = logging.getLogger("composespawner.stacks")
Progress = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class BuildPlace:
    """Where and as whom a root's caller builds, and what the build may use."""

    stacks: Path  # where environments go
    locks: Path  # root's alone: the lock that lets one build run at a time
    account: str  # the system account a build runs as
    cgroup_parent: tuple[str, ...]  # below each hierarchy's root
    share: Share  # the cores and memory a build may use
    pids_per_gib: int
    timeout: float  # seconds a build may take


@contextlib.contextmanager
def locked(folder: Path, name: str) -> Iterator[None]:
    """``name`` in ``folder`` (root's alone), held by one process at a time.

    ``folder`` may sit in the stacks folder, where the build account adds: one there of
    anyone else's (or a link) is not the lock's, and goes (the sticky bit lets root
    remove it; no one else can change root's once made).
    """
    with contextlib.suppress(FileNotFoundError):
        found = folder.lstat()
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0:
            _remove(folder, found)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(folder.lstat().st_mode) != 0o700:
        folder.chmod(0o700)
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _remove(path: Path, found: os.stat_result) -> None:
    log.warning("removing %s, which is not root's folder", path)
    if stat.S_ISDIR(found.st_mode):
        shutil.rmtree(path)  # follows no link
    else:
        path.unlink()


def build_settled(
    environment: StackEnvironment,
    source: StackSource,
    place: BuildPlace,
    account_of: Callable[[], pwd.struct_passwd],
    progress: Progress,
) -> StackEnvironment:
    """``environment``, built first (as the build account ``account_of`` makes, able to
    reach this Python) and made root's if need be; StackBuildError if it cannot be."""
    if settled(environment):
        return environment
    account = account_of()
    open_stacks_to(place.stacks, account)
    # One build at a time here: what a build left running is ended after it, before
    # its environment becomes root's (it must not change another's meanwhile).
    with locked(place.locks, BUILD_LOCK):
        if not settled(environment):  # another process may have built it meanwhile
            try:
                if not roots(environment.path):  # else a make_roots cut short: again
                    with build_cgroup(place) as procs:
                        run_builder(
                            source,
                            place.stacks,
                            progress,
                            place.timeout,
                            join_then(procs, becoming(account, "/")),
                        )
            finally:
                end_processes_of(account.pw_uid)  # none may run while it becomes root's
                remove_ipc_of(account.pw_uid)  # nor anything it left in shared memory
            make_roots(environment.path, account.pw_uid)
            if not settled(environment) and roots(environment.path):
                # Root's yet unfinished (no manifest): gone, so the next start builds it
                # anew. rmtree follows no link, and no one else writes in it now.
                shutil.rmtree(environment.path, ignore_errors=True)
    if not settled(environment):
        raise StackBuildError(f"the build left no environment at {environment.path}")
    return environment


def build_own(
    environment: StackEnvironment, source: StackSource, timeout: float, progress: Progress
) -> StackEnvironment:
    """``environment``, built as this process's own account (not root) if need be."""
    if not environment.manifest.is_file():
        run_builder(source, environment.path.parent, progress, timeout, None)
    if not environment.manifest.is_file():
        raise StackBuildError(f"the build left no environment at {environment.path}")
    return environment


def open_stacks_to(stacks: Path, account: pwd.struct_passwd) -> None:
    """``stacks`` made so that ``account`` can add environments there and change none of
    root's: root's, the account's group, sticky."""
    stacks.mkdir(mode=0o755, parents=True, exist_ok=True)
    found = stacks.lstat()
    if (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) != (0, account.pw_gid, 0o1775):
        os.chown(stacks, 0, account.pw_gid)
        stacks.chmod(0o1775)


def settled(environment: StackEnvironment) -> bool:
    """Built, and root's to the end: :func:`make_roots` opens the folder to all last."""
    try:
        found = environment.path.lstat()
        manifest = environment.manifest.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(found.st_mode)
        and found.st_uid == 0
        and stat.S_IMODE(found.st_mode) == 0o755
        and stat.S_ISREG(manifest.st_mode)
        and manifest.st_uid == 0
    )


def roots(path: Path) -> bool:
    """A folder root's: the build is done, its making root's begun."""
    try:
        found = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == 0


def build_limits(place: BuildPlace) -> Limits:
    """What a build's cgroup holds it to: the host's cores and memory (a build runs before
    its notebook, in no share of its own), its pids, and no device but the basics."""
    return Limits(place.share, pids_limit(place.share, place.pids_per_gib), BASIC_DEVICES)


@contextlib.contextmanager
def build_cgroup(place: BuildPlace) -> Iterator[tuple[Path, ...]]:
    """A cgroup for one build (its ``cgroup.procs`` files), killed whole and removed after.

    A build runs the request's code, and what it leaves running must end before its
    environment becomes root's: one that looks dead to ``/proc`` (a process whose first
    thread left with the raw exit syscall shows as a zombie while its other threads
    run) would write into the next environment built here. Nothing leaves a cgroup it
    cannot write, and every thread in it ends with it.
    """
    name = cgroup_name(place.account, "build", new_token())
    try:
        plan = plan_cgroup(find_hierarchies(), place.cgroup_parent, name, build_limits(place))
        make_cgroup(plan)
    except CgroupError as e:
        raise StackBuildError(f"cannot make the build's cgroup: {e}") from e
    try:
        yield plan.procs
    except BaseException:
        # The build's own error is the one to say; what will not end is logged.
        try:
            remove_cgroups(plan.cgroups, END_TIMEOUT)
        except CgroupError as e:
            log.error("the failed build left processes that will not end: %s", e)
        raise
    try:
        remove_cgroups(plan.cgroups, END_TIMEOUT)
    except CgroupError as e:
        raise StackBuildError(f"the build left processes that will not end: {e}") from e


def run_builder(
    source: StackSource,
    stacks: Path,
    progress: Progress,
    timeout: float,
    preexec: Callable[[], None] | None,
) -> None:
    """Run the builder child on ``source`` (as ``preexec`` makes it), passing its progress
    on; StackBuildError with its last word if it fails or outruns ``timeout``."""
    environ = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the site's index
    environ.update(PATH=os.defpath, HOME="/nonexistent", LANG="C.UTF-8")
    child = subprocess.Popen(
        [sys.executable, "-I", "-m", BUILDER, str(stacks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environ,
        cwd="/",
        preexec_fn=preexec,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    deadline = time.monotonic() + timeout + 60
    try:
        child.stdin.write(json.dumps(source_body(source)).encode())
        child.stdin.close()
        last = relay(child.stdout.fileno(), progress, deadline, lambda: child.poll() is not None)
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as e:
        raise StackBuildError(f"building took longer than {timeout:.0f} s") from e
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    if child.returncode != 0 or last.get("ok") is not True:
        raise StackBuildError(str(last.get("error") or f"the build exited with {child.returncode}"))


def relay(
    fd: int, progress: Progress, deadline: float, finished: Callable[[], bool] = lambda: False
) -> dict[str, object]:
    """Pass the builder's progress on (re-made: its words are not passed raw) until it
    closes ``fd`` or is ``finished`` (a process it left may hold ``fd`` open); its last
    line. Read with a timeout: a builder that says nothing (or never ends its line) is
    given up on at ``deadline`` (monotonic) all the same."""
    last: dict[str, object] = {}
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    pending = b""
    after = 0  # bytes read once the builder had ended: what it left may write on and on
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StackBuildError("building took longer than its deadline")
        done = finished()  # before the read: what it wrote before it ended is read still
        if not poller.poll(0 if done else max(1, int(min(left, POLL_EVERY) * 1000))):
            if done:
                break
            continue
        chunk = os.read(fd, 65536)
        after += len(chunk) if done else 0
        if not chunk or after > LINE_LIMIT:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > LINE_LIMIT:
            pending = b""
        for line in lines:
            last = _take(line, progress, last)
    return _take(pending, progress, last)


def _take(raw: bytes, progress: Progress, last: dict[str, object]) -> dict[str, object]:
    """One line of the builder's: progress passed on, or its last word (returned)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return last
    if not isinstance(body, dict):
        return last
    if "progress" not in body:
        return body
    percent = body.get("percent")
    progress(str(body["progress"])[:200], percent if isinstance(percent, int) else 0)
    return last


def processes_of(uid: int) -> list[int]:
    """The processes running as ``uid`` with a thread that runs: a zombie whose threads
    are all gone runs nothing, and goes once its parent (or init) reaps it, but a process
    whose first thread left with the raw exit syscall shows as a zombie while its other
    threads run on. Each thread is looked at."""
    return [
        int(process.name)
        for process in Path("/proc").glob("[0-9]*")
        if any(thread_runs_as(uid, status) for status in process.glob("task/[0-9]*/status"))
    ]


def end_processes_of(uid: int, timeout: float = END_TIMEOUT) -> None:
    """SIGKILL every process of the build account (none should outlive a build), until
    /proc shows none: one may have forked between a look and the kill, and a killed one
    may finish the call it was in (a write into the environment) before it goes."""
    deadline = time.monotonic() + timeout
    while left := processes_of(uid):
        if time.monotonic() > deadline:
            raise StackBuildError(
                f"the build account's processes {left[:10]} did not end in {timeout:.0f} s"
            )
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)  # /proc is looked at again: killed processes take a moment to go


def make_roots(path: Path, builder: int) -> None:
    """Everything in the environment root's, and written by root alone (group's and
    others' write, set-id and sticky bits cleared): walked by folder descriptor, each
    entry as it is (a link itself, never what it names, nor a folder swapped for a link).

    Run once none of the build account's processes is left. The environment is root's
    alone (0700) while this runs, so that no one enters it meanwhile; it is opened to
    all (0755) last, which is what :func:`settled` looks for (a walk cut short is done
    again). An entry of neither root's nor the build account's came from outside (a hard
    link, or another account writing into a folder the build left open): removed.
    """
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # absent, or a link: not settled, and the start fails saying so
        return
    try:
        os.fchown(top, 0, 0)
        os.fchmod(top, 0o700)
        for _, folders, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            if not os.path.samestat(os.fstat(fd), os.fstat(top)):
                os.fchown(fd, 0, 0)  # the folder first: then no one else changes its entries
                os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & 0o755)
            for name in (*folders, *files):
                _make_root(name, fd, builder)
        os.fchmod(top, 0o755)
    finally:
        os.close(top)


def _make_root(name: str, folder: int, builder: int) -> None:
    """One entry of a folder already root's alone (see :func:`_make_roots`)."""
    # O_PATH: the entry itself, opened without following a link, and without opening
    # a FIFO or device; its mode is changed through /proc on exactly what was opened.
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=folder)
    try:
        found = os.fstat(fd)
        if found.st_uid not in (0, builder) and not stat.S_ISDIR(found.st_mode):
            os.unlink(name, dir_fd=folder)
            return
        os.chown(name, 0, 0, dir_fd=folder, follow_symlinks=False)
        if not stat.S_ISLNK(found.st_mode):  # a link's own mode means nothing
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(found.st_mode) & 0o755)
    finally:
        os.close(fd)
