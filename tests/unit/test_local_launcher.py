"""The local launcher's start: the process is made off the hub's loop, files first.

A real process each time (a short Python sleep); ``Popen`` is wrapped, not
replaced, to see from which thread it is called and what exists by then.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.launchers import local, ports
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.local_process import started_from_stat

SLEEP = [sys.executable, "-I", "-c", "import time; time.sleep(60)"]


@pytest.fixture
def user() -> Iterator[User]:
    db = orm.new_session_factory("sqlite:///:memory:")()
    orm_user = orm.User(name="student1")
    db.add(orm_user)
    db.commit()
    yield User(orm_user, {})
    db.close()


def launcher(user: User, homes: Path) -> LocalLauncher:
    spawner: LocalLauncher = user._new_spawner(
        "",
        spawner_class=LocalLauncher,
        cmd=SLEEP,
        hub=Hub(),
        shared_account=True,
        notebook_account="",  # the test's own account: nothing to switch to
        home_dir_template=str(homes / "{username}"),
        interrupt_timeout=1,
        term_timeout=1,
        kill_timeout=1,
    )
    return spawner


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What each Popen call of the launcher saw; the real Popen still runs."""
    calls: list[dict[str, Any]] = []
    real = subprocess.Popen

    def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        home = Path(kwargs["cwd"])
        calls.append(
            {
                "thread": threading.current_thread(),
                "home": home.is_dir(),
                "manifest": (home / ".composespawner" / "default.run.json").is_file(),
            }
        )
        return real(cmd, **kwargs)

    monkeypatch.setattr(local, "Popen", popen)
    return calls


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_process_is_made_in_a_worker_thread_after_its_home_and_manifest(
    user: User, tmp_path: Path, seen: list[dict[str, Any]]
) -> None:
    spawner = launcher(user, tmp_path)
    path = await spawner.deliver_run_manifest({"version": 1})
    assert path == str(tmp_path / "student1" / ".composespawner" / "default.run.json")
    try:
        await spawner.start()
        pid = spawner.pid
        assert alive(pid)
        assert seen == [{"thread": seen[0]["thread"], "home": True, "manifest": True}]
        assert seen[0]["thread"] is not threading.main_thread()
        written = Path(path)
        assert await asyncio.to_thread(written.read_text) == '{\n  "version": 1\n}\n'
        assert (await asyncio.to_thread(written.stat)).st_mode & 0o777 == 0o444
    finally:
        await spawner.stop()
    assert not alive(pid)


async def test_a_start_cancelled_while_its_process_is_made_keeps_it_for_the_stop(
    user: User, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start timeout cancels start(); the stop that follows must find the process."""
    creating, go_on = threading.Event(), threading.Event()
    real = subprocess.Popen

    def slow_popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        creating.set()
        go_on.wait(timeout=10)
        return real(cmd, **kwargs)

    monkeypatch.setattr(local, "Popen", slow_popen)
    spawner = launcher(user, tmp_path)
    start = asyncio.ensure_future(spawner.start())
    await asyncio.to_thread(creating.wait, 10)
    start.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await start
    pid = spawner.pid
    assert pid
    assert alive(pid)
    await spawner.stop()
    assert not alive(pid)


async def test_notebooks_started_at_once_get_distinct_ports_outside_the_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pick draws the same random sequence: only the hub's record keeps them apart."""
    real = ports.notebook_port

    def same_sequence(ip: str, avoid: Container[int]) -> int:
        return real(ip, avoid, rng=random.Random(7))

    monkeypatch.setattr(local, "notebook_port", same_sequence)
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add_all(orm.User(name=f"student{i}") for i in range(8))
    db.commit()
    users = [User(u, {}) for u in db.query(orm.User)]
    spawners = [launcher(u, tmp_path) for u in users]
    try:
        await asyncio.gather(*(s.start() for s in spawners))
        chosen = [s.port for s in spawners]
        assert len(set(chosen)) == len(chosen)
        assert not set(chosen) & set(ports.ephemeral_ports())
        # A restart chooses afresh: meanwhile its old port may have been taken.
        first = spawners[0]
        await first.stop()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", chosen[0]))
            squatter.listen()
            await first.start()
        assert first.port not in chosen
    finally:
        await asyncio.gather(*(s.stop() for s in spawners))
        db.close()


async def test_a_configured_port_is_kept(user: User, tmp_path: Path) -> None:
    spawner = launcher(user, tmp_path)
    spawner.port = 47123
    try:
        assert await spawner.start() == ("127.0.0.1", 47123)
    finally:
        await spawner.stop()


def restored(user: User, homes: Path, state: dict[str, Any]) -> LocalLauncher:
    """A launcher as a restarted hub makes it: no process handle, the saved state."""
    spawner = launcher(user, homes)
    spawner.load_state(state)
    return spawner


async def test_a_restarted_hub_knows_its_notebook_by_pid_and_start_time(
    user: User, tmp_path: Path
) -> None:
    spawner = launcher(user, tmp_path)
    await spawner.start()
    try:
        state = spawner.get_state()
        assert state["pid_started"] == local.process_started(spawner.pid)
        assert await restored(user, tmp_path, state).poll() is None
        # A state saved before start times were kept: the pid alone says.
        assert await restored(user, tmp_path, {"pid": spawner.pid}).poll() is None

        # The pid now names another process (pid reuse): not the notebook, and
        # nothing signals that process.
        stranger = restored(user, tmp_path, {**state, "pid_started": state["pid_started"] - 1})
        assert await stranger.poll() == 0
        assert (stranger.pid, stranger.get_state()) == (0, {})
        await stranger.stop()
        assert alive(spawner.pid)
    finally:
        await spawner.stop()


@pytest.fixture
def zombie() -> Iterator[int]:
    """A process that exited and was not reaped: what a crashed hub's notebook is a while."""
    exited = subprocess.Popen([sys.executable, "-I", "-c", "pass"])
    stat = Path(f"/proc/{exited.pid}/stat")
    wait_until(lambda: stat.read_text().split(") ")[1][0] == "Z")
    yield exited.pid
    exited.wait(timeout=10)


async def test_a_notebook_left_a_zombie_by_a_crashed_hub_is_gone(
    user: User, tmp_path: Path, zombie: int
) -> None:
    assert alive(zombie)  # what a pid check alone sees
    assert local.process_started(zombie) is None
    assert await restored(user, tmp_path, {"pid": zombie}).poll() == 0


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_start_time_is_read_after_a_command_name_with_spaces_and_parentheses() -> None:
    rest = " ".join(str(n) for n in range(4, 53))  # fields 4-52: starttime is field 22
    assert started_from_stat(f"42 (a) (b c) S {rest}\n") == 22
    assert started_from_stat(f"42 (nb) Z {rest}\n") is None
    assert started_from_stat("42 (cut short") is None
