"""A Debian (bookworm) root made with debootstrap, and the Ansible tools to converge it.

Both are built once and kept under ~/.cache/composespawner, keyed by what they
are made of: the root as a tarball (about a minute to make, 270 MB), the tools
as a venv from ansible/requirements.txt. Each test unpacks a fresh root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from harness.paths import ROOT

CACHE = Path.home() / ".cache" / "composespawner"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What a host needs before Ansible can reach it: Python (the chroot connection
# runs modules with it) and the CA certificates its package installs trust.
INCLUDE = ("python3", "ca-certificates")
BUILD_TIMEOUT = 900  # seconds: debootstrap, or installing the Ansible tools
REQUIREMENTS = ROOT / "ansible" / "requirements.txt"


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def ansible_tools() -> Path:
    """The bin folder of a venv with ansible and ansible-lint as pinned for the project."""
    venv = CACHE / f"ansible-{_key(REQUIREMENTS.read_text())}"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "-r", str(REQUIREMENTS)],
            check=True,
            timeout=BUILD_TIMEOUT,
        )
        (venv / ".complete").touch()
    return venv / "bin"


def _root_tarball() -> Path:
    tarball = CACHE / f"debootstrap-{SUITE}-{_key(SUITE, MIRROR, *INCLUDE)}.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    assert Path(debootstrap).exists(), "debootstrap is missing: `make install-test` installs it"
    CACHE.mkdir(parents=True, exist_ok=True)
    work = CACHE / f".debootstrap-{os.getpid()}"
    try:
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(INCLUDE)}",
                SUITE,
                str(work),
                MIRROR,
            ],
            check=True,
            timeout=BUILD_TIMEOUT,
            capture_output=True,
        )
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(work), "-cf", str(partial), "."], check=True, timeout=300)
        partial.replace(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tarball


@contextmanager
def debian_root(folder: Path) -> Iterator[Path]:
    """A fresh Debian root under ``folder``, with /proc mounted; every process in it is
    killed and /proc unmounted afterwards.

    It trusts this machine's CA bundle and resolver (the site's own, as a new host
    would) and starts no services from package scripts (policy-rc.d), as there is
    no init to run them.
    """
    root = folder / "debian"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(_root_tarball())], check=True, timeout=300)
    shutil.copyfile(
        "/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt"
    )
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True, timeout=30)
    try:
        yield root
    finally:
        _kill_processes_in(root)
        subprocess.run(["umount", "--lazy", str(root / "proc")], check=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _kill_processes_in(root: Path) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            if Path(os.readlink(entry / "root")) == root:
                os.kill(int(entry.name), signal.SIGKILL)
