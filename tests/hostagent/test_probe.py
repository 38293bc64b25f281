"""The probe's attacks on a shared host, as a student's code in a notebook makes them,
against the real agent and its process runtime: a fork bomb stops at its notebook's
limit, a neighbour's GPU node stays shut, and nothing a notebook leaves in shared
memory outlives its user's last notebook on the host.

Starts processes, accounts and cgroups (root): run under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.hostagent.hosts import Host, start_request, started
from tests.support.builds import PLANTING_MANIFEST, running_threads_of
from tests.support.stacks import COMMON, make_lock

pytestmark = [pytest.mark.timeout(120), pytest.mark.host_processes]

GPU_A = "GPU-aaaa0000-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbb0000-0000-0000-0000-000000000002"

# Forks until the kernel says no (or a bound, so that a host without the limit is not
# brought down by its own test), says how far it got, and holds the children until its
# stdin closes: the neighbour's start and the agent's answer happen while they live.
FORK_BOMB = """
import os, sys
read, write = os.pipe()
made, said = 0, "none"
while made < 1000:
    try:
        pid = os.fork()
    except OSError as e:
        said = __import__("errno").errorcode[e.errno]
        break
    if pid == 0:
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    made += 1
print(made, said, flush=True)
sys.stdin.read()
"""

OPEN_NODES = """
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        print("opened")
    except OSError as e:
        print(errno.errorcode[e.errno])
