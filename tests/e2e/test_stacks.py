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
from typing import Any

import pytest

from composespawner.catalog import Catalog
from tests.e2e.test_portal import Visitor
from tests.hubharness import (
    HUB_CONFIG,
    Hub,
    notebook_pid,
    process_env,
    running_hub,
    wait_for_portal,
)
from tests.support.kernel import run_in_kernel

pytestmark = pytest.mark.e2e
CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("stacks")) as hub:
        wait_for_portal(hub)
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


@pytest.mark.timeout(240)
def test_every_server_gets_a_read_only_run_manifest_the_portal_shows_too(hub: Hub) -> None:
    env = started_on(hub, "student2", {"gpu_count": 2})
    try:
        path = Path(env["COMPOSE_RUN_MANIFEST"])
        assert path.name == "default.run.json"
        assert path.parent == Path(env["HOME"]) / ".composespawner"
        mode = path.stat()
        assert (mode.st_mode & 0o777, mode.st_uid) == (0o444, 0)  # the hub's, read-only
        manifest = json.loads(path.read_text())

        machine = manifest["machine"]
        assert machine["id"] == env["COMPOSE_MACHINE_ID"]
        assert machine["host"] == env["COMPOSE_HOST"]
        assert [g["id"] for g in machine["gpus"]] == env["COMPOSE_DEVICE_IDS"].split(",")
        assert {g["model"] for g in machine["gpus"]} == {"NVIDIA T4"}
        stack = manifest["stack"]
        assert (stack["id"], stack["variant"]) == ("pytorch", "cpu")
        assert stack["lock_sha256"] == env["COMPOSE_STACK_LOCK_SHA256"]
        assert stack["image_digest"] is None  # no image is built here
        given = manifest["environment"]
        assert given["PYTHONHASHSEED"] == "0"
        assert given["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert not any("TOKEN" in name for name in given)
        assert manifest["options"]["gpu_count"] == 2

        # The same manifest in the kernel, in the portal (through the notebook's own
        # token) and in the server's saved state.
        shown = in_kernel(
            hub,
            "student2",
            "import json\nfrom composespawner import client\n"
            "print(json.dumps({'file': client.manifest(), 'portal': client.runs()[0]}))",
        )
        assert shown["file"] == manifest
        assert shown["portal"]["manifest"] == manifest
        assert shown["portal"]["machine_id"] == machine["id"]
        state = hub.user("student2")["servers"][""]["state"]
        assert state["run_manifest"] == manifest

        # Nobody else reads it: the 404 of a machine that never was.
        other = Visitor(hub, "student1").call("GET", f"api/runs/{machine['id']}")
        assert other.status_code == 404, other.text
        admin = Visitor(hub, "admin").call("GET", f"api/runs/{machine['id']}")
        assert admin.status_code == 200, admin.text
        assert admin.json()["manifest"] == manifest
    finally:
        hub.stop("student2")
    # Kept after the server ended, for "launch again identically".
    assert Visitor(hub, "student2").call("GET", "api/me").json()["runs"][0]["manifest"] == manifest


IDS = {
    "COMPOSE_MACHINE_ID",
    "COMPOSE_DEVICE_IDS",
    "COMPOSE_GPUS",
    "COMPOSE_HOST",
    "COMPOSE_RUN_MANIFEST",
}


def without_ids(manifest: dict[str, Any]) -> dict[str, str]:
    """The environment a manifest records, less what names this machine and server."""
    return {k: v for k, v in manifest["environment"].items() if k not in IDS}


@pytest.mark.timeout(300)
def test_launch_again_identically_from_a_run_manifest(hub: Hub) -> None:
    env = started_on(hub, "researcher1", {"gpu_count": 2, "stack": "tensorflow"})
    first = json.loads(Path(env["COMPOSE_RUN_MANIFEST"]).read_text())
    hub.stop("researcher1")
    owner, other = Visitor(hub, "researcher1"), Visitor(hub, "student1")
    run = f"api/runs/{first['machine']['id']}/launch"

    assert other.call("POST", run, json={"name": "again"}).status_code == 404
    bad = owner.call("POST", run, json={"name": "<b>x</b>"})
    assert bad.status_code == 400
    assert "is not allowed" in bad.json()["message"]
    assert owner.call("POST", run, json={"name": 7}).status_code == 400

    started = owner.call("POST", run, json={"name": "again"})
    assert started.status_code == 202, started.text
    assert started.json()["options"] == first["options"]
    hub.wait_ready("researcher1", "again", timeout=120)
    try:
        running = owner.call("POST", run, json={"name": "again"})
        assert running.status_code == 409
        assert "is running" in running.json()["message"]

        again_env = process_env(notebook_pid(hub, "researcher1", "again"))
        again = json.loads(Path(again_env["COMPOSE_RUN_MANIFEST"]).read_text())
        # The same but for times and ids.
        assert again["stack"] == first["stack"]
        assert again["options"] == first["options"]
        assert [g["model"] for g in again["machine"]["gpus"]] == [
            g["model"] for g in first["machine"]["gpus"]
        ]
        assert again["machine"]["id"] != first["machine"]["id"]
        assert again["server"] == "again"
        assert without_ids(again) == without_ids(first)
    finally:
        hub.stop("researcher1", "again")
