"""The agent's container runtime, and the probe's attacks on it, with real podman.

The host's agent (``runtime = "containers"``) runs each notebook with ``podman run`` from
the PyTorch CPU image that ``make images`` built, by digest. The notebook is the
stand-in (``hungry_notebook.py``, in the image's Python), which does what code in a
student's notebook could; it is reached as the hub's proxy reaches a notebook, at its
port on the host's address.

Needs root, podman and the built image (``make images``); run under
``flock /tmp/heavy.lock``: it holds a GiB of memory for a moment.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import images
from tests.hostagent.hosts import Host, fake_hub_api, start_request, started

pytestmark = [pytest.mark.timeout(240), pytest.mark.containers, pytest.mark.host_processes]

HUNGRY = (Path(__file__).parents[1] / "launchers" / "hungry_notebook.py").read_text()
GPU_A = "GPU-aaaa0000-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbb0000-0000-0000-0000-000000000002"


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The PyTorch CPU image by digest, with the registry it is pulled from running."""
    if os.geteuid() != 0:
        pytest.fail("the agent's container runtime runs rootful podman: run the tests as root")
    built = images.built().get("pytorch-cpu")
    assert built is not None, "no pytorch-cpu image: run make images"
    with images.registry():
        yield built.by_digest


@pytest.fixture
def contained(host: Host, image: str) -> Iterator[Host]:
    """``host`` with the containers runtime: podman configured as make images configures
    it (through the command: the agent's own environment is sshd's, empty)."""
    host.reconfigure(**_containers_config(host))
    yield host
    for record in host.state_dir.glob("*.json"):  # a failed test's notebooks
        host.ask({"v": 1, "op": "stop", "machine": record.stem})


def start(host: Host, image: str, machine: str, user: str | None = None, **more: Any) -> str:
    """Start ``machine``'s notebook in a container of ``image``; its account, once it
    answers at its port."""
    user = user or host.new_user()
    answer = started(host, start_request(user, machine, image=image, **more))
    assert answer["ip"] == host.listen
    deadline = time.monotonic() + 60
    while True:
        try:
            assert get(host, machine, "/", timeout=5) == "ok"
            return user
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
            assert machine in listed(host), "the notebook's container ended"
            assert time.monotonic() < deadline, "the notebook never listened"
            time.sleep(0.05)  # polling the port: the condition itself


def record(host: Host, machine: str) -> dict[str, Any]:
    return dict(json.loads((host.state_dir / f"{machine}.json").read_text()))


def get(host: Host, machine: str, path: str, timeout: float = 60) -> str:
    """What the notebook answers to ``GET path``, at its port on the host's address."""
    port = record(host, machine)["port"]
    connection = http.client.HTTPConnection(host.listen, port, timeout=timeout)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def listed(host: Host) -> list[str]:
    lines, status, _ = host.ask({"v": 1, "op": "list"})
    assert status == 0
    return sorted(n["machine"] for n in lines[-1]["notebooks"])


def stop(host: Host, *machines: str) -> None:
    for machine in machines:
        lines, status, stderr = host.ask({"v": 1, "op": "stop", "machine": machine})
        assert (status, lines[-1]["ok"]) == (0, True), stderr


def inspect(container: str) -> dict[str, Any]:
    said = images.podman("inspect", container, timeout=60)
    return dict(json.loads(said)[0])


def test_a_notebook_runs_from_the_image_as_its_account_held_to_its_share(
    contained: Host, image: str
) -> None:
    user = start(contained, image, "m1", cores=1, memory_gib=1)
    held = record(contained, "m1")
    assert held["container"]
    assert held["cgroups"] == []
    config = inspect(held["container"])
    account = pwd.getpwnam(user)
    assert config["Config"]["User"] == f"{account.pw_uid}:{account.pw_gid}"
    assert config["ImageName"] == image  # by digest, as the hub named it
    assert config["HostConfig"]["Memory"] == config["HostConfig"]["MemorySwap"] == 1 << 30
    assert config["HostConfig"]["NanoCpus"] == 1_000_000_000
    assert config["HostConfig"]["PidsLimit"] > 0
    assert config["HostConfig"]["CapDrop"]
    assert not config["HostConfig"]["CapAdd"]
    # Its token reached it by the env file, never on podman's command line.
    assert "not-a-real-token" not in " ".join(config["Args"] + [config["Path"]])
    environment = dict(v.partition("=")[::2] for v in config["Config"]["Env"])
    assert environment["JUPYTERHUB_API_TOKEN"] == "not-a-real-token"
    assert environment["HOME"] == account.pw_dir
    assert environment["COMPOSE_STACK_IMAGE"] == image
    assert listed(contained) == ["m1"]
    stop(contained, "m1")
    assert listed(contained) == []
    assert images.notebook_containers() == []
    assert not (contained.state_dir / "m1.env").exists()
    assert (contained.state_dir / "m1.log").exists()  # why did it exit? kept a while