"""


def test_a_fork_bomb_stops_at_its_notebooks_limit_and_the_host_still_forks(host: Host) -> None:
    host.reconfigure(pids_per_gib=32)  # a 1 GiB notebook: max(64, 32) processes and threads
    started(host, start_request(host.new_user(), "m1", memory_gib=1))
    bomb = host.in_notebook("m1", FORK_BOMB)
    try:
        assert bomb.stdout is not None
        made, said = bomb.stdout.readline().split()
        assert said == "EAGAIN"
        assert 0 < int(made) < 64  # its notebook's processes count too
        # While the bomb's children live: a neighbour starts, and the agent answers.
        neighbour = started(host, start_request(host.new_user(), "m2"))
        assert neighbour["pid"] > 0
        lines, status, _ = host.ask({"v": 1, "op": "list"})
        assert status == 0
        assert sorted(n["machine"] for n in lines[-1]["notebooks"]) == ["m1", "m2"]
    finally:
        bomb.communicate(timeout=60)
    for machine in ("m1", "m2"):
        host.ask({"v": 1, "op": "stop", "machine": machine})
    assert host.cgroups() == []


@pytest.fixture
def gpu_nodes(host: Host) -> Path:
    """Two GPUs on the host as the NVIDIA driver lists them (minors 0 and 1), with their
    device nodes open to every account as the driver makes them by default (0666); no
    driver answers behind them, so an open that the cgroup allows fails with ENXIO."""
    driver = host.root / "driver"
    for bus, uuid, minor in (("0000:18:00.0", GPU_A, 0), ("0000:19:00.0", GPU_B, 1)):
        (driver / "gpus" / bus).mkdir(parents=True)
        (driver / "gpus" / bus / "information").write_text(
            f"Model: \t\t NVIDIA T4\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n"
        )
    nodes = host.root / "dev"
    nodes.mkdir(mode=0o755)
    for minor in (0, 1):
        node = nodes / f"nvidia{minor}"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        node.chmod(0o666)
    listed = host.root / "gpus.txt"
    listed.write_text(f"{GPU_A}\n{GPU_B}\n")
    host.reconfigure(nvidia_proc_dir=str(driver), gpu_list_command=["/bin/cat", str(listed)])
    return nodes


def test_a_notebook_opens_its_own_gpus_node_and_never_its_neighbours(
    host: Host, gpu_nodes: Path
) -> None:
    started(host, start_request(host.new_user(), "m1", [GPU_A]))
    started(host, start_request(host.new_user(), "m2"))  # no GPU at all
    nodes = [str(gpu_nodes / "nvidia0"), str(gpu_nodes / "nvidia1")]
    # Its own node passes the cgroup (ENXIO: no driver behind it); the neighbour's does not.
    assert host.run_in_notebook("m1", OPEN_NODES, *nodes).split() == ["ENXIO", "EPERM"]
    assert host.run_in_notebook("m2", OPEN_NODES, *nodes).split() == ["EPERM", "EPERM"]
    # Whatever the notebook sets: unsetting CUDA_VISIBLE_DEVICES opens nothing more.
    assert host.run_in_notebook("m1", OPEN_NODES, "/dev/null").split() == ["opened"]
    for machine in ("m1", "m2"):
        host.ask({"v": 1, "op": "stop", "machine": machine})
    assert host.cgroups() == []


# Leaves 40 MiB in /dev/shm and a 16 MiB System V segment, written, as a DataLoader's
# workers or a crashed multiprocessing pool do; says the segment's id.
SHARED_MEMORY = """
import ctypes, os
with open(f"/dev/shm/cs-probe-{os.getpid()}", "wb") as file:
    file.write(b"x" * (40 << 20))
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget(0, 16 << 20, 0o1000 | 0o600)
address = libc.shmat(segment, None, 0)
ctypes.memset(address, 1, 16 << 20)
print(segment)
"""


def shared_memory_of(uid: int) -> tuple[int, list[int]]:
    """Bytes in /dev/shm files ``uid`` owns, and the System V segments it owns."""
    held = sum(p.lstat().st_size for p in Path("/dev/shm").iterdir() if p.lstat().st_uid == uid)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    header = lines[0].split()
    shmid, owner = header.index("shmid"), header.index("uid")
    segments = [int(f[shmid]) for line in lines[1:] if int((f := line.split())[owner]) == uid]
    return held, segments


def test_what_a_notebook_leaves_in_shared_memory_goes_with_its_users_last_notebook(
    host: Host,
) -> None:
    user, neighbour = host.new_user(), host.new_user()
    started(host, start_request(neighbour, "n1"))
    host.run_in_notebook("n1", SHARED_MEMORY)
    neighbours = pwd.getpwnam(neighbour).pw_uid
    for cycle in range(4):
        started(host, start_request(user, f"m{cycle}"))
        uid = pwd.getpwnam(user).pw_uid
        segment = int(host.run_in_notebook(f"m{cycle}", SHARED_MEMORY))
        assert shared_memory_of(uid) == (40 << 20, [segment])  # left behind by the cell
        host.ask({"v": 1, "op": "stop", "machine": f"m{cycle}"})
        assert shared_memory_of(uid) == (0, [])
        # The neighbour's notebook runs on: what it holds is its own, and stays.
        assert shared_memory_of(neighbours)[0] == 40 << 20
    host.ask({"v": 1, "op": "stop", "machine": "n1"})
    assert shared_memory_of(neighbours) == (0, [])


def tiny_stack(host: Host, stack_id: str, manifest: str | None = None) -> dict[str, Any]:
    wheels = host.root / f"wheels-{stack_id}"
    wheels.mkdir(mode=0o755)
    text = make_lock(wheels).read_text()
    common = {p.name: p.read_text() for p in COMMON.glob("*.py")}
    if manifest is not None:
        common["stack_manifest.py"] = manifest
    return {
        "id": stack_id,
        "label": stack_id,
        "lock_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "lock": text,
        "common": common,
    }


def test_a_build_that_leaves_a_zombie_led_process_plants_nothing_in_the_next(
    host: Host,
) -> None:
    stacks, builder = host.root / "stacks", host.new_user()
    host.reconfigure(stacks_dir=str(stacks), build_account=builder)
    planting = f"STACKS = {str(stacks)!r}\n" + PLANTING_MANIFEST
    started(host, start_request(host.new_user(), "m1", stack=tiny_stack(host, "a", planting)))
    uid = pwd.getpwnam(builder).pw_uid
    assert running_threads_of(uid) == []  # the planter's thread ended with the build

    started(host, start_request(host.new_user(), "m2", stack=tiny_stack(host, "b")))
    (second,) = stacks.glob("b-*/lib/python*/site-packages")
    assert not (second / "planted.pth").exists()
    for machine in ("m1", "m2"):
        host.ask({"v": 1, "op": "stop", "machine": machine})
