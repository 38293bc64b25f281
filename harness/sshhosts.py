"""Compute hosts for tests: one real OpenSSH sshd per simulated host, with the agent.

Each host of the demo fabric (host-01 … host-08) gets an ``sshd -D -e -f CONFIG``
on a loopback address of its own (127.0.1.N, N = 10 + its number) and a free
port there, its own ed25519 host key, and an authorized_keys file whose only
line lets the hub's key run the host agent as a forced command, as the
deployment sets up root's on a real host, and the agent's server beside it (its own
socket, which the forced command names). Each host's agent has its own config:
its listen address, state folder, cgroups, the simulated host's capacity, and
homes under a folder of the test's.

The agents create accounts for the users the hub starts notebooks for (the demo's
student1 … admin): :func:`ssh_hosts` removes those it created (never one that
existed before) when it ends, with every process left under the homes, every
sshd, and the test's cgroups.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composespawner.hostagent import handoff
from harness.hub import alive, leftover_pids, wait_for

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")  # sshd's privilege separation folder: it refuses to run without
# The forced command as the host role writes it: the agent's handoff by path, without site.
FORCED = f"{sys.executable} -IS {handoff.__file__}"
SERVER = Path(sys.executable).parent / "composespawner-host-server"
# What sshd gives a forced command (and systemd the agent's server, with HOME set).
AGENT_BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "USER": "root"}
DEMO_HOSTS = tuple(f"host-{n:02d}" for n in range(1, 9))  # the demo fabric's Ids
DEMO_USERS = ("student1", "student2", "researcher1", "teacher1", "admin")
USERS_GROUP = "composespawner-users"  # the group the agent puts accounts it creates in
CGROUP_ROOT = Path("/sys/fs/cgroup")
STOP_TIMEOUT = 10.0
MAX_SESSIONS = 64  # the hosts' sshd MaxSessions and the hub's, as the Ansible roles set them


@dataclass
class SSHHost:
    """One simulated compute host: its sshd and its agent's files."""

    host_id: str
    address: str
    port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    server: subprocess.Popen[bytes] | None = None  # the agent's server

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def sshd_config(self) -> Path:
        return self.folder / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.folder / "ssh_host_ed25519_key"

    @property
    def agent_config(self) -> Path:
        return self.folder / "agent.toml"

    @property
    def state_dir(self) -> Path:
        return self.folder / "agent-state"

    @property
    def agent_log(self) -> Path:
        return self.folder / "agent.log"

    @property
    def sshd_log(self) -> Path:
        return self.folder / "sshd.log"

    @property
    def server_socket(self) -> Path:
        return self.folder / "agent.sock"

    @property
    def server_log(self) -> Path:
        return self.folder / "server.log"


