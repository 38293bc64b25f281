"""The real ``composespawner-host`` on a "host" of the test's own: notebooks started as
people's accounts, in their cgroups, with their GPUs; stopped, polled, watched; and
every request it must refuse refused, with nothing left behind.

Starts processes, accounts and cgroups (root): run under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from composespawner.hostagent.config import load_config
from composespawner.hostagent.notebooks import Notebooks
from composespawner.hostagent.starting import SINKS, ProcessStart
from composespawner.launchers.agent_protocol import Refused, StartNotebook, parse_request
from harness.hub import wait_for
from tests.hostagent.hosts import (
    USERS_GROUP,
    Host,
    environ_of,
    fake_hub_api,
    start_request,
    started,
    status_of,
    users_gid,
)
from tests.support.stacks import COMMON, make_lock

pytestmark = [pytest.mark.timeout(120), pytest.mark.host_processes]

GIB = 1 << 30


def answering(reply: dict[str, Any], path: str = "/") -> None:
    url = f"http://{reply['ip']}:{reply['port']}{path}"
    wait_for(lambda: requests.get(url, timeout=2).status_code == 200, 30, f"{url} to answer")


def gone(pid: int) -> bool:
    try:
        return status_of(pid)["State"].startswith("Z")  # a zombie is gone: it runs nothing
    except FileNotFoundError:
        return True


def refused(host: Host, request: dict[str, Any] | bytes, **environ: str) -> str:
    lines, status, stderr = host.ask(request, environ)
    assert status == 1, (lines, stderr)
    assert len(lines) == 1, lines
    assert lines[0]["ok"] is False, lines
    assert "refused " in stderr, stderr  # logged
    return str(lines[0]["refused"])


def test_a_notebook_runs_as_a_new_account_in_its_share_with_its_gpus(host: Host) -> None:
    user = host.new_user()
    gpus = ["GPU-aaaa0000-0000-0000-0000-000000000001"]
    reply = started(host, start_request(user, "m1", gpus, cores=1, memory_gib=1))
    assert reply["ip"] == host.listen
    answering(reply)
    account, pid = pwd.getpwnam(user), reply["pid"]

    status = status_of(pid)
    assert status["Uid"].split() == [str(account.pw_uid)] * 4
    assert status["Gid"].split() == [str(account.pw_gid)] * 4
    assert str(users_gid()) in status["Groups"].split()
    assert users_gid() < 1000  # groupadd --system
    assert status["NoNewPrivs"] == "1"
    env = environ_of(pid)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == gpus[0]
    assert env["JUPYTERHUB_SERVICE_URL"] == f"http://{host.listen}:{reply['port']}/user/{user}/"
    assert (env["HOME"], env["USER"]) == (account.pw_dir, user)

    home = Path(account.pw_dir)
    assert home.parent == host.home_root
    found = home.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (account.pw_uid, 0o700)
    manifest = Path(env["COMPOSE_RUN_MANIFEST"])
    assert manifest == home / ".composespawner" / "default.run.json"
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o444
    assert json.loads(manifest.read_text()) == {"machine": "m1"}
    log = host.state_dir / "m1.log"
    assert (log.stat().st_uid, stat.S_IMODE(log.stat().st_mode)) == (0, 0o600)

    cgroups = host.cgroups()
    assert cgroups, "no cgroup made"
    for cgroup in cgroups:
        assert str(pid) in (cgroup / "cgroup.procs").read_text().split()
        if (cgroup / "cpu.cfs_quota_us").exists():
            assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "100000"
        if (cgroup / "memory.limit_in_bytes").exists():
            assert int((cgroup / "memory.limit_in_bytes").read_text()) == GIB
    assert any((c / "memory.limit_in_bytes").exists() for c in cgroups)

    lines, _, _ = host.ask({"v": 1, "op": "poll", "machine": "m1"})
    assert lines == [{"ok": True, "running": True, "status": None}]
    lines, _, _ = host.ask({"v": 1, "op": "list"})
    assert [n["machine"] for n in lines[0]["notebooks"]] == ["m1"]
    assert lines[0]["notebooks"][0]["gpus"] == gpus

    lines, _, _ = host.ask({"v": 1, "op": "stop", "machine": "m1"})
    assert lines == [{"ok": True, "status": None}]
    assert gone(pid)
    assert host.cgroups() == []
    assert host.records() == []
    lines, _, _ = host.ask({"v": 1, "op": "poll", "machine": "m1"})
    assert lines == [{"ok": True, "running": False, "status": None}]


def test_a_killed_notebook_is_not_running_and_its_cgroup_is_gone(host: Host) -> None:
    reply = started(host, start_request(host.new_user(), "m1"))
    os.kill(reply["pid"], signal.SIGKILL)
    wait_for(lambda: gone(reply["pid"]), 10, "the notebook to die")
    lines, _, _ = host.ask({"v": 1, "op": "poll", "machine": "m1"})
    assert lines == [{"ok": True, "running": False, "status": None}]
    assert host.cgroups() == []
    assert host.records() == []


def test_a_watch_says_within_two_seconds_that_a_notebook_exited(host: Host) -> None:
    reply = started(host, start_request(host.new_user(), "m1"))
    watch = host.watch()
    try:
        assert watch.stdout is not None
        os.kill(reply["pid"], signal.SIGKILL)
        killed = time.monotonic()
        ready, _, _ = select.select([watch.stdout], [], [], 2.0)
        assert ready, "no exited line within 2 s"
        assert json.loads(watch.stdout.readline()) == {"exited": "m1", "status": None}
        assert time.monotonic() - killed < 2.0
        assert host.cgroups() == []
        watch.stdout.close()  # the hub closes the channel: the watch ends
        assert watch.wait(timeout=5) is not None
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"user": "../x"}, "cannot be an account's name"),
        ({"user": "a;id"}, "cannot be an account's name"),
        ({"user": "root"}, "system account (uid 0)"),
        ({"user": "daemon"}, "system account"),
        ({"user": "nobody"}, "system account (uid 65534)"),
        ({"op": "exec"}, "unknown op"),
        ({"home": "/root"}, "fields this agent does not know: home"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD is not the hub's to set"),
        ({"env": {"PATH": "/tmp"}}, "PATH is not the hub's to set"),
        ({"args": ["/bin/sh"]}, "is not an option"),
        ({"cores": 5, "memory_gib": 1}, "does not fit"),
        ({"cores": 1, "memory_gib": 5}, "does not fit"),
    ],
)
def test_a_request_it_must_not_do_is_refused_and_nothing_is_left(
    host: Host, change: dict[str, Any], says: str
) -> None:
    user = host.new_user()
    assert says in refused(host, {**start_request(user, "m1"), **change})
    assert host.existing_accounts() == []
    assert host.cgroups() == []
    assert host.records() == []


def test_another_command_through_the_hubs_key_is_refused(host: Host) -> None:
    poll = {"v": 1, "op": "poll", "machine": "m1"}
    assert "composespawner-host only" in refused(host, poll, SSH_ORIGINAL_COMMAND="id")
    lines, status, _ = host.ask(poll, {"SSH_ORIGINAL_COMMAND": "composespawner-host"})
    assert (status, lines) == (0, [{"ok": True, "running": False, "status": None}])


def test_a_refused_command_reaches_the_hosts_log_file(host: Host) -> None:
    log_file = host.root / "agent.log"
    host.reconfigure(log_file=str(log_file))
    poll = {"v": 1, "op": "poll", "machine": "m1"}
    assert "composespawner-host only" in refused(host, poll, SSH_ORIGINAL_COMMAND="cat /etc/shadow")
    assert "cat /etc/shadow" in log_file.read_text()


def test_gpus_the_host_lacks_and_accounts_it_may_not_make_are_refused(host: Host) -> None:
    listed = host.root / "gpus.txt"
    listed.write_text("GPU-aaaa0000-0000-0000-0000-000000000001\n")
    host.reconfigure(gpu_list_command=["/bin/cat", str(listed)], create_accounts=False)
    user = host.new_user()
    missing = "GPU-bbbb0000-0000-0000-0000-000000000002"
    assert f"not on this host: {missing}" in refused(host, start_request(user, "m1", [missing]))
    assert "this agent creates none" in refused(host, start_request(user, "m1"))
    assert host.existing_accounts() == []
    assert host.records() == []


def test_one_gpu_by_its_index_or_another_name_is_the_same_held_gpu(host: Host) -> None:
    # The probe's: on a host listing one GPU, ["GPU-aaaa…"] whole, ["0"] whole and ["00"]
    # as a quarter all started, as did ["0", "00"] in one request.
    gpu = "GPU-aaaa0000-0000-0000-0000-000000000001"
    listed = host.root / "gpus.txt"
    listed.write_text(gpu + "\n")
    host.reconfigure(gpu_list_command=["/bin/cat", str(listed)])
    first = started(host, start_request(host.new_user(), "m1", ["0"]))
    assert environ_of(first["pid"])["CUDA_VISIBLE_DEVICES"] == gpu  # the UUID, never the index
    other = host.new_user()
    for alias in ([gpu], [gpu.upper()], ["0"]):
        assert "held by another notebook" in refused(host, start_request(other, "m2", alias))
    assert "held by another notebook" in refused(
        host, start_request(other, "m2", ["0"], gpu_share=4)
    )
    assert "'00' is not allowed" in refused(host, start_request(other, "m2", ["00"]))
    host.ask({"v": 1, "op": "stop", "machine": "m1"})
    assert "twice" in refused(host, start_request(other, "m2", ["0", gpu]))
    assert host.records() == []
    assert host.cgroups() == []


def test_not_json_is_refused(host: Host) -> None:
    assert "not one JSON object" in refused(host, b"id; rm -rf /")


def test_a_request_nested_past_the_parser_is_refused_with_a_line(host: Host) -> None:
    # The probe's: 100,000 "[" made an uncaught RecursionError, no answer and no log line.
    assert "nests deeper" in refused(host, b"[" * 100_000)
    assert "nests deeper" in refused(host, b'{"v": 1, "op": "start", "env": ' + b"[" * 100_000)


def test_a_held_gpu_a_second_start_and_a_full_host_are_refused(host: Host) -> None:
    gpu = "GPU-aaaa0000-0000-0000-0000-000000000001"
    first = started(host, start_request(host.new_user(), "m1", [gpu], cores=2, memory_gib=2))
    other = host.new_user()
    assert "held by another notebook" in refused(host, start_request(other, "m2", [gpu]))
    assert "already has a notebook" in refused(host, start_request(other, "m1"))
    assert "does not fit" in refused(host, start_request(other, "m2", cores=3, memory_gib=1))
    assert other not in host.existing_accounts()
    assert host.records() == ["m1.json"]
    assert len(host.cgroups()) == len({c.parent for c in host.cgroups()})  # one per hierarchy
    assert not gone(first["pid"])
    host.ask({"v": 1, "op": "stop", "machine": "m1"})


def test_holders_of_halves_share_one_gpu_and_no_one_else_does(host: Host) -> None:
    gpu = ["GPU-aaaa0000-0000-0000-0000-000000000001"]
    halves = [
        started(host, start_request(host.new_user(), f"m{n}", gpu, gpu_share=2)) for n in (1, 2)
    ]
    for reply in halves:
        assert environ_of(reply["pid"])["CUDA_VISIBLE_DEVICES"] == gpu[0]
    other = host.new_user()
    assert "all 2 of its 1/2 shares are held" in refused(
        host, start_request(other, "m3", gpu, gpu_share=2)
    )
    assert "not in 1/4 shares" in refused(host, start_request(other, "m3", gpu, gpu_share=4))
    assert "held by another notebook" in refused(host, start_request(other, "m3", gpu))
    listed = host.ask({"v": 1, "op": "list"})[0][-1]["notebooks"]
    assert sorted((n["machine"], n["gpu_share"]) for n in listed) == [("m1", 2), ("m2", 2)]
    host.ask({"v": 1, "op": "stop", "machine": "m1"})
    third = started(host, start_request(other, "m3", gpu, gpu_share=2))  # m1's half is free
    for machine in ("m2", "m3"):
        host.ask({"v": 1, "op": "stop", "machine": machine})
    assert gone(third["pid"])


def test_an_existing_account_is_used_as_it_is(host: Host) -> None:
    campus = host.campus_account()
    before = pwd.getpwnam(campus.pw_name)
    # The notebook's Python is under /root here: a site lets its people in as the agent
    # lets the accounts it makes (the group's ACL); see hostagent/accounts.py.
    subprocess.run(["groupadd", "--system", "-f", USERS_GROUP], check=True, timeout=30)
    subprocess.run(["usermod", "-aG", USERS_GROUP, campus.pw_name], check=True, timeout=30)
    reply = started(host, start_request(campus.pw_name, "m1"))
    answering(reply)
    assert pwd.getpwnam(campus.pw_name) == before
    assert status_of(reply["pid"])["Uid"].split()[0] == str(campus.pw_uid)
    assert not (host.home_root / campus.pw_name).exists()
    assert environ_of(reply["pid"])["HOME"] == campus.pw_dir


def test_an_existing_account_in_a_group_worth_root_is_refused(host: Host) -> None:
    admin = host.campus_account()
    subprocess.run(["usermod", "-aG", "adm", admin.pw_name], check=True, timeout=30)
    assert "in the groups adm" in refused(host, start_request(admin.pw_name, "m1"))
    assert host.records() == []
    assert host.cgroups() == []


def test_one_users_notebook_cannot_read_or_signal_anothers(host: Host) -> None:
    ada, bob = host.new_user(), host.new_user()
    first = started(host, start_request(ada, "m1"))
    second = started(host, start_request(bob, "m2"))
    answering(first)
    answering(second)
    secret = Path(pwd.getpwnam(ada).pw_dir) / "secret.txt"
    secret.write_text("ada's")
    attempt = (
        "import os, sys\n"
        "for what, act in (('read', lambda: open(sys.argv[1]).read()),"
        " ('list', lambda: os.listdir(os.path.dirname(sys.argv[1]))),"
        " ('signal', lambda: os.kill(int(sys.argv[2]), 15))):\n"
        "    try:\n"
        "        act()\n"
        "        print(what, 'allowed')\n"
        "    except PermissionError:\n"
        "        print(what, 'denied')\n"
    )
    account = pwd.getpwnam(bob)
    done = subprocess.run(
        [sys.executable, "-I", "-c", attempt, str(secret), str(first["pid"])],
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=os.getgrouplist(bob, account.pw_gid),
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert done.stdout.split("\n")[:3] == ["read denied", "list denied", "signal denied"], done
    assert not gone(first["pid"])


def test_a_real_jupyterhub_singleuser_starts_through_the_agent(host: Host) -> None:
    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
    host.reconfigure(notebook_command=[str(singleuser)])
    user = host.new_user()
    with fake_hub_api() as api_url:
        request = start_request(user, "m1", cores=1, memory_gib=2)
        request["env"].update(
            JUPYTERHUB_API_URL=api_url,
            JUPYTERHUB_BASE_URL="/",
            JUPYTERHUB_SERVICE_PREFIX=f"/user/{user}/",
            JUPYTERHUB_USER=user,
            JUPYTERHUB_CLIENT_ID=f"jupyterhub-user-{user}",
            JUPYTERHUB_OAUTH_CALLBACK_URL=f"/user/{user}/oauth_callback",
        )
        reply = started(host, request)
        answering(reply, f"/user/{user}/api")
        assert status_of(reply["pid"])["Uid"].split()[0] == str(pwd.getpwnam(user).pw_uid)
        lines, _, _ = host.ask({"v": 1, "op": "stop", "machine": "m1"})
        assert lines == [{"ok": True, "status": None}]
    assert gone(reply["pid"])
    assert host.cgroups() == []


def test_a_stack_is_built_as_the_build_account_then_made_roots(host: Host) -> None:
    stacks, builder = host.root / "stacks", host.new_user()
    host.reconfigure(stacks_dir=str(stacks), build_account=builder)
    (host.root / "wheels").mkdir(mode=0o755)
    lock = make_lock(host.root / "wheels")
    common = {p.name: p.read_text() for p in COMMON.glob("*.py")}
    text = lock.read_text()
    stack = {
        "id": "tiny",
        "label": "Tiny 1.0",
        "lock_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "lock": text,
        "common": common,
    }
    lines, status, stderr = host.ask(start_request(host.new_user(), "m1", stack=stack))
    assert status == 0, (lines, stderr)
    assert any("building the Tiny 1.0 stack" in line.get("progress", "") for line in lines)
    reply = lines[-1]
    env = environ_of(reply["pid"])
    environment = Path(env["VIRTUAL_ENV"])
    assert environment.parent == stacks
    assert env["PATH"].startswith(f"{environment}/bin:")
    assert Path(env["COMPOSE_STACK_MANIFEST"]).is_file()
    assert environment.lstat().st_uid == 0  # root's once built: no later build changes it
    assert all(p.lstat().st_uid == 0 for p in environment.rglob("*"))
    found = stacks.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o1775)
    assert found.st_gid == pwd.getpwnam(builder).pw_gid
    assert pwd.getpwnam(builder).pw_uid < 1000  # a system account
    assert host.processes_of(builder) == []

    lines, status, _ = host.ask(start_request(host.new_user(), "m2", stack=stack))
    assert status == 0
    assert not any("progress" in line for line in lines)  # found ready
    assert environ_of(lines[-1]["pid"])["VIRTUAL_ENV"] == str(environment)


def test_a_start_that_fails_on_the_host_undoes_what_it_began(host: Host) -> None:
    host.reconfigure(notebook_command=[str(host.root / "no-such-notebook")])
    lines, status, stderr = host.ask(start_request(host.new_user(), "m1"))
    assert status == 1
    assert lines[-1]["ok"] is False
    assert "could not be started" in lines[-1]["error"]
    assert "failed op=start" in stderr
    assert "not-a-real-token" not in stderr  # the env is never logged
    assert host.cgroups() == []
    assert host.records() == []


def test_two_starts_racing_for_one_gpu_one_wins(host: Host) -> None:
    gpu = ["GPU-aaaa0000-0000-0000-0000-000000000001"]
    requests_ = [start_request(host.new_user(), f"m{n}", gpu) for n in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(host.ask, requests_))
    assert sorted(lines[-1]["ok"] for lines, _, _ in results) == [False, True]
    assert len(host.records()) == 1


def test_three_starts_racing_for_two_halves_of_one_gpu_two_win(host: Host) -> None:
    gpu = ["GPU-aaaa0000-0000-0000-0000-000000000001"]
    requests_ = [start_request(host.new_user(), f"m{n}", gpu, gpu_share=2) for n in (1, 2, 3)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(host.ask, requests_))
    assert sorted(lines[-1]["ok"] for lines, _, _ in results) == [False, True, True]
    assert len(host.records()) == 2
    for lines, _, _ in results:
        if lines[-1]["ok"] is False:
            assert "all 2 of its 1/2 shares are held" in lines[-1]["refused"]
    for record in host.records():
        host.ask({"v": 1, "op": "stop", "machine": record.removesuffix(".json")})


def test_a_start_the_hub_gave_up_on_is_undone(host: Host) -> None:
    agent = subprocess.Popen(
        host.command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": os.defpath},
    )
    assert agent.stdin is not None
    assert agent.stdout is not None
    agent.stdout.close()  # the hub's channel is gone before the start is done
    _, stderr = agent.communicate(json.dumps(start_request(host.new_user(), "m1")).encode(), 60)
    assert agent.returncode == 1
    assert b"closed the channel before the start was done" in stderr
    assert host.records() == []
    assert host.cgroups() == []


# The agent leaves its notebook running when its request ends (it exits; here, in the
# test's process, the Popen goes while the notebook runs): reaped below.
@pytest.mark.filterwarnings("ignore:subprocess [0-9]+ is still running:ResourceWarning")
def test_a_start_holds_its_room_from_its_reservation_and_a_stop_waits_for_it(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is held only to reserve: while one start's notebook is being started
    (outside the lock), its reservation already holds the host's room, and a stop of
    it waits for the notebook to run, then stops it."""
    notebooks = Notebooks(load_config(host.config, {}))
    reserved, go_on = threading.Event(), threading.Event()
    real_popen = ProcessStart.popen

    def held_popen(self: ProcessStart, *args: Any) -> Any:
        reserved.set()
        assert go_on.wait(60)
        return real_popen(self, *args)

    monkeypatch.setattr(ProcessStart, "popen", held_popen)

    def asked(user: str, machine: str, cores: int) -> StartNotebook:
        request = parse_request(json.dumps(start_request(user, machine, cores=cores)).encode())
        assert isinstance(request, StartNotebook)
        return request

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(notebooks.start, asked(host.new_user(), "m1", 4), lambda _: None)
        assert reserved.wait(60)
        reservation = json.loads((host.state_dir / "m1.json").read_text())
        assert (reservation["starting"], reservation["pid"]) == (True, os.getpid())
        with pytest.raises(Refused, match="cores"):  # the whole host is reserved
            notebooks.start(asked(host.new_user(), "m2", 1), lambda _: None)
        stopping = pool.submit(notebooks.stop, "m1")
        go_on.set()
        # The start ran its notebook (a stop that had ended the reservation would have
        # failed it), and the stop, waiting for it, stopped that notebook.
        answer = first.result(timeout=60)
        assert stopping.result(timeout=60) == {"status": None}
    assert answer["pid"] != os.getpid()
    assert os.waitpid(answer["pid"], 0)[0] == answer["pid"]  # ended, by the stop
    while SINKS:
        os.waitpid(SINKS.pop(), 0)
    assert host.records() == []
    assert host.cgroups() == []