def test_a_start_without_an_image_or_with_a_bad_one_is_refused(contained: Host, image: str) -> None:
    for request, said in (
        (start_request(contained.new_user(), "m1"), "names no image"),
        (start_request(contained.new_user(), "m1", image="-v/:/host@sha256:" + "0" * 64), "image"),
        (start_request(contained.new_user(), "m1", image="repo:latest"), "image"),
    ):
        lines, _status, _ = contained.ask(request)
        assert lines[-1]["ok"] is False
        assert said in lines[-1]["refused"]
    assert contained.records() == []
    assert images.notebook_containers() == []


def test_a_fork_bomb_stops_at_its_containers_limit_and_the_host_still_forks(
    contained: Host, image: str
) -> None:
    contained.reconfigure(**_containers_config(contained), pids_per_gib=32)  # 1 GiB: 64 at most
    start(contained, image, "m1")
    start(contained, image, "m2")
    made, said = get(contained, "m1", "/forks").split()
    assert said == "EAGAIN"
    assert 0 < int(made) < 64
    assert listed(contained) == ["m1", "m2"]  # the agent answers while the bomb holds
    assert get(contained, "m2", "/") == "ok"
    assert subprocess.run(["true"], timeout=10).returncode == 0
    stop(contained, "m1", "m2")


def test_the_memory_kill_hits_one_notebook_alone(contained: Host, image: str) -> None:
    start(contained, image, "m1")
    start(contained, image, "m2")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        get(contained, "m1", "/allocate/2048")
    deadline = time.monotonic() + 60
    while "m1" in listed(contained):  # the agent sees podman's process end with it
        assert time.monotonic() < deadline, "the killed notebook is still listed"
        time.sleep(0.2)
    assert get(contained, "m2", "/") == "ok"
    assert images.notebook_containers() == [record(contained, "m2")["container"]]
    stop(contained, "m2")


def test_tmp_and_shared_memory_are_each_notebooks_own_and_go_with_it(
    contained: Host, image: str
) -> None:
    user = contained.new_user()
    for cycle in range(4):
        start(contained, image, "m1", user=user)
        start(contained, image, "m2")
        # Each /tmp holds only the mount point of the homes' folder (under /tmp here).
        folder = contained.root.name
        assert get(contained, "m1", f"/tmp/secret-{cycle}") == f"{folder} secret-{cycle}"
        assert get(contained, "m2", "/tmp/") == folder
        assert get(contained, "m1", "/shm/8") == "left 8 MiB"
        uid = pwd.getpwnam(user).pw_uid
        assert shared_memory_on_host(uid) == (0, 0)  # in the container's own
        stop(contained, "m1", "m2")
        assert shared_memory_on_host(uid) == (0, 0)
    assert images.notebook_containers() == []


def shared_memory_on_host(uid: int) -> tuple[int, int]:
    held = sum(p.lstat().st_size for p in Path("/dev/shm").iterdir() if p.lstat().st_uid == uid)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    owner = lines[0].split().index("uid")
    return held, sum(1 for line in lines[1:] if int(line.split()[owner]) == uid)


def test_a_notebook_reaches_its_hub_but_not_its_neighbour_nor_the_hosts_loopback(
    contained: Host, image: str
) -> None:
    with fake_hub_api() as api, socket.create_server(("127.0.0.1", 0)) as service:
        hub_port = int(api.rsplit(":", 1)[1].split("/")[0])
        env = {
            "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:0/user/x/",
            "JUPYTERHUB_API_TOKEN": "not-a-real-token",
            "JUPYTERHUB_API_URL": api,
        }
        start(contained, image, "m1", env=env)
        start(contained, image, "m2")
        neighbour = record(contained, "m2")["port"]
        for address, port in (
            (contained.listen, neighbour),
            ("127.0.0.1", service.getsockname()[1]),
            ("10.0.2.2", service.getsockname()[1]),
        ):
            assert get(contained, "m1", f"/connect/{address}/{port}") != "connected"
        # The hub's API, at the address its environment names, through the host's relay.
        assert get(contained, "m1", f"/connect/127.0.0.1/{hub_port}") == "connected"
        stop(contained, "m1", "m2")
    assert not list((contained.root / "relay").iterdir())