@dataclass
class SSHHosts:
    """The hosts, the hub's key and known_hosts: what a hub config needs."""

    hosts: dict[str, SSHHost]
    client_key: Path
    known_hosts: Path
    home_root: Path
    cgroup_parent: str
    notebook_command: tuple[str, ...] = ()
    agent_env: tuple[tuple[str, str], ...] = ()
    agent_settings: tuple[tuple[str, Any], ...] = ()  # more keys of each agent's config

    def hub_config(self, connect_timeout: float = 5) -> str:
        """The lines that make ``running_hub``'s demo hub run notebooks on these hosts."""
        hosts = {host_id: host.where for host_id, host in self.hosts.items()}
        return f"""
c.JupyterHub.spawner_class = "compose-ssh"
c.SSHLauncher.hosts = {hosts!r}
c.SSHLauncher.ssh_key = {str(self.client_key)!r}
c.SSHLauncher.known_hosts = {str(self.known_hosts)!r}
c.SSHLauncher.connect_timeout = {connect_timeout!r}
c.SSHLauncher.max_sessions = {MAX_SESSIONS}
"""

    def stop(self, host_id: str) -> None:
        """Stop the host's sshd and its sessions (their agents): the host is unreachable.

        Notebooks started there live on (they are in sessions of their own), as on a
        host whose SSH server stopped.
        """
        _stop_sshd(self.hosts[host_id])

    def start(self, host_id: str) -> None:
        _start_sshd(self.hosts[host_id])

    def stop_server(self, host_id: str) -> None:
        """Stop the host's agent's server: its forced commands run their requests alone."""
        _stop_server(self.hosts[host_id])

    def start_server(self, host_id: str) -> None:
        _start_server(self.hosts[host_id], self.agent_env)

    def new_host_key(self, host_id: str) -> None:
        """The host's sshd restarted with a new host key (known_hosts keeps the old)."""
        host = self.hosts[host_id]
        _stop_sshd(host)
        host.host_key.unlink()
        host.host_key.with_suffix(".pub").unlink()
        _keygen(host.host_key, f"{host_id}-new")
        _start_sshd(host)

    def records(self, host_id: str) -> list[Path]:
        """The agent's records of the notebooks it runs on ``host_id``."""
        state = self.hosts[host_id].state_dir
        return sorted(state.glob("*.json")) if state.is_dir() else []

    def all_records(self) -> list[dict[str, Any]]:
        """Every host agent's records of the notebooks it runs."""
        found = []
        for host_id in self.hosts:
            for path in self.records(host_id):
                with suppress(OSError, ValueError):
                    found.append(json.loads(path.read_text()))
        return found

    def notebook(self, user: str, server: str = "") -> tuple[SSHHost, dict[str, Any]] | None:
        """The host and agent's record of ``user``'s notebook ``server``, if one runs."""
        for host in self.hosts.values():
            for path in self.records(host.host_id):
                with suppress(OSError, ValueError):
                    record = json.loads(path.read_text())
                    if (record.get("user"), record.get("server")) == (user, server):
                        return host, record
        return None

    def agent_log(self, host_id: str) -> str:
        path = self.hosts[host_id].agent_log
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def ssh_hosts(
    tmp: Path,
    host_ids: Sequence[str] = DEMO_HOSTS,
    *,
    cores: int = 64,
    memory_gib: int = 512,
    users: Sequence[str] = DEMO_USERS,
    notebook_command: Sequence[str] = (),
    agent_env: Mapping[str, str] | None = None,
    agent_settings: Mapping[str, Any] | None = None,
) -> Iterator[SSHHosts]:
    """Start an sshd per host in ``host_ids`` (capacity ``cores``/``memory_gib`` each,
    the demo inventory's); remove at the end the accounts among ``users`` the agents made.

    ``notebook_command``: what the agents run for a start without a stack (default:
    this venv's jupyterhub-singleuser). ``agent_env``: variables the forced command sets
    for the agents (a stand-in NVML's). ``agent_settings``: more keys of each agent's
    config (the containers runtime's); ``relay_dir`` is made each host's own. Each host
    runs its agent's server beside its sshd, as deployed."""
    assert os.geteuid() == 0, "the hosts' sshd and agents run as root, as on a real host"
    existed = {user for user in users if _account(user) is not None}
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    token = secrets.token_hex(4)
    folder = tmp / f"ssh-{token}"
    folder.mkdir()
    # Outside pytest's private (0700) tmp: the notebooks' accounts must reach their homes.
    home_root = Path(tempfile.mkdtemp(prefix="composespawner-ssh-homes-"))
    home_root.chmod(0o755)
    client_key = folder / "hub_key"
    _keygen(client_key, "hub@composespawner-test")
    hosts = _hosts(folder, host_ids)
    result = SSHHosts(
        hosts=hosts,
        client_key=client_key,
        known_hosts=folder / "known_hosts",
        home_root=home_root,
        cgroup_parent=f"composespawner-test/{token}",
        notebook_command=tuple(notebook_command),
        agent_env=tuple(sorted((agent_env or {}).items())),
        agent_settings=tuple(sorted((agent_settings or {}).items())),
    )
    try:
        for host in hosts.values():
            _set_up(host, result, cores, memory_gib)
        result.known_hosts.write_text("".join(_known_host(h) for h in hosts.values()))
        for host in hosts.values():
            _start_server(host, result.agent_env)
            _start_sshd(host)
        yield result
    finally:
        _tear_down(result, users, existed)


def _hosts(folder: Path, host_ids: Sequence[str]) -> dict[str, SSHHost]:
    hosts = {}
    for index, host_id in enumerate(host_ids):
        number = int(host_id.rsplit("-", 1)[1]) if host_id[-1].isdigit() else index + 1
        address = f"127.0.1.{10 + number}"
        host_folder = folder / host_id
        host_folder.mkdir()
        hosts[host_id] = SSHHost(host_id, address, _free_port(address), host_folder)
    return hosts


