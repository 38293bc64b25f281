"""A stack's environment on this host, built from the lock the hub sent, never as root.

The hub sends the stack's lock and common files (it has the catalog; the host
does not). The environment is built under ``stacks_dir`` by the local
launcher's builder (:class:`~composespawner.launchers.environments.StackEnvironments`):
on first use, then found ready by every later start, by anyone.

A build runs what the request brought: pip installs the lock's wheels and the
environment's Python runs the common ``stack_manifest.py`` (and any ``.pth``
file a wheel put in). As root that would give the hub's key the host. So the
build runs in a child (``python -m composespawner.hostagent.stacks``) as the
system account ``build_account``, without new privileges; ``stacks_dir`` is
root's with the sticky bit and writable by that account's group (it makes new
environments there, and cannot rename or remove root's). The child adds the
notebook side (repro.py, the client) too, as the agent's version has it.

The build runs in a cgroup of its own (:func:`build_cgroup`), killed whole once
it is done, so nothing it started outlives it, however dead it looks to ``/proc``;
then every process of the build account is ended, and only then is the
environment made root's and written by root alone (:func:`_make_roots`): walked
by folder descriptor, never through a link, so that no later build can change
what notebooks run. Root never writes into the environment, nor through
anything in it: the build may have planted links anywhere (to
``/root/.ssh/authorized_keys``, or a folder in the middle of site-packages).
So an environment keeps the notebook side it was built with.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
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
from pathlib import Path

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.domain.hardware import Share
from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.state import StateDir
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
from composespawner.launchers.environments import (
    BUILD_TIMEOUT,
    StackBuildError,
    StackEnvironment,
    StackEnvironments,
)
from composespawner.launchers.gpu_devices import BASIC_DEVICES
from composespawner.launchers.ipc import remove_ipc_of, thread_runs_as

LOCK_FILE = "requirements.lock"
BUILD_LOCK = ".build.lock"  # in the state folder: one build at a time
SOURCES = ".sources"  # the builder's copies of the stacks' files, in stacks_dir
SOURCES_LOCK = ".sources.lock"  # in the state folder: materialised sources, and their pruning
KEEP_SOURCES = 14 * 86_400.0  # seconds a stack's materialised files stay unused
END_TIMEOUT = 15.0  # seconds for the build account's processes to be gone once killed
LINE_LIMIT = 1 << 20  # bytes: a builder's line longer than this is not one of ours
POLL_EVERY = 0.5  # seconds between looks at whether the builder has ended
log = logging.getLogger("composespawner.hostagent")
Progress = Callable[[str, int], None]


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
    return {
        "id": source.id,
        "label": source.label,
        "lock_sha256": source.lock_sha256,
        "lock": source.lock,
        "common": dict(source.common),
    }


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


# -- root's side ------------------------------------------------------------------


def environment_for(
    source: StackSource, config: AgentConfig, progress: Progress
) -> StackEnvironment:
    """The stack's environment, built first (as the build account) if need be."""
    state = StateDir(config.state_dir)
    sources = config.state_dir / "stacks"
    # Under a lock: another agent's prune must not remove the files this one reads.
    with state.locked(SOURCES_LOCK):
        folder = materialise(source, sources)
        stack = stack_of(source, folder)
        assert stack.common is not None
        environment = StackEnvironments(config.stacks_dir, stack.common).environment(stack)
        prune_sources(sources, time.time() - KEEP_SOURCES, folder)
    if _settled(environment):
        return environment
    account = _build_account(config)
    # One build at a time on this host: what a build left running is ended after it,
    # before its environment becomes root's (it must not change another's meanwhile).
    with state.locked(BUILD_LOCK):
        if not _settled(environment):  # another agent may have built it meanwhile
            try:
                if not _roots(environment.path):  # else a _make_roots cut short: again
                    _build_as(account, source, config, progress)
            finally:
                _end_processes_of(account.pw_uid)  # none may run while it becomes root's
                remove_ipc_of(account.pw_uid)  # nor anything it left in shared memory
            _make_roots(environment.path, account.pw_uid)
            if not _settled(environment) and _roots(environment.path):
                # Root's yet unfinished (no manifest): gone, so the next start builds it
                # anew. rmtree follows no link, and no one else writes in it now.
                shutil.rmtree(environment.path, ignore_errors=True)
    if not _settled(environment):
        raise StackBuildError(f"the build left no environment at {environment.path}")
    return environment


def _settled(environment: StackEnvironment) -> bool:
    """Built, and root's to the end: :func:`_make_roots` opens the folder to all last."""
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


def _roots(path: Path) -> bool:
    """A folder root's: the build is done, its making root's begun."""
    try:
        found = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == 0


def _build_account(config: AgentConfig) -> pwd.struct_passwd:
    """The build account (a system one, in the agent's group to reach its Python), and
    ``stacks_dir`` made so that it can add environments there and change none of root's."""
    from composespawner.hostagent.accounts import ensure_group, open_the_way
    from composespawner.hostagent.config import USERS_GROUP
    from composespawner.launchers.accounts import AccountError, ensure_account, useradd_command

    try:
        group = ensure_group(USERS_GROUP)
        command = useradd_command(config.build_account)
        account = ensure_account(
            config.build_account, [*command[:-1], "--groups", group, command[-1]]
        )
        open_the_way()  # the agent's own Python, which the build runs
    except AccountError as e:
        raise StackBuildError(str(e)) from e
    stacks = config.stacks_dir
    stacks.mkdir(mode=0o755, parents=True, exist_ok=True)
    found = stacks.lstat()
    if (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) != (0, account.pw_gid, 0o1775):
        os.chown(stacks, 0, account.pw_gid)
        stacks.chmod(0o1775)
    return account


