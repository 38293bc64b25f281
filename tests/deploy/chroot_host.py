"""The compute host in the deploy test's Debian root: its fabric, sshd, keys and cgroups.

The same debootstrap root is the hub and its one compute host. No init runs
there, so the test starts the host's sshd itself, on a loopback address of its
own, and lends the root this machine's cgroup hierarchies for the agent.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from composespawner.hostagent.handoff import DEFAULT_SOCKET
from harness.hub import process_env, wait_for
from harness.simulator import INVENTORY
from harness.sshhosts import serving

CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def one_host_fabric(path: Path) -> Path:
    """The demo fabric with one compute host, host-01 (the root's sshd): the hub has no
    other host in its table, so a machine composed elsewhere could not start."""
    text = INVENTORY.read_text()
    first = text.index("[[hosts]]")
    second = text.index("[[hosts]]", first + 1)
    end = text.index("\n\n", second) + 2
    text = text[:first] + text[first:second].replace("count = 4", "count = 1") + text[end:]
    assert text.count("[[hosts]]") == 1
    path.write_text(text)
    return path


def loopback_address_and_port() -> tuple[str, int]:
    """A loopback address of the 127.0.1.0/24 the simulated hosts use, and a port free there."""
    address = f"127.0.1.{random.randint(100, 250)}"
    with socket.socket() as probe:
        probe.bind((address, 0))
        return address, int(probe.getsockname()[1])


def site_admin_key(tmp: Path, root: Path) -> Path:
    """A key the site already authorized for root: the converge must leave it there."""
    key = tmp / "site-admin"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "site-admin", "-f", str(key)],
        check=True,
        timeout=30,
    )
    folder = root / "root/.ssh"
    folder.mkdir(mode=0o700)
    (folder / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    (folder / "authorized_keys").chmod(0o600)
    return key


@contextmanager
def cgroups_in(root: Path) -> Iterator[str]:
    """This machine's cgroup hierarchies bound into ``root`` (a chroot has none of its
    own; the agent holds each notebook to its share in one), and a cgroup parent of this
    test's for the notebooks; both gone afterwards."""
    parent = f"composespawner-test/deploy-{uuid.uuid4().hex[:8]}"
    target = root / "sys/fs/cgroup"
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--rbind", "/sys/fs/cgroup", str(target)], check=True, timeout=30)
    try:
        # An unmount in the root must never reach this machine's own hierarchies.
        subprocess.run(["mount", "--make-rslave", str(target)], check=True, timeout=30)
        yield parent
    finally:
        subprocess.run(["umount", "--recursive", "--lazy", str(target)], check=True, timeout=30)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            remove_cgroup_tree(hierarchy / parent)


def remove_cgroup_tree(top: Path) -> None:
    """``top`` and what is under it, deepest first (the agent removed the notebooks')."""
    for folder in [*sorted(top.rglob("*"), key=lambda p: -len(p.parts)), top, top.parent]:
        with suppress(OSError):
            folder.rmdir()  # top.parent, composespawner-test: once no other test's is in it


def in_root(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROOT, str(root), *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@contextmanager
def host_sshd(root: Path, address: str, port: int, log: Path) -> Iterator[None]:
    """The compute host's sshd, as the converge configured it, on its loopback address
    only (no init runs in the root to start it)."""
    with log.open("ab") as output:
        sshd = subprocess.Popen(
            [
                *(CHROOT, str(root)),
                *("/usr/sbin/sshd", "-D", "-e"),
                *("-o", f"ListenAddress={address}:{port}"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: listening(address, port, sshd, log),
            30,
            "the host's sshd to listen",
        )
        assert listens_on(sshd.pid) == {(address, port)}, "sshd listens elsewhere too"
        yield
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


@contextmanager
def host_agent_server(root: Path, log: Path) -> Iterator[None]:
    """The agent's server as the unit the converge installed runs it (in ``root``), until
    its socket answers; stopped at the end as systemd would, the server alone."""
    unit = (root / "etc/systemd/system/composespawner-host.service").read_text()
    fields = dict(re.findall(r"^(\w+)=(.*)$", unit, re.MULTILINE))
    assert fields["KillMode"] == "process", unit
    path = root / DEFAULT_SOCKET.lstrip("/")
    name, value = fields["Environment"].split("=", 1)
    with log.open("ab") as output:
        server = subprocess.Popen(
            [CHROOT, str(root), "/bin/sh", "-c", f"exec {fields['ExecStart']}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", name: value},
            start_new_session=True,
        )
    try:
        wait_for(lambda: serving(server, path, log), 30, "the agent's server to listen")
        yield
    finally:
        server.terminate()
        server.wait(timeout=10)


def listening(address: str, port: int, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"sshd exited with {process.returncode}:\n{log.read_text()}")
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((address, port)) == 0


def ssh_as_root(
    address: str, port: int, known_hosts: Path, key: Path, command: str
) -> subprocess.CompletedProcess[str]:
    """``command`` sent over SSH to the host as root with ``key``, its host key pinned."""
    return subprocess.run(
        [
            "ssh",
            *("-i", str(key), "-p", str(port)),
            *("-o", f"UserKnownHostsFile={known_hosts}"),
            *("-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"),
            *("-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10"),
            f"root@{address}",
            command,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def host_notebook(root: Path, user: str) -> int | None:
    """The pid of ``user``'s notebook server running in ``root`` (on the host), if any."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "root") != str(root):
                continue
            env = process_env(int(entry.name))
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if env.get("JUPYTERHUB_USER") == user and b"jupyterhub-singleuser" in command:
            found.append(int(entry.name))
    return min(found, default=None)


def accounts(root: Path) -> dict[str, list[str]]:
    """The root's /etc/passwd, by account name."""
    lines = (root / "etc/passwd").read_text().split()
    return {line.split(":")[0]: line.split(":") for line in lines}


def as_account(root: Path, name: str, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by ``name``'s account in the converged root, as their notebook runs."""
    account = accounts(root)[name]
    return subprocess.run(
        [
            *(CHROOT, str(root)),
            *("setpriv", f"--reuid={account[2]}", f"--regid={account[3]}", "--clear-groups"),
            *("--", "/bin/sh", "-c", script),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def listens_on(pid: int) -> set[tuple[str, int]]:
    """The TCP addresses ``pid`` listens on (IPv4 ones by address, IPv6 ones as "v6")."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = set()
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            where, port = fields[1].split(":")
            host = "v6" if v6 else socket.inet_ntoa(bytes.fromhex(where)[::-1])
            found.add((host, int(port, 16)))
    return found