def _set_up(host: SSHHost, hosts: SSHHosts, cores: int, memory_gib: int) -> None:
    _keygen(host.host_key, host.host_id)
    host.state_dir.mkdir(mode=0o700)
    # A JSON list of strings is a TOML array of strings.
    notebook = f"notebook_command = {json.dumps(hosts.notebook_command)}\n"
    host.agent_config.write_text(
        f'listen_address = "{host.address}"\n'
        f'state_dir = "{host.state_dir}"\n'
        f'cgroup_parent = "{hosts.cgroup_parent}/{host.host_id}"\n'
        f'home_root = "{hosts.home_root}"\n'
        f"cores = {cores}\n"
        f"memory_gib = {memory_gib}\n"
        f'log_file = "{host.agent_log}"\n'
        # The fabric's GPUs are simulated: no GPU of theirs is on this machine to find.
        "gpu_list_command = []\n"
        + (notebook if hosts.notebook_command else "")
        + "".join(f"{key} = {json.dumps(value)}\n" for key, value in hosts.agent_settings)
        + (f'relay_dir = "{hosts.home_root}-relay/{host.host_id}"\n' if _relayed(hosts) else "")
    )
    public = hosts.client_key.with_suffix(".pub").read_text().strip()
    command = f"{FORCED} --config {host.agent_config} --socket {host.server_socket}"
    if hosts.agent_env:
        command = " ".join(["env", *(f"{k}={shlex.quote(v)}" for k, v in hosts.agent_env), command])
    (host.folder / "authorized_keys").write_text(f'restrict,command="{command}" {public}\n')
    host.sshd_config.write_text(
        f"""Port {host.port}
ListenAddress {host.address}
HostKey {host.host_key}
PidFile {host.folder / "sshd.pid"}
AuthorizedKeysFile {host.folder / "authorized_keys"}
AllowUsers root
PermitRootLogin forced-commands-only
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# No PAM: its session modules (systemd-logind, limits) are the real machine's, not a test's.
UsePAM no
# The files are under /tmp, which everyone may write to: sshd would refuse to read
# keys from there. Production keeps root's authorized_keys where StrictModes holds.
StrictModes no
# Every start, stop and poll is a channel of the hub's one connection per host; a
# class starting at once opens many together (OpenSSH's default is 10): as deployed.
MaxSessions {MAX_SESSIONS}
MaxStartups 100:30:200
# The forced command runs through root's shell, and Debian's bash reads ~/.bashrc for a
# command sshd starts unless it is a nested shell: this machine's root .bashrc sets up
# pyenv (a dozen programs a channel, most of a channel's CPU). A compute host's root has
# Debian's own, which does nothing there; SHLVL=1 makes the test hosts' the same.
SetEnv SHLVL=1
X11Forwarding no
PrintMotd no
UseDNS no
LogLevel VERBOSE
"""
    )


def _relayed(hosts: SSHHosts) -> bool:
    """Whether each agent gets a relay folder of its own (it runs containers)."""
    return dict(hosts.agent_settings).get("runtime") == "containers" and "relay_dir" not in dict(
        hosts.agent_settings
    )


def _known_host(host: SSHHost) -> str:
    key_type, key = host.host_key.with_suffix(".pub").read_text().split()[:2]
    return f"[{host.address}]:{host.port} {key_type} {key}\n"


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        timeout=30,
        capture_output=True,
    )


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


# -- sshd ------------------------------------------------------------------------------


def _start_sshd(host: SSHHost) -> None:
    check = subprocess.run(
        [SSHD, "-t", "-f", str(host.sshd_config)], capture_output=True, timeout=30, text=True
    )
    assert check.returncode == 0, f"{host.host_id}'s sshd config: {check.stderr}"
    with host.sshd_log.open("ab") as log:
        host.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(host.sshd_config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_for(lambda: _answers(host), 10, f"{host.host_id}'s sshd on {host.where}")


def _answers(host: SSHHost) -> bool:
    assert host.proc is not None
    if host.proc.poll() is not None:
        log = host.sshd_log.read_text(errors="replace")[-2000:]
        raise AssertionError(f"{host.host_id}'s sshd exited ({host.proc.returncode}):\n{log}")
    with socket.create_connection((host.address, host.port), timeout=1):
        return True


def _stop_sshd(host: SSHHost) -> None:
    """The listener and its sessions (each connection's sshd, and the agents under it)."""
    proc, host.proc = host.proc, None
    if proc is None:
        return
    sessions = _children(proc.pid)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the listener, and its sessions' group
    for pid in sessions:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT)
    wait_for(lambda: not any(alive(p) for p in sessions), STOP_TIMEOUT, "sshd's sessions to end")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


