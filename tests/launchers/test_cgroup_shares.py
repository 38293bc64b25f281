"""Two notebooks on one host, each held to its share by a cgroup of its own (real cgroups).

The local launcher starts two stand-in notebooks with a share of one core and
1 GiB each: one through the ``/bin/sh`` wrapper and ``setpriv`` (the shared
account), the other through a ``preexec_fn`` (a start that forks). The first
is made to allocate past its memory: the kernel kills it alone, and its
neighbour still answers. Every cgroup is gone after the stops.

Needs root and the cpu and memory controllers mounted read-write (v1 or v2);
run under ``flock /tmp/heavy.lock``: it holds a GiB of memory for a moment.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.domain.hardware import Device, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from composespawner.launchers.cgroups import (
    GIB,
    CgroupError,
    Hierarchy,
    find_hierarchies,
    new_token,
    unconfined,
)
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.local_process import process_started
from composespawner.launchers.ports import notebook_port
from tests.support.standin_http import answers, get

pytestmark = pytest.mark.timeout(120)

HUNGRY = Path(__file__).with_name("hungry_notebook.py")
SHARE = Share(cores=1, memory_gib=1)


def notebook_uid() -> int:
    return pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT).pw_uid


def usable_hierarchies() -> tuple[Hierarchy, ...]:
    if os.geteuid() != 0:
        pytest.skip("cgroups are written by root")
    try:
        notebook_uid()
    except KeyError:
        pytest.skip(f"no {DEFAULT_NOTEBOOK_ACCOUNT} account (make notebook-account)")
    try:
        return find_hierarchies()
    except CgroupError as e:
        pytest.skip(str(e))


@pytest.fixture
def parent() -> Iterator[str]:
    """A cgroup parent of this test's own, checked empty and removed at the end."""
    name = f"composespawner-test-{new_token()}"
    hierarchies = usable_hierarchies()
    yield name
    left = {
        h.mount: sorted(p.name for p in (h.mount / name).glob("*") if p.is_dir())
        for h in hierarchies
    }
    for hierarchy in hierarchies:
        if (hierarchy.mount / name).is_dir():
            (hierarchy.mount / name).rmdir()
    assert left == {h.mount: [] for h in hierarchies}, "cgroups left behind"


@pytest.fixture
def users() -> Iterator[list[User]]:
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add_all([orm.User(name="ada"), orm.User(name="bob")])
    db.commit()
    yield [User(u, {}) for u in db.query(orm.User).order_by(orm.User.name)]
    db.close()


def notebook(user: User, homes: Path, parent: str, **config: object) -> LocalLauncher:
    port = notebook_port("127.0.0.1", set())
    spawner: LocalLauncher = user._new_spawner(
        "",
        spawner_class=LocalLauncher,
        cmd=[sys.executable, "-I", str(HUNGRY), str(port)],
        hub=Hub(),
        shared_account=True,
        home_dir_template=str(homes / "{username}"),
        cgroup_parent=parent,
        interrupt_timeout=2,
        term_timeout=2,
        kill_timeout=2,
        **config,
    )
    spawner.port = port
    spawner.share = SHARE
    return spawner


def cgroups_of(pid: int, hierarchies: tuple[Hierarchy, ...]) -> set[Path]:
    """The cgroup directories ``pid`` is in, in the hierarchies that hold cpu and memory."""
    found = set()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        for hierarchy in hierarchies:
            v2_line = number == "0" and hierarchy.v2
            if v2_line or (
                not hierarchy.v2 and hierarchy.controllers & set(controllers.split(","))
            ):
                found.add(hierarchy.mount / path.lstrip("/"))
    return found


def limits(cgroups: set[Path]) -> dict[str, str]:
    """The share's limits as the kernel shows them, whichever hierarchy holds each."""
    names = (
        "cpu.max",
        "memory.max",
        "memory.swap.max",
        "cpu.cfs_quota_us",
        "cpu.cfs_period_us",
        "memory.limit_in_bytes",
        "memory.memsw.limit_in_bytes",
    )
    return {
        name: (cgroup / name).read_text().strip()
        for cgroup in cgroups
        for name in names
        if (cgroup / name).exists()
    }


