"""Running a starter kit headless, as its user would: papermill, a kernel in the stack.

Each run is its own papermill process with its own kernel, started from the
stack's environment (the one ``make stacks`` built from its CPU lock) with the
stack's determinism settings, in a folder the kit was copied into.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from composespawner.domain.catalog import Catalog, Stack
from composespawner.launchers.environments import StackEnvironment, StackEnvironments, default_root
from harness.paths import HUB_CONFIG, ROOT

KITS = ROOT / "images" / "kits"
CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")
WEIGHTS_LINE = re.compile(r"^weights-sha256: ([0-9a-f]{64})$")


@dataclass(frozen=True)
class KitRun:
    """What one headless run left: the executed notebook, its record and its last line."""

    notebook: nbformat.NotebookNode
    record: dict[str, Any]
    weights: str
    seconds: float

    @property
    def metric(self) -> float:
        return float(self.record["metric"])


def built_environment(stack: Stack) -> StackEnvironment:
    """The stack's environment, which ``make stacks`` built before the suite."""
    assert stack.common is not None
    environment = StackEnvironments(default_root(), stack.common).ready(stack)
    assert environment is not None, f"the {stack.id} stack is not built: run `make stacks`"
    return environment


def install_kernel(folder: Path, stack: Stack) -> str:
    """A kernel spec under ``folder`` (a JUPYTER_PATH entry) running ``stack``'s Python."""
    environment = built_environment(stack)
    name = f"stack-{stack.id}"
    spec = folder / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    kernel = {
        "argv": [
            str(environment.bin / "python"),
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
        ],
        "display_name": stack.label,
        "language": "python",
        "env": {**dict(stack.env), "VIRTUAL_ENV": str(environment.path)},
    }
    (spec / "kernel.json").write_text(json.dumps(kernel))
    return name


def run_kit(
    kit: str,
    notebook: str,
    folder: Path,
    stack: Stack,
    *,
    timeout: float,
    **parameters: Any,
) -> KitRun:
    """Copy kit ``kit`` into ``folder`` and run ``notebook`` there with ``parameters``."""
    shutil.copytree(KITS / kit, folder, dirs_exist_ok=True)
    jupyter = folder.parent / f"{folder.name}-jupyter"
    kernel = install_kernel(jupyter, stack)
    executed = folder / f"executed-{notebook}"
    # In a network namespace of its own with only loopback up (papermill talks to
    # its kernel over it): a kit that downloads anything fails.
    offline = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
    command = [
        *offline, sys.executable, "-m", "papermill", str(folder / notebook), str(executed),
        "--kernel", kernel, "--cwd", str(folder), "--no-progress-bar",
        "--execution-timeout", str(int(timeout)),
    ]  # fmt: skip
    for name, value in parameters.items():
        command += ["-p", name, str(value)]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "JUPYTER_PATH": str(jupyter),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    started = time.monotonic()
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, f"{kit} failed:\n{result.stderr[-4000:]}"
    ran = nbformat.read(executed, as_version=4)
    return KitRun(
        ran, json.loads((folder / "runs" / "last.json").read_text()), last_line_hash(ran), seconds
    )


def last_line_hash(notebook: nbformat.NotebookNode) -> str:
    """The hash the kit's last cell prints: ``weights-sha256: <hex>``."""
    last = notebook.cells[-1]
    text = "".join(o.get("text", "") for o in last.get("outputs", []) if o.output_type == "stream")
    match = WEIGHTS_LINE.match(text.strip().splitlines()[-1] if text.strip() else "")
    assert match, f"the last cell printed {text!r}, not weights-sha256: <hex>"
    return match.group(1)