# -- the agent's server ---------------------------------------------------------------


def start_agent_server(
    socket_path: Path, log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A host agent's server on ``socket_path``, with what systemd gives it (and ``env``),
    logging to ``log_path``; once it answers there."""
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [SERVER, "--socket", str(socket_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**AGENT_BASE_ENV, **(env or {})},
            start_new_session=True,
        )
    try:
        wait_for(lambda: serving(server, socket_path, log_path), 10, "the agent's server")
    except BaseException:
        stop_agent_server(server)
        raise
    return server


def serving(server: subprocess.Popen[bytes], socket_path: Path, log_path: Path) -> bool:
    """Whether the agent's server answers on ``socket_path``; AssertionError, with its
    log's end, once it has exited."""
    if server.poll() is not None:
        log = log_path.read_text(errors="replace")[-2000:]
        raise AssertionError(f"the agent's server exited ({server.returncode}):\n{log}")
    with socket.socket(socket.AF_UNIX) as probe:
        return probe.connect_ex(str(socket_path)) == 0


def stop_agent_server(server: subprocess.Popen[bytes]) -> int:
    """The server alone, its exit status: the requests it forked run on, as systemd's
    KillMode=process leaves them."""
    server.terminate()
    try:
        return server.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait(timeout=STOP_TIMEOUT)


def _start_server(host: SSHHost, agent_env: Sequence[tuple[str, str]]) -> None:
    host.server = start_agent_server(host.server_socket, host.server_log, dict(agent_env))


def _stop_server(host: SSHHost) -> None:
    server, host.server = host.server, None
    if server is not None:
        stop_agent_server(server)


# -- the end ----------------------------------------------------------------------------


def _tear_down(hosts: SSHHosts, users: Sequence[str], existed: set[str]) -> None:
    for host in hosts.hosts.values():
        _stop_sshd(host)
        _stop_server(host)
    created = [u for u in users if u not in existed and _made_by_agent(u, hosts.home_root)]
    uids = {pwd.getpwnam(u).pw_uid for u in created}
    # A notebook works in its home; an account the agent made runs nothing else here.
    leftovers = sorted(set(_processes_of(uids)) | set(leftover_pids(hosts.home_root, group=-2)))
    described = [_described(pid) for pid in leftovers]
    for pid in leftovers:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in leftovers), STOP_TIMEOUT, "leftovers to die")
    for user in created:
        subprocess.run(["userdel", "-r", user], capture_output=True, timeout=60, check=False)
    _remove_cgroups(hosts.cgroup_parent)
    shutil.rmtree(hosts.home_root, ignore_errors=True)
    shutil.rmtree(f"{hosts.home_root}-relay", ignore_errors=True)  # the agents' relay folders
    assert not leftovers, f"processes outlived the test's hosts: {described}"


def _described(pid: int) -> str:
    """``pid (uid N): command line``, for a report of what was left running."""
    try:
        uid = Path(f"/proc/{pid}").stat().st_uid
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} (uid {uid}): {command.strip()[:120]}"


def _account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _made_by_agent(name: str, home_root: Path) -> bool:
    """An account this test's agents created: its home under theirs, in their group."""
    account = _account(name)
    if account is None or not Path(account.pw_dir).is_relative_to(home_root):
        return False
    try:
        return name in grp.getgrnam(USERS_GROUP).gr_mem
    except KeyError:
        return False


def _processes_of(uids: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                if entry.stat().st_uid in uids and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def _remove_cgroups(parent: str) -> None:
    """The test's cgroups, deepest first (the agents' stops removed the notebooks')."""
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / parent
        if not top.is_dir():
            continue
        for folder in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
            if folder.is_dir():
                with suppress(OSError):
                    folder.rmdir()
        with suppress(OSError):
            top.rmdir()
        with suppress(OSError):
            top.parent.rmdir()  # composespawner-test, once no other test's is in it