def expected_limits(hierarchies: tuple[Hierarchy, ...]) -> dict[str, str]:
    expected: dict[str, str] = {}
    for hierarchy in hierarchies:
        cpu, memory = "cpu" in hierarchy.controllers, "memory" in hierarchy.controllers
        if hierarchy.v2:
            expected |= {"cpu.max": "100000 100000"} if cpu else {}
            swap = Path("/sys/fs/cgroup/memory.swap.max").exists() or any(
                hierarchy.mount.glob("*/memory.swap.max")
            )
            expected |= {"memory.max": str(GIB)} if memory else {}
            expected |= {"memory.swap.max": "0"} if memory and swap else {}
        else:
            expected |= {"cpu.cfs_quota_us": "100000", "cpu.cfs_period_us": "100000"} if cpu else {}
            expected |= {"memory.limit_in_bytes": str(GIB)} if memory else {}
            if memory and (hierarchy.mount / "memory.memsw.limit_in_bytes").exists():
                expected["memory.memsw.limit_in_bytes"] = str(GIB)
    return expected


async def exit_status(spawner: LocalLauncher, within: float = 30) -> int:
    """The process's exit status, read on the loop (where the launcher's exit watch reads it)."""
    deadline = time.monotonic() + within
    while (status := spawner.proc.poll()) is None:
        assert time.monotonic() < deadline, "the notebook did not exit"
        await asyncio.sleep(0.05)  # polling the process: the condition itself
    return status


async def test_a_notebook_past_its_memory_is_killed_alone_and_every_cgroup_goes(
    users: list[User], tmp_path: Path, parent: str
) -> None:
    hierarchies = usable_hierarchies()
    # Through the sh wrapper, then setpriv to the notebook account (Popen may vfork) ...
    hungry = notebook(users[0], tmp_path, parent)
    # ... and through a preexec_fn (here entering the home, as without Popen's cwd).
    neighbour = notebook(users[1], tmp_path, parent, popen_kwargs={})
    spawners = [hungry, neighbour]
    try:
        await asyncio.gather(*(s.start() for s in spawners))
        for spawner in spawners:
            assert await asyncio.to_thread(answers, spawner) == "ok"
            cgroups = cgroups_of(spawner.pid, hierarchies)
            assert cgroups == set(spawner._cgroups)
            assert all(c.parent.name == parent for c in cgroups)
            assert limits(cgroups) == expected_limits(hierarchies)
        assert not set(hungry._cgroups) & set(neighbour._cgroups)
        # The wrapper entered as root, then setpriv dropped to the notebook account.
        assert hungry.proc.args[0] == "/bin/sh"
        assert os.stat(f"/proc/{hungry.pid}").st_uid == notebook_uid()
        assert neighbour.proc.args[0] == "setpriv"  # entered in its preexec_fn
        assert await asyncio.to_thread(get, neighbour, "/allocate/256") == "holding 256 MiB"
        child = int(await asyncio.to_thread(get, neighbour, "/child"))
        assert cgroups_of(child, hierarchies) == set(neighbour._cgroups)

        hungrys = set(hungry._cgroups)
        with pytest.raises(ConnectionResetError):  # http.client's RemoteDisconnected too
            await asyncio.to_thread(get, hungry, "/allocate/2048", 60)
        assert await exit_status(hungry) == -signal.SIGKILL  # the kernel's OOM kill: 137
        assert await hungry.poll() == -signal.SIGKILL
        assert not any(c.exists() for c in hungrys)

        assert await neighbour.poll() is None
        assert await asyncio.to_thread(answers, neighbour) == "ok"
        neighbours = set(neighbour._cgroups)
        await neighbour.stop()
        assert not any(c.exists() for c in neighbours)
        assert process_started(child) is None  # it left with its notebook's cgroup
    finally:
        await asyncio.gather(*(s.stop() for s in spawners))


async def test_a_restarted_hub_removes_the_cgroups_its_state_names(
    users: list[User], tmp_path: Path, parent: str
) -> None:
    """A hub that restarted has no Popen handle: the state's paths say what to remove."""
    first = notebook(users[0], tmp_path, parent)
    await first.start()
    try:
        assert await asyncio.to_thread(answers, first) == "ok"
        state, cgroups = first.get_state(), first._cgroups
        assert state["cgroups"] == [str(c) for c in cgroups]
        restored = notebook(users[0], tmp_path, parent)
        restored.load_state(state)
        assert await restored.poll() is None
        await restored.stop()
        assert process_started(state["pid"]) is None
        assert not any(c.exists() for c in cgroups)
    finally:
        await first.stop()


