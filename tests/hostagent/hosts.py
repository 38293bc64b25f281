"""A compute "host" for the agent's tests: its own config, state folder, cgroup parent,
homes and address, and the real ``composespawner-host`` run as the forced command would.

Needs root (the agent makes accounts and cgroups, and changes to the account).
Every account a test names through :meth:`Host.new_user` or makes with
:meth:`Host.campus_account` is removed at the end (``userdel -r``), with every
process running as it, and the host's cgroups.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from composespawner.hostagent import handoff
from composespawner.launchers.accounts import becoming
from composespawner.launchers.cgroups import (
    CgroupError,
    find_hierarchies,
    join_then,
    remove_cgroups,
)
from composespawner.launchers.ipc import remove_ipc_of
from harness.paths import ROOT

AGENT = Path(sys.executable).with_name("composespawner-host")
# The benchmarks' notebook stand-in: it answers HTTP where JUPYTERHUB_SERVICE_URL says.
STANDIN = ROOT / "benchmarks" / "standin_notebook.py"
USERS_GROUP = "composespawner-users"
AGENT_TIMEOUT = 60.0  # seconds for one request (a start makes an account: a useradd)


@dataclass
class Host:
    root: Path
    config: Path
    state_dir: Path
    home_root: Path
    listen: str
    cgroup_parent: str
    accounts: list[str] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        """Where the forced command looks for the host's agent's server: none listens
        there unless a test starts one (tests/hostagent/test_server.py), so each request
        runs in the forced command's own process. Short: a Unix socket's path holds 107
        bytes, and pytest's folders are long."""
        return self.root / "agent.sock"

    @property
    def command(self) -> list[str]:
        """The forced command, as the host role writes it in authorized_keys (by path and
        without site; ``AGENT``, the console script, runs the same)."""
        forced = [sys.executable, "-IS", handoff.__file__]
        return [*forced, "--config", str(self.config), "--socket", str(self.socket)]

    def reconfigure(self, **more: Any) -> None:
        """The same host, with ``more`` config keys."""
        write_config(self.config.parent, self.listen, self.cgroup_parent, self.home_root, **more)

    def new_user(self) -> str:
        """A fresh account name, removed (if the agent made it) when the test ends."""
        name = f"cshost-{secrets.token_hex(3)}"
        self.accounts.append(name)
        return name

    def campus_account(self) -> pwd.struct_passwd:
        """An account that was there before the agent (as a campus one is), home elsewhere."""
        name = self.new_user()
        homes = self.root / "campus"
        homes.mkdir(mode=0o755, exist_ok=True)
        subprocess.run(
            ["useradd", "--create-home", "--base-dir", str(homes), "--user-group", name],
            check=True,
            timeout=30,
        )
        return pwd.getpwnam(name)

    def ask(
        self, request: Mapping[str, Any] | bytes, environ: Mapping[str, str] | None = None
    ) -> tuple[list[dict[str, Any]], int, str]:
        """Run the agent with ``request`` on stdin: its reply lines, exit status, stderr."""
        data = request if isinstance(request, bytes) else json.dumps(request).encode()
        done = subprocess.run(
            self.command,
            input=data,
            capture_output=True,
            timeout=AGENT_TIMEOUT,
            env={"PATH": os.defpath, **(environ or {})},
        )
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        return lines, done.returncode, done.stderr.decode()

    def watch(self) -> subprocess.Popen[bytes]:
        """A watch channel: the request sent and stdin closed, as the hub's SSH client does."""
        process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": os.defpath},
        )
        assert process.stdin is not None
        process.stdin.write(b'{"v":1,"op":"watch"}')
        process.stdin.close()
        return process

    def cgroups(self) -> list[Path]:
        """The notebook cgroups now under this host's parent, in every hierarchy."""
        return sorted(
            child
            for hierarchy in find_hierarchies()
            if (hierarchy.mount / self.cgroup_parent).is_dir()
            for child in (hierarchy.mount / self.cgroup_parent).iterdir()
            if child.is_dir()
        )

    def records(self) -> list[str]:
        return sorted(p.name for p in self.state_dir.glob("*.json"))

    def processes_of(self, name: str) -> list[int]:
        account = _account(name)
        return [] if account is None else _pids_of({account.pw_uid})

    def existing_accounts(self) -> list[str]:
        return [name for name in self.accounts if _account(name) is not None]

    def in_notebook(self, machine: str, code: str, *args: str) -> subprocess.Popen[str]:
        """``code`` run as a cell of ``machine``'s notebook would run: as its account, in
        its cgroups, without new privileges (stdin, stdout and stderr piped)."""
        record = json.loads((self.state_dir / f"{machine}.json").read_text())
        account = pwd.getpwnam(record["user"])
        procs = [Path(cgroup) / "cgroup.procs" for cgroup in record["cgroups"]]
        return subprocess.Popen(
            [sys.executable, "-I", "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": os.defpath},
            preexec_fn=join_then(procs, becoming(account, account.pw_dir)),
        )

    def run_in_notebook(self, machine: str, code: str, *args: str) -> str:
        """What ``code`` run in ``machine``'s notebook (:meth:`in_notebook`) printed."""
        process = self.in_notebook(machine, code, *args)
        out, err = process.communicate(timeout=AGENT_TIMEOUT)
        assert process.returncode == 0, err
        return out


