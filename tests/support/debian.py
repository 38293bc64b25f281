"""A Debian (bookworm) root made with debootstrap, and the Ansible tools to converge it.

Both are built once and kept under ~/.cache/composespawner, keyed by what they
are made of: the root as a tarball (about a minute to make, 270 MB), the tools
as a venv from ansible/requirements.txt. Each test unpacks a fresh root.

What a converge downloads into the root (Debian packages, wheels, npm packages)
is kept there too, as a site's local mirror or proxy would keep it: the root's
download caches are bind mounts of folders under ~/.cache, so the second run
installs the same packages without fetching them again. Each package manager
still checks what it installs (apt's signed indexes and hashes, pip's
constraints, npm's integrity), and the root itself is new each time.
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
# Inside the root -> kept under CACHE. apt keeps .debs unless told to clean, and
# checks them against the indexes it fetches anew; pip and npm key by hash.
DOWNLOAD_CACHES = {
    "var/cache/apt/archives": f"debian-{SUITE}-apt-archives",
    "root/.cache/pip": "debian-pip-cache",
    "root/.npm": "debian-npm-cache",
}


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
    mounted: list[Path] = []
    try:
        for inside, kept in DOWNLOAD_CACHES.items():
            mounted.append(_bind(CACHE / kept, root / inside))
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True, timeout=30)
        mounted.append(root / "proc")
        yield root
    finally:
        _kill_processes_in(root)
        for point in reversed(mounted):
            subprocess.run(["umount", "--lazy", str(point)], check=True, timeout=30)
        # Only once nothing is mounted: removing the root must never reach into ~/.cache.
        shutil.rmtree(root, ignore_errors=True)


def _bind(source: Path, target: Path) -> Path:
    source.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True, timeout=30)
    return target


def _kill_processes_in(root: Path) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            if Path(os.readlink(entry / "root")) == root:
                os.kill(int(entry.name), signal.SIGKILL)
