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
environments there, and cannot rename or remove root's). Once built, the
environment is made root's (``chown -R``, never through a link), so no later
build can change what notebooks run. Root itself only reads the environment
(is it there, and root's?) and writes the notebook side's files into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.state import StateDir
from composespawner.launchers.agent_protocol import StackSource
from composespawner.launchers.environments import (
    BUILD_TIMEOUT,
    StackBuildError,
    StackEnvironment,
    StackEnvironments,
)

LOCK_FILE = "requirements.lock"
BUILD_LOCK = ".build.lock"  # in the state folder: one build at a time
SOURCES = ".sources"  # the builder's copies of the stacks' files, in stacks_dir
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
    """Write the stack's lock and common files under ``sources`` (kept: found next time)."""
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
    return folder


# -- root's side ------------------------------------------------------------------


def environment_for(
    source: StackSource, config: AgentConfig, progress: Progress
) -> StackEnvironment:
    """The stack's environment, built first (as the build account) if need be."""
    stack = stack_of(source, materialise(source, config.state_dir / "stacks"))
    assert stack.common is not None
    builder = StackEnvironments(config.stacks_dir, stack.common)
    environment = builder.environment(stack)  # the lock checked against its hash
    if not _settled(environment):
        account = _build_account(config)
        # One build at a time on this host: what a build left running is ended after it,
        # before its environment becomes root's (it must not change another's meanwhile).
        with StateDir(config.state_dir).locked(BUILD_LOCK):
            try:
                _build_as(account, source, config.stacks_dir, progress)
            finally:
                _end_processes_of(account.pw_uid)
            _make_roots(environment.path)
        if not _settled(environment):
            raise StackBuildError(f"the build left no environment at {environment.path}")
    # Ready: this only brings the notebook side (repro.py, the client) up to date.
    return asyncio.run(builder.ensure(stack, progress))


def _settled(environment: StackEnvironment) -> bool:
    """Built, and root's (not a link, nor the build account's to change)."""
    try:
        found = environment.path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == 0 and environment.manifest.is_file()


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
    except AccountError as e:
        raise StackBuildError(str(e)) from e
    open_the_way([sys.executable])
    stacks = config.stacks_dir
    stacks.mkdir(mode=0o755, parents=True, exist_ok=True)
    found = stacks.lstat()
    if (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) != (0, account.pw_gid, 0o1775):
        os.chown(stacks, 0, account.pw_gid)
        stacks.chmod(0o1775)
    return account


def _build_as(
    account: pwd.struct_passwd, source: StackSource, stacks: Path, progress: Progress
) -> None:
    from composespawner.hostagent.accounts import becoming

    environ = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}  # the site's index
    environ.update(PATH=os.defpath, HOME="/nonexistent", LANG="C.UTF-8")
    child = subprocess.Popen(
        [sys.executable, "-I", "-m", "composespawner.hostagent.stacks", str(stacks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=environ,
        preexec_fn=becoming(account, "/"),
    )
    assert child.stdin is not None
    assert child.stdout is not None
    deadline = time.monotonic() + BUILD_TIMEOUT + 60
    try:
        child.stdin.write(json.dumps(source_body(source)).encode())
        child.stdin.close()
        last = _relay(child.stdout, progress, deadline)
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0 or last.get("ok") is not True:
        raise StackBuildError(str(last.get("error") or f"the build exited with {child.returncode}"))


def _relay(lines: object, progress: Progress, deadline: float) -> dict[str, object]:
    """Pass the builder's progress on (re-made: its words are not passed raw); its last line."""
    last: dict[str, object] = {}
    for raw in lines:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise StackBuildError(f"building took longer than {BUILD_TIMEOUT:.0f} s")
        try:
            body = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        if "progress" in body:
            percent = body.get("percent")
            progress(str(body["progress"])[:200], percent if isinstance(percent, int) else 0)
        else:
            last = body
    return last


def _end_processes_of(uid: int) -> None:
    """SIGKILL every process of the build account (none should outlive a build)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uids = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if str(uid) in uids.split()[1:]:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(status.parent.name), signal.SIGKILL)


def _make_roots(path: Path) -> None:
    """Everything in the environment root's: links themselves, never what they name."""
    if path.is_symlink() or not path.is_dir():
        return
    for folder, folders, files in os.walk(path):
        os.lchown(folder, 0, 0)
        for name in (*folders, *files):
            os.lchown(os.path.join(folder, name), 0, 0)


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
    stack = stack_of(source, materialise(source, stacks / SOURCES))
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