def test_a_notebook_opens_its_own_gpus_node_and_never_its_neighbours(
    contained: Host, image: str
) -> None:
    driver = contained.root / "driver"
    nodes = Path(tempfile.mkdtemp(dir="/dev", prefix="cs-test-"))  # /tmp is nodev in it
    try:
        for minor, uuid in enumerate((GPU_A, GPU_B)):
            (driver / "gpus" / f"0000:1{minor}:00.0").mkdir(parents=True)
            (driver / "gpus" / f"0000:1{minor}:00.0" / "information").write_text(
                f"GPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n"
            )
            os.mknod(nodes / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
            (nodes / f"nvidia{minor}").chmod(0o666)  # as the driver makes them: open to all
        listed_gpus = contained.root / "gpus.txt"
        listed_gpus.write_text(f"{GPU_A}\n{GPU_B}\n")
        contained.reconfigure(
            **_containers_config(contained),
            nvidia_proc_dir=str(driver),
            device_dir=str(nodes),
            gpu_list_command=["/bin/cat", str(listed_gpus)],
        )
        user = start(contained, image, "m1", gpus=["0"])  # an index: resolved to GPU_A
        start(contained, image, "m2")
        home = Path(pwd.getpwnam(user).pw_dir)
        os.mknod(home / "planted", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
        (home / "planted").chmod(0o666)
        assert get(contained, "m1", f"/open{nodes}/nvidia0") == "ENXIO"
        assert get(contained, "m1", f"/open{nodes}/nvidia1") == "ENOENT"
        assert get(contained, "m1", f"/open{home}/planted") == "EPERM"
        assert get(contained, "m2", f"/open{nodes}/nvidia0") == "ENOENT"
        stop(contained, "m1", "m2")
    finally:
        for node in nodes.iterdir():
            node.unlink()
        nodes.rmdir()


def test_a_container_whose_podman_was_killed_is_removed_when_its_record_ends(
    contained: Host, image: str
) -> None:
    start(contained, image, "m1")
    held = record(contained, "m1")
    os.kill(held["pid"], signal.SIGKILL)  # podman's process, as an outage's OOM killer might
    deadline = time.monotonic() + 30
    while "m1" in listed(contained):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert images.notebook_containers() == []


def _containers_config(host: Host) -> dict[str, Any]:
    """The containers runtime's keys of ``contained`` (reconfigure writes every key)."""
    settings = [f"{k}={v}" for k, v in images.podman_env().items() if k.startswith("CONTAINERS")]
    return {
        "runtime": "containers",
        "podman_command": ["/usr/bin/env", *settings, "/usr/bin/podman"],
        "relay_dir": str(host.root / "relay"),
        "notebook_command": ["/usr/bin/env", "python", "-I", "-c", HUNGRY],
    }


def test_an_image_pulled_once_is_not_looked_for_again(contained: Host, image: str) -> None:
    calls = contained.root / "podman-calls"
    config = _containers_config(contained)
    config["podman_command"] = [
        *("/bin/sh", "-c", f'printf "%s\\n" "$*" >> {calls}; exec "$@"', "podman-logged"),
        *config["podman_command"],
    ]
    contained.reconfigure(**config)
    start(contained, image, "m1")
    first = calls.read_text().splitlines()  # each: the configured command, then podman's
    assert any(f"/usr/bin/podman image exists {image}" in line for line in first), first
    stop(contained, "m1")

    calls.write_text("")
    start(contained, image, "m2")
    second = calls.read_text().splitlines()
    asked = ("/usr/bin/podman image exists", "/usr/bin/podman pull")
    assert not any(call in line for line in second for call in asked), second
    (run,) = [line for line in second if "/usr/bin/podman run " in line]
    assert " --pull missing " in run  # should it have gone since, the run fetches it
    stop(contained, "m2")
