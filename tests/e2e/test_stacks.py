"""Servers run on the real stacks: JupyterLab and its kernels from the stack's own environment.

The environments come from the catalog's CPU locks (``make stacks`` builds them
before the suite; a start would build a missing one itself). Each kernel imports
its framework, the repro helper and composespawner's client, and sees the
stack's determinism settings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.catalog import Catalog
from tests.hubharness import HUB_CONFIG, Hub, notebook_pid, process_env, running_hub
from tests.support.kernel import run_in_kernel

pytestmark = pytest.mark.e2e
CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("stacks")) as hub:
        yield hub


def in_kernel(hub: Hub, user: str, code: str) -> dict[str, str]:
    token = process_env(notebook_pid(hub, user))["JUPYTERHUB_API_TOKEN"]
    done = run_in_kernel(f"{hub.url}/user/{user}/", token, code, timeout=120)
    assert done.error is None, done.error
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def started_on(hub: Hub, user: str, options: dict[str, object]) -> dict[str, str]:
    hub.spawn(user, {"gpu_model": "t4", "gpu_count": 1, **options}).raise_for_status()
    hub.wait_ready(user, timeout=120)
    return process_env(notebook_pid(hub, user))


REPORT = """
import json, os, sys, repro
from composespawner import client
print(json.dumps({{
    "prefix": sys.prefix,
    "framework": {framework},
    "hashseed": os.environ["PYTHONHASHSEED"],
    "deterministic": os.environ.get("{switch}", ""),
    "client": client.__name__,
    "seed": str(repro.seed_everything(3)),
}}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("options", "stack_id", "framework", "switch", "version"),
    [
        ({}, "pytorch", "__import__('torch').__version__", "CUBLAS_WORKSPACE_CONFIG", "2.13.0+cpu"),
        (
            {"stack": "tensorflow"},
            "tensorflow",
            "__import__('tensorflow').__version__",
            "TF_DETERMINISTIC_OPS",
            "2.21.0",
        ),
    ],
)
def test_the_notebook_and_its_kernels_run_in_the_stack(
    hub: Hub, options: dict[str, object], stack_id: str, framework: str, switch: str, version: str
) -> None:
    env = started_on(hub, "student1", options)
    try:
        assert env["COMPOSE_STACK"] == stack_id
        root = Path(env["VIRTUAL_ENV"])
        assert root.parent == Path("/var/cache/composespawner/stacks")
        assert root.name.startswith(f"{stack_id}-")
        command = Path(f"/proc/{notebook_pid(hub, 'student1')}/cmdline").read_bytes().split(b"\0")
        assert str(root / "bin" / "jupyterhub-singleuser").encode() in command

        manifest = json.loads(Path(env["COMPOSE_STACK_MANIFEST"]).read_text())
        stack = CATALOG.stack(stack_id)
        assert stack is not None
        assert stack.cpu is not None
        assert manifest["lock_sha256"] == stack.cpu.lock_sha256 == env["COMPOSE_STACK_LOCK_SHA256"]
        assert manifest["framework"]["version"] == version
        assert manifest["framework"]["built_with_cuda"] is None  # the CPU build

        shown = in_kernel(hub, "student1", REPORT.format(framework=framework, switch=switch))
        assert shown == {
            "prefix": str(root),
            "framework": version,
            "hashseed": "0",
            "deterministic": dict(stack.env)[switch],
            "client": "composespawner.client",
            "seed": "3",
        }
    finally:
        hub.stop("student1")