def start_request(
    user: str,
    machine: str,
    gpus: Sequence[str] = (),
    cores: int | None = 1,
    memory_gib: int | None = 1,
    **more: Any,
) -> dict[str, Any]:
    env = {
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:0/user/{user}/",
        "JUPYTERHUB_API_TOKEN": "not-a-real-token",
    }
    return {
        "v": 1,
        "op": "start",
        "user": user,
        "server": "",
        "machine": machine,
        "gpus": list(gpus),
        "cores": cores,
        "memory_gib": memory_gib,
        "env": env,
        "args": [],
        "stack": None,
        "manifest": {"machine": machine},
        **more,
    }


def started(host: Host, request: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's answer to a start that must succeed."""
    lines, status, stderr = host.ask(request)
    assert status == 0, (lines, stderr)
    assert lines[-1]["ok"] is True, (lines, stderr)
    return dict(lines[-1])


def write_config(
    folder: Path, listen: str, parent: str, homes: Path, **more: Any
) -> tuple[Path, Path]:
    state = folder / "state"
    command = more.pop("notebook_command", [sys.executable, "-I", str(STANDIN)])
    lines = [
        f"listen_address = {json.dumps(listen)}",
        f"state_dir = {json.dumps(str(state))}",
        f"cgroup_parent = {json.dumps(parent)}",
        f"home_root = {json.dumps(str(homes))}",
        f"notebook_command = {json.dumps(command)}",
        "cores = 4",
        "memory_gib = 4",
        *(f"{key} = {json.dumps(value)}" for key, value in more.items()),
    ]
    config = folder / "agent.toml"
    config.write_text("\n".join(lines) + "\n")
    return config, state


def clean(host: Host) -> None:
    """Every process of the test's accounts, their cgroups, the accounts and folders."""
    uids = {a.pw_uid for name in host.accounts if (a := _account(name)) is not None}
    for pid in _pids_of(uids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for uid in uids:  # what a failed test's notebooks left in shared memory
        remove_ipc_of(uid)
    with contextlib.suppress(CgroupError):
        remove_cgroups(host.cgroups(), 10.0)
        for hierarchy in find_hierarchies():
            with contextlib.suppress(FileNotFoundError):
                (hierarchy.mount / host.cgroup_parent).rmdir()
    for name in host.accounts:
        if _account(name) is not None:
            subprocess.run(["userdel", "-r", name], capture_output=True, timeout=30)
    shutil.rmtree(host.root, ignore_errors=True)


def _account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _pids_of(uids: set[int]) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) in uids:
                    pids.append(int(status.parent.name))
    return pids


def status_of(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as a dict of its fields."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def users_gid() -> int:
    return grp.getgrnam(USERS_GROUP).gr_gid


@contextlib.contextmanager
def fake_hub_api() -> Iterator[str]:
    """A hub API on 127.0.0.1 answering jupyterhub-singleuser's check of its hub's version
    (without one it retries for 46 s, then exits)."""
    from jupyterhub import __version__

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(json.dumps({"version": __version__}).encode())

        def do_POST(self) -> None:  # activity reports
            self._answer(b"")

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("X-JupyterHub-Version", __version__)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hub/api"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def make_host(tmp_path: Path) -> Host:
    # Homes outside pytest's tmp (0700): the accounts must be able to enter their parent.
    root = Path(tempfile.mkdtemp(prefix="cshost-"))
    root.chmod(0o755)
    homes = root / "homes"
    homes.mkdir(mode=0o755)
    parent = f"composespawner-test/{secrets.token_hex(4)}"
    listen = f"127.0.1.{random.randint(2, 250)}"
    config, state = write_config(tmp_path, listen, parent, homes)
    return Host(root, config, state, homes, listen, parent)