def build_limits(config: AgentConfig) -> Limits:
    """What a build's cgroup holds it to: the host's cores and memory (a build runs before
    its notebook, in no share of its own), its pids, and no device but the basics."""
    share = Share(config.cores, config.memory_gib)
    return Limits(share, pids_limit(share, config.pids_per_gib), BASIC_DEVICES)


@contextlib.contextmanager
def build_cgroup(config: AgentConfig) -> Iterator[tuple[Path, ...]]:
    """A cgroup for one build (its ``cgroup.procs`` files), killed whole and removed after.

    A build runs the request's code, and what it leaves running must end before its
    environment becomes root's: one that looks dead to ``/proc`` (a process whose first
    thread left with the raw exit syscall shows as a zombie while its other threads
    run) would write into the next environment built here. Nothing leaves a cgroup it
    cannot write, and every thread in it ends with it.
    """
    name = cgroup_name(config.build_account, "build", new_token())
    try:
        plan = plan_cgroup(find_hierarchies(), config.cgroup_parent, name, build_limits(config))
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


def _build_as(
    account: pwd.struct_passwd, source: StackSource, config: AgentConfig, progress: Progress
) -> None:
    with build_cgroup(config) as procs:
        _run_builder(account, source, config.stacks_dir, procs, progress)


def _run_builder(
    account: pwd.struct_passwd,
    source: StackSource,
    stacks: Path,
    procs: tuple[Path, ...],
    progress: Progress,
) -> None:
    from composespawner.hostagent.accounts import becoming

    environ = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the site's index
    environ.update(PATH=os.defpath, HOME="/nonexistent", LANG="C.UTF-8")
    child = subprocess.Popen(
        [sys.executable, "-I", "-m", "composespawner.hostagent.stacks", str(stacks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environ,
        preexec_fn=join_then(procs, becoming(account, "/")),
    )
    assert child.stdin is not None
    assert child.stdout is not None
    deadline = time.monotonic() + BUILD_TIMEOUT + 60
    try:
        child.stdin.write(json.dumps(source_body(source)).encode())
        child.stdin.close()
        last = relay(child.stdout.fileno(), progress, deadline, lambda: child.poll() is not None)
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as e:
        raise StackBuildError(f"building took longer than {BUILD_TIMEOUT:.0f} s") from e
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
            raise StackBuildError(f"building took longer than {BUILD_TIMEOUT:.0f} s")
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


def _processes_of(uid: int) -> list[int]:
    """The processes running as ``uid`` with a thread that runs: a zombie whose threads
    are all gone runs nothing, and goes once its parent (or init) reaps it, but a process
    whose first thread left with the raw exit syscall shows as a zombie while its other
    threads run on. Each thread is looked at."""
    return [
        int(process.name)
        for process in Path("/proc").glob("[0-9]*")
        if any(thread_runs_as(uid, status) for status in process.glob("task/[0-9]*/status"))
    ]


def _end_processes_of(uid: int, timeout: float = END_TIMEOUT) -> None:
    """SIGKILL every process of the build account (none should outlive a build), until
    /proc shows none: one may have forked between a look and the kill, and a killed one
    may finish the call it was in (a write into the environment) before it goes."""
    deadline = time.monotonic() + timeout
    while left := _processes_of(uid):
        if time.monotonic() > deadline:
            raise StackBuildError(
                f"the build account's processes {left[:10]} did not end in {timeout:.0f} s"
            )
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)  # /proc is looked at again: killed processes take a moment to go


def _make_roots(path: Path, builder: int) -> None:
    """Everything in the environment root's, and written by root alone (group's and
    others' write, set-id and sticky bits cleared): walked by folder descriptor, each
    entry as it is (a link itself, never what it names, nor a folder swapped for a link).

    Run once none of the build account's processes is left. The environment is root's
    alone (0700) while this runs, so that no one enters it meanwhile; it is opened to
    all (0755) last, which is what :func:`_settled` looks for (a walk cut short is done
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


# -- the builder's side (the build account) -----------------------------------------


def build_here(
    stacks: Path, body: dict[str, object], say: Callable[[dict[str, object]], None]
) -> None:
    """Build the stack ``body`` names under ``stacks``, saying its progress."""
    common = body["common"]
    assert isinstance(common, dict)
    source = StackSource(  # checked by the agent that started this builder
        id=str(body["id"]),
        label=str(body["label"]),
        lock_sha256=str(body["lock_sha256"]),
        lock=str(body["lock"]),
        common=tuple(sorted((str(k), str(v)) for k, v in common.items())),
    )
    folder = materialise(source, stacks / SOURCES)
    prune_sources(stacks / SOURCES, time.time() - KEEP_SOURCES, folder)  # one build at a time
    stack = stack_of(source, folder)
    assert stack.common is not None
    builder = StackEnvironments(stacks, stack.common)
    asyncio.run(
        builder.ensure(
            stack, lambda message, percent: say({"progress": message, "percent": percent})
        )
    )


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)

    def say(body: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(body) + "\n")
        sys.stdout.flush()

    try:
        build_here(Path(sys.argv[1]), json.loads(sys.stdin.read()), say)
    except StackBuildError as e:
        say({"ok": False, "error": str(e)})
        return 1
    say({"ok": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