async def test_a_fork_bomb_stops_at_the_notebooks_pids_limit_and_its_neighbour_forks(
    users: list[User], tmp_path: Path, parent: str
) -> None:
    bomber = notebook(users[0], tmp_path, parent, pids_per_gib=32)  # 1 GiB: 64 at most
    neighbour = notebook(users[1], tmp_path, parent, pids_per_gib=32)
    spawners = [bomber, neighbour]
    try:
        await asyncio.gather(*(s.start() for s in spawners))
        for spawner in spawners:
            assert await asyncio.to_thread(answers, spawner) == "ok"
        made, said = (await asyncio.to_thread(get, bomber, "/forks", 60)).split()
        assert said == "EAGAIN"
        assert 0 < int(made) < 64
        # The bomber's children went with its count; the neighbour's count is its own.
        made, said = (await asyncio.to_thread(get, neighbour, "/forks", 60)).split()
        assert (said, 0 < int(made) < 64) == ("EAGAIN", True)
        assert await bomber.poll() is None
    finally:
        await asyncio.gather(*(s.stop() for s in spawners))


@pytest.fixture
def nodes() -> Iterator[Path]:
    """A folder the notebook account can reach (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="cs-nodes-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


async def test_a_notebook_opens_its_own_gpus_node_and_never_its_neighbours(
    users: list[User], tmp_path: Path, parent: str, nodes: Path
) -> None:
    hierarchies = usable_hierarchies()
    if unconfined(hierarchies):
        pytest.fail("this machine mounts the v1 devices controller (TESTING.md): it should")
    uuids = ("aaaa0000-0000-0000-0000-000000000001", "bbbb0000-0000-0000-0000-000000000002")
    driver = tmp_path / "driver"
    for minor, uuid in enumerate(uuids):
        (driver / "gpus" / f"0000:1{minor}:00.0").mkdir(parents=True)
        (driver / "gpus" / f"0000:1{minor}:00.0" / "information").write_text(
            f"GPU UUID: \t GPU-{uuid}\nDevice Minor: \t {minor}\n"
        )
    for minor in (0, 1):  # as the driver makes them by default: open to every account
        os.mknod(nodes / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        (nodes / f"nvidia{minor}").chmod(0o666)
    holder = notebook(users[0], tmp_path, parent, nvidia_proc_dir=str(driver))
    gpu = Device("r1-t4-1", "gpu", "NVIDIA T4", frozenset({"r1"}), "c1", "attached", uuid=uuids[0])
    holder.machine = ComposedMachine("m-1", "host-01", "r1", (gpu,), None, (), SHARE)
    other = notebook(users[1], tmp_path, parent, nvidia_proc_dir=str(driver))
    spawners = [holder, other]
    try:
        await asyncio.gather(*(s.start() for s in spawners))
        for spawner in spawners:
            assert await asyncio.to_thread(answers, spawner) == "ok"
        own, neighbours = (f"/open{nodes}/nvidia{minor}" for minor in (0, 1))
        # Its own node passes the cgroup (ENXIO: no driver behind it); the other does not.
        assert await asyncio.to_thread(get, holder, own) == "ENXIO"
        assert await asyncio.to_thread(get, holder, neighbours) == "EPERM"
        assert await asyncio.to_thread(get, other, own) == "EPERM"
        assert await asyncio.to_thread(get, other, "/open/dev/null") == "opened"
    finally:
        await asyncio.gather(*(s.stop() for s in spawners))


def shared_memory_of(uid: int) -> tuple[int, int]:
    """Bytes in /dev/shm files ``uid`` owns, and how many System V segments it owns."""
    held = sum(p.lstat().st_size for p in Path("/dev/shm").iterdir() if p.lstat().st_uid == uid)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    owner = lines[0].split().index("uid")
    return held, sum(1 for line in lines[1:] if int(line.split()[owner]) == uid)


async def test_what_notebooks_leave_in_shared_memory_goes_after_the_accounts_last(
    users: list[User], tmp_path: Path, parent: str
) -> None:
    uid = notebook_uid()  # the shared account both notebooks run as
    for _cycle in range(4):
        first, second = (notebook(user, tmp_path, parent) for user in users)
        try:
            await asyncio.gather(first.start(), second.start())
            for spawner in (first, second):
                assert await asyncio.to_thread(answers, spawner) == "ok"
                assert await asyncio.to_thread(get, spawner, "/shm/8") == "left 8 MiB"
            assert shared_memory_of(uid) == (16 << 20, 2)
            await first.stop()
            assert shared_memory_of(uid) == (16 << 20, 2)  # the account's other notebook runs
        finally:
            await asyncio.gather(first.stop(), second.stop())
        assert shared_memory_of(uid) == (0, 0)
