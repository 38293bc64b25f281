"""The probe's attacks on notebooks in containers (the container launcher, real podman).

Two notebooks of different users run side by side, each in a container of its own
from the PyTorch CPU image that ``make images`` built, pulled by digest from the
registry on loopback: the stand-in notebook (``hungry_notebook.py``, in the image's
Python) does what code in a student's notebook could. Each notebook holds a share of
one core and 1 GiB.

Needs root, podman and the built image (``make images``); run under
``flock /tmp/heavy.lock``: it holds a GiB of memory for a moment.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import pwd
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.domain.catalog import Catalog, Stack
from composespawner.domain.hardware import Device, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from composespawner.launchers.local_container import PodmanLauncher
from composespawner.launchers.podman_api import OwnPodmanService, PodmanAPI
from composespawner.launchers.ports import notebook_port
from composespawner.launchers.relay import HubRelays
from harness import images
from harness.paths import HUB_CONFIG
from tests.support.standin_http import answers, get

pytestmark = [pytest.mark.timeout(180), pytest.mark.containers]

HUNGRY = Path(__file__).with_name("hungry_notebook.py").read_text()
SHARE = Share(cores=1, memory_gib=1)
UUIDS = ("aaaa0000-0000-0000-0000-000000000001", "bbbb0000-0000-0000-0000-000000000002")


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The PyTorch CPU image by digest, with the registry it is pulled from running and
    podman configured as make images configures it."""
    if os.geteuid() != 0:
        pytest.fail("the container launcher runs rootful podman: run the tests as root")
    built = images.built().get("pytorch-cpu")
    assert built is not None, "no pytorch-cpu image: run make images"
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in images.podman_env().items() if k.startswith("CONTAINERS")})
    try:
        with images.registry():
            yield built.by_digest
    finally:
        OwnPodmanService.stop_all()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
async def relays() -> AsyncIterator[None]:
    """The hub's relay sockets and podman connections each test's launchers opened,
    closed with its loop."""
    yield
    await HubRelays.stop()
    await PodmanAPI.close_all()


@pytest.fixture(scope="module")
def stack() -> Stack:
    (pytorch,) = [
        s for s in Catalog.from_file(HUB_CONFIG / "catalog.toml").stacks if s.id == "pytorch"
    ]
    return pytorch


@pytest.fixture
def users() -> Iterator[list[User]]:
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add_all([orm.User(name="ada"), orm.User(name="bob")])
    db.commit()
    yield [User(u, {}) for u in db.query(orm.User).order_by(orm.User.name)]
    db.close()


@pytest.fixture
def homes() -> Iterator[Path]:
    """The homes' folder: open to the notebook account (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="cs-homes-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def notebook(
    user: User, homes: Path, image: str, stack: Stack, taken: set[int], **config: object
) -> PodmanLauncher:
    port = notebook_port("127.0.0.1", taken)
    taken.add(port)
    spawner: PodmanLauncher = user._new_spawner(
        "",
        spawner_class=PodmanLauncher,
        cmd=["python", "-I", "-c", HUNGRY, str(port), "0.0.0.0"],
        hub=Hub(),
        shared_account=True,
        home_dir_template=str(homes / "{username}"),
        stack_images={stack.id: image},
        stack_variant="cpu",
        interrupt_timeout=5,
        term_timeout=5,
        kill_timeout=5,
        **config,
    )
    spawner.port = port
    spawner.share = SHARE
    spawner.stack = stack
    return spawner


async def start(*spawners: PodmanLauncher) -> None:
    for spawner in spawners:
        await spawner.prepare_launch()
    await asyncio.gather(*(s.start() for s in spawners))
    for spawner in spawners:
        assert await asyncio.to_thread(answers, spawner) == "ok"


async def ended(spawner: PodmanLauncher, within: float) -> int:
    """The notebook's exit status, once its poll finds it ended."""
    deadline = asyncio.get_running_loop().time() + within
    while (status := await spawner.poll()) is None:
        assert asyncio.get_running_loop().time() < deadline, "the notebook did not end"
        await asyncio.sleep(0.1)  # polling the container: the condition itself
    return status


async def test_a_fork_bomb_stops_at_its_limit_and_the_neighbour_and_host_fork(
    users: list[User], homes: Path, image: str, stack: Stack
) -> None:
    taken: set[int] = set()
    bomber, neighbour = (
        notebook(u, homes, image, stack, taken, pids_per_gib=32) for u in users
    )  # 1 GiB: 64 at most
    try:
        await start(bomber, neighbour)
        made, said = (await asyncio.to_thread(get, bomber, "/forks")).split()
        assert said == "EAGAIN"
        assert 0 < int(made) < 64
        made, said = (await asyncio.to_thread(get, neighbour, "/forks")).split()
        assert (said, 0 < int(made) < 64) == ("EAGAIN", True)
        host_forks = await asyncio.create_subprocess_exec("true")
        assert await host_forks.wait() == 0
    finally:
        await asyncio.gather(bomber.stop(), neighbour.stop())
    assert images.notebook_containers() == []


