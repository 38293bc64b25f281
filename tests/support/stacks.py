"""Small stacks for tests: a wheel made on the spot and a hashed lock naming it.

Building an environment from them takes seconds and needs no package index.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from composespawner.domain.catalog import Stack, StackBuild
from harness.paths import ROOT

COMMON = ROOT / "images" / "common"


def make_wheel(folder: Path, name: str = "tiny", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: one module saying its version."""
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def make_lock(
    folder: Path, *, wheel_hash: str | None = None, also: tuple[tuple[str, str], ...] = ()
) -> Path:
    """A hashed lock of the made wheel ``tiny`` and of ``also`` (name, version) pairs.

    ``wheel_hash``: another hash for tiny than its own, as a tampered wheel would have.
    """
    lines = ["# a test lock"]
    for name, version in (("tiny", "1.0"), *also):
        wheel = make_wheel(folder, name, version)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if name == "tiny" and wheel_hash:
            digest = wheel_hash
        lines.append(f"{wheel} \\\n    --hash=sha256:{digest}")
    lock = folder / "requirements-cpu.lock"
    lock.write_text("\n".join(lines) + "\n")
    return lock


def make_stack(folder: Path, *, wheel_hash: str | None = None) -> Stack:
    lock = make_lock(folder, wheel_hash=wheel_hash)
    sha256 = hashlib.sha256(lock.read_bytes()).hexdigest()
    return Stack(
        id="tiny",
        label="Tiny 1.0",
        cpu=StackBuild(lock=lock, lock_sha256=sha256),
        env=(("PYTHONHASHSEED", "0"),),
        common=COMMON,
    )
