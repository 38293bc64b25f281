"""compose-ssh end to end: the demo hub runs notebooks on its compute hosts through SSH.

Each of the demo fabric's hosts is a real OpenSSH sshd on 127.0.1.N with the agent
as the hub key's forced command (harness/sshhosts.py); the hub is the demo's, with
``c.JupyterHub.spawner_class = "compose-ssh"``. A notebook runs as its user's own
account on its host's address, with its machine's GPUs and share only, behind the
hub's proxy; every end gives its devices back. Run under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, alive, process_env, running_hub, wait_for
from harness.sshhosts import SSHHost, SSHHosts, ssh_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ONE_T4 = {"gpu_model": "t4", "gpu_count": 1}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    with ssh_hosts(tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def hub(hosts: SSHHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub"), hosts.hub_config()) as hub:
        yield hub


@pytest.fixture(autouse=True)
def nothing_left(hub: Hub, hosts: SSHHosts) -> Iterator[None]:
    """Every test starts and ends with the fabric free and no notebook on any host."""
    assert hub.composed_hosts() == {}
    yield
    for user in ("student1", "student2", "researcher1", "teacher1"):
        for name in hub.user(user).get("servers", {}):
            hub.stop(user, name)
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")
    assert {h: hosts.records(h) for h in hosts.hosts} == {h: [] for h in hosts.hosts}


def started(hub: Hub, hosts: SSHHosts, user: str) -> tuple[SSHHost, dict[str, Any], float]:
    """Spawn ``user``'s one-T4 server; its host, its agent's record, and seconds to ready."""
    began = time.monotonic()
    response = hub.spawn(user, ONE_T4)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=120)
    took = time.monotonic() - began
    found = hosts.notebook(user)
    assert found is not None, f"no notebook of {user} on any host"
    return found[0], found[1], took


def uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]


def cgroup_value(pid: int, controller: str, name: str) -> int | None:
    """A setting of the v1 ``controller`` cgroup ``pid`` is in (this machine's hierarchy)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return int(Path("/sys/fs/cgroup", controller, path.lstrip("/"), name).read_text())
    return None


def test_a_notebook_runs_as_its_user_on_its_host_and_stop_gives_all_back(
    hub: Hub, hosts: SSHHosts
) -> None:
    host, record, took = started(hub, hosts, "student1")
    other_host, other, _ = started(hub, hosts, "student2")
    pid = record["pid"]
    account = pwd.getpwnam("student1")

    # The user's own account, in a home only it may enter, under the host's homes.
    assert uid_of(pid) == account.pw_uid == record["uid"]
    assert Path(account.pw_dir).parent == hosts.home_root
    assert Path(account.pw_dir).stat().st_mode & 0o777 == 0o700
    assert Path(f"/proc/{pid}/cwd").resolve() == Path(account.pw_dir).resolve()
    # Only its machine's GPUs, its host, its share.
    env = process_env(pid)
    gpus = json.loads(env["COMPOSE_GPUS"])
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{gpus[0]['uuid']}"
    assert record["gpus"] == [f"GPU-{gpus[0]['uuid']}"]
    assert env["COMPOSE_HOST"] == host.host_id == hub.server_host("student1")
    assert env["HOME"] == account.pw_dir
    assert not any(name.startswith("LD_") for name in env)
    assert (
        cgroup_value(pid, "memory", "memory.limit_in_bytes")
        == int(env["COMPOSE_MEMORY_GIB"]) * 2**30
    )
    quota = cgroup_value(pid, "cpu", "cpu.cfs_quota_us")
    assert quota == int(env["COMPOSE_CORES"]) * cgroup_value(pid, "cpu", "cpu.cfs_period_us")
    assert record["memory_gib"] == int(env["COMPOSE_MEMORY_GIB"])
    # It listens on its host's address, where the hub's proxy reaches it.
    assert env["JUPYTERHUB_SERVICE_URL"].startswith(f"http://{host.address}:{record['port']}/")
    with socket.create_connection((host.address, record["port"]), timeout=5):
        pass
    lab = hub.login("student1").get(f"{hub.url}/user/student1/lab", timeout=30)
    assert lab.status_code == 200, lab.text[-2000:]
    assert "JupyterLab" in lab.text
    attached = hub.attached(host.host_id)
    assert set(env["COMPOSE_DEVICE_IDS"].split(",")) <= set(attached)
    # The other user's notebook is not this one's to read or signal: the OS says no.
    assert _as(account, ["kill", "-0", str(other["pid"])]).returncode != 0
    other_home = pwd.getpwnam("student2").pw_dir
    denied = _as(account, ["ls", other_home])
    assert "Permission denied" in denied.stderr

    machine = env["COMPOSE_MACHINE_ID"]
    hub.stop("student1")
    assert not alive(pid)
    hub.wait_released(machine)
    assert not set(env["COMPOSE_DEVICE_IDS"].split(",")) & set(hub.attached(host.host_id))
    assert hosts.notebook("student1") is None
    # Each host's agent's server took every channel: none ran its request alone.
    for used in (host, other_host):
        assert "started student" in hosts.agent_log(used.host_id)
        assert "no agent's server" not in hosts.agent_log(used.host_id)
    # A channel per start, a connection per host (the hub's log says so).
    log = hub.log_path.read_text()
    trips = re.findall(r"SSH: (\d+) channel\(s\) and (\d+) new connection\(s\) this start", log)
    assert [channels for channels, _ in trips] == ["1", "1"], trips
    # A connection made by each host's first start, reused by the next.
    assert sum(int(made) for _, made in trips) == len({host.host_id, other_host.host_id})
    metrics = hub.api.get(f"{hub.url}/hub/metrics", timeout=30).text
    assert re.search(r"^composespawner_ssh_connections_total [1-9]", metrics, re.MULTILINE)
    assert re.search(r"^composespawner_ssh_channels_total [1-9]", metrics, re.MULTILINE)
    print(f"student1's start took {took:.2f} s; other host {other_host.host_id}")


_SETPRIV = ("setpriv", "--init-groups")


def _as(account: pwd.struct_passwd, command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_SETPRIV, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", *command],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_a_server_from_the_form_runs_on_its_host_as_its_user(hub: Hub, hosts: SSHHosts) -> None:
    session = hub.login("teacher1")
    assert "NVIDIA T4 16GB" in session.get(f"{hub.url}/hub/spawn", timeout=30).text
    form = {"gpu_model": "t4", "gpu_count": "1", "_xsrf": session.cookies.get("_xsrf")}
    page = session.post(f"{hub.url}/hub/spawn", data=form, timeout=60)
    assert page.status_code == 200, page.text[-2000:]
    hub.wait_ready("teacher1", timeout=120)
    found = hosts.notebook("teacher1")
    assert found is not None
    host, record = found
    assert uid_of(record["pid"]) == pwd.getpwnam("teacher1").pw_uid
    assert process_env(record["pid"])["COMPOSE_HOST"] == host.host_id
    hub.stop("teacher1")
    assert not alive(record["pid"])


def test_a_killed_notebook_is_released_within_5_s(hub: Hub, hosts: SSHHosts) -> None:
    host, record, _ = started(hub, hosts, "researcher1")
    machine = process_env(record["pid"])["COMPOSE_MACHINE_ID"]

    os.kill(record["pid"], signal.SIGKILL)
    killed = time.monotonic()
    hub.wait_released(machine, timeout=5)
    print(f"released {time.monotonic() - killed:.2f} s after the kill")
    hub.wait_gone("researcher1", timeout=30)  # and the hub's next poll ends the server
    assert hub.attached(host.host_id) == []


def test_while_a_hosts_agents_server_is_down_its_channels_run_their_requests(
    hub: Hub, hosts: SSHHosts
) -> None:
    for host_id in hosts.hosts:  # whichever host placement chooses
        hosts.stop_server(host_id)
    try:
        host, record, _ = started(hub, hosts, "researcher1")
        assert uid_of(record["pid"]) == pwd.getpwnam("researcher1").pw_uid
        assert "no agent's server took the channel" in hosts.agent_log(host.host_id)
    finally:
        for host_id in hosts.hosts:
            hosts.start_server(host_id)
    hub.stop("researcher1")  # handed to the server again
    assert not alive(record["pid"])
    assert hosts.notebook("researcher1") is None


def test_hosts_that_cannot_be_reached_fail_the_start_clearly_and_hold_nothing(
    hub: Hub, hosts: SSHHosts, ledger: Ledger
) -> None:
    # Whichever host placement chooses is down (and the hub's connections to it broken).
    for host_id in hosts.hosts:
        hosts.stop(host_id)
    try:
        response = hub.spawn("student2", ONE_T4)
    finally:
        for host_id in hosts.hosts:
            hosts.start(host_id)
    # The start fails fast (the connection is refused), so the spawn's answer says it.
    assert response.status_code == 503, response.text
    message = response.json()["message"]
    assert "the hub could not reach the host" in message
    assert "devices were given back" in message
    hub.wait_gone("student2")
    wait_for(lambda: ledger.live_machines("student2") == [], 30, "student2's machine released")
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")
    assert "Nothing accepts SSH there" in hub.log_path.read_text()


def test_a_notebook_the_hub_could_not_stop_is_stopped_once_its_host_answers(
    hub: Hub, hosts: SSHHosts
) -> None:
    host, record, _ = started(hub, hosts, "student2")
    machine = process_env(record["pid"])["COMPOSE_MACHINE_ID"]
    hosts.stop(host.host_id)  # its sshd: the notebook lives on, out of the hub's reach
    try:
        hub.stop("student2")  # the stop cannot reach it; the machine is released anyway
        hub.wait_released(machine)
        assert alive(record["pid"])
    finally:
        hosts.start(host.host_id)
    back = time.monotonic()
    # The host's watch, retrying, is made again, and the hub stops what it no longer runs.
    wait_for(lambda: hosts.notebook("student2") is None, 40, "the orphan stopped")
    print(f"the orphan was stopped {time.monotonic() - back:.2f} s after its host's sshd")
    assert not alive(record["pid"])
    # The hub says so once the agent's answer is in: after the record went on the host.
    said = f"stopped notebook {machine} on"
    assert wait_for(lambda: said in hub.log_path.read_text() or None, 30, "the hub's log line")