async def test_the_memory_kill_hits_one_notebook_alone(
    users: list[User], homes: Path, image: str, stack: Stack
) -> None:
    taken: set[int] = set()
    hungry, neighbour = (notebook(u, homes, image, stack, taken) for u in users)
    try:
        await start(hungry, neighbour)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            await asyncio.to_thread(get, hungry, "/allocate/2048")
        assert await ended(hungry, 60) == 137  # podman's: the container's process got SIGKILL
        assert await asyncio.to_thread(get, neighbour, "/") == "ok"
    finally:
        await asyncio.gather(hungry.stop(), neighbour.stop())
    assert images.notebook_containers() == []


async def test_tmp_and_shared_memory_are_the_notebooks_own_and_go_with_it(
    users: list[User], homes: Path, image: str, stack: Stack
) -> None:
    uid = pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT).pw_uid  # both run as the shared account
    for cycle in range(4):
        taken: set[int] = set()
        first, second = (notebook(u, homes, image, stack, taken) for u in users)
        try:
            await start(first, second)
            # Each /tmp holds only the mount point of the home's folder (under /tmp here).
            said = await asyncio.to_thread(get, first, f"/tmp/ada-{cycle}")
            assert said == f"ada-{cycle} {homes.name}"
            assert await asyncio.to_thread(get, second, "/tmp/") == homes.name
            for spawner in (first, second):
                assert await asyncio.to_thread(get, spawner, "/shm/8") == "left 8 MiB"
            assert shared_memory_on_host(uid) == (0, 0)  # in the containers' own
        finally:
            await asyncio.gather(first.stop(), second.stop())
        assert shared_memory_on_host(uid) == (0, 0)
        assert not await asyncio.to_thread(lambda: list(Path("/tmp").glob("ada-*")))
    assert images.notebook_containers() == []


def shared_memory_on_host(uid: int) -> tuple[int, int]:
    """Bytes in the host's /dev/shm files ``uid`` owns, and the System V segments it owns
    that the host sees (a container's own IPC namespace's are not listed)."""
    held = sum(p.lstat().st_size for p in Path("/dev/shm").iterdir() if p.lstat().st_uid == uid)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    owner = lines[0].split().index("uid")
    return held, sum(1 for line in lines[1:] if int(line.split()[owner]) == uid)


async def test_a_notebook_reaches_neither_its_neighbour_nor_the_hosts_loopback(
    users: list[User], homes: Path, image: str, stack: Stack
) -> None:
    taken: set[int] = set()
    first, second = (notebook(u, homes, image, stack, taken) for u in users)
    # A service on the host's loopback, as the hub's API or PostgreSQL listen.
    listener = socket.create_server(("127.0.0.1", notebook_port("127.0.0.1", taken)))
    host_service = listener.getsockname()[1]
    try:
        await start(first, second)
        for address in ("127.0.0.1", "10.0.2.2", host_address()):
            for port in (second.port, host_service):
                said = await asyncio.to_thread(get, first, f"/connect/{address}/{port}")
                assert said != "connected", f"reached {address}:{port}"
        # The hub reaches both, at their ports on its loopback.
        assert await asyncio.to_thread(get, second, "/") == "ok"
    finally:
        listener.close()
        await asyncio.gather(first.stop(), second.stop())


def host_address() -> str:
    """An address of this host other than loopback (where a neighbour's port is not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: the route's source address
        return str(probe.getsockname()[0])


async def test_a_notebook_opens_its_own_gpus_node_and_never_its_neighbours(
    users: list[User], homes: Path, image: str, stack: Stack
) -> None:
    driver = homes / "driver"
    # Under /dev, as the driver's are: a container's /tmp is mounted nodev.
    nodes = Path(tempfile.mkdtemp(dir="/dev", prefix="cs-test-"))
    for minor, uuid in enumerate(UUIDS):
        (driver / "gpus" / f"0000:1{minor}:00.0").mkdir(parents=True)
        (driver / "gpus" / f"0000:1{minor}:00.0" / "information").write_text(
            f"GPU UUID: \t GPU-{uuid}\nDevice Minor: \t {minor}\n"
        )
        os.mknod(nodes / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        (nodes / f"nvidia{minor}").chmod(0o666)  # as the driver makes them: open to all
    config = {"nvidia_proc_dir": str(driver), "device_dir": str(nodes)}
    taken: set[int] = set()
    holder, other = (notebook(u, homes, image, stack, taken, **config) for u in users)
    gpu = Device("r1-t4-1", "gpu", "NVIDIA T4", frozenset({"r1"}), "c1", "attached", uuid=UUIDS[0])
    holder.machine = ComposedMachine("m-1", "host-01", "r1", (gpu,), None, (), SHARE)
    try:
        await start(holder, other)
        # A neighbour's node planted where the notebook can reach it: the home.
        home = Path(holder._home())
        os.mknod(home / "planted", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
        (home / "planted").chmod(0o666)
        # Its own node passes the device rules (ENXIO: no driver behind it); no other does.
        assert await asyncio.to_thread(get, holder, f"/open{nodes}/nvidia0") == "ENXIO"
        assert await asyncio.to_thread(get, holder, f"/open{nodes}/nvidia1") == "ENOENT"
        assert await asyncio.to_thread(get, holder, f"/open{home}/planted") == "EPERM"
        assert await asyncio.to_thread(get, other, f"/open{nodes}/nvidia0") == "ENOENT"
        assert await asyncio.to_thread(get, other, "/open/dev/null") == "opened"
    finally:
        await asyncio.gather(holder.stop(), other.stop())
        shutil.rmtree(nodes)
