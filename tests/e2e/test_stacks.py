"""Servers run on the real stacks: JupyterLab and its kernels from the stack's own environment.

The environments come from the catalog's CPU locks (``make stacks`` builds them
before the suite; a start would build a missing one itself). Each kernel imports
its framework, the repro helper and composespawner's client, and sees the
stack's determinism settings.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from composespawner.domain.catalog import Catalog
from harness.hub import (
    HUB_CONFIG,
    Hub,
    notebook_pid,
    process_env,
    running_hub,
    wait_for_portal,
)
from tests.e2e.test_portal import Visitor
from tests.support.kernel import run_in_kernel
from tests.support.kits import KITS

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
        gpus = json.loads(env["COMPOSE_GPUS"])
        assert given["CUDA_VISIBLE_DEVICES"] == ",".join(f"GPU-{g['uuid']}" for g in gpus)
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
        admin = Visitor(hub, "admin")
        seen = admin.call("GET", f"api/runs/{machine['id']}")
        assert seen.status_code == 200, seen.text
        assert seen.json()["manifest"] == manifest
        # And as pages: from the inventory to the run, for the admins.
        inventory = admin.call("GET", "inventory").text
        assert f'href="/services/compose/runs/{machine["id"]}"' in inventory
        page = admin.call("GET", f"runs/{machine['id']}")
        assert page.status_code == 200, page.text
        assert machine["host"] in page.text
        assert env["COMPOSE_STACK_LOCK_SHA256"][:12] in page.text
        assert Visitor(hub, "student1").call("GET", f"runs/{machine['id']}").status_code == 404
        # And for its user, from my machine.
        owner = Visitor(hub, "student2")
        assert f'href="/services/compose/runs/{machine["id"]}"' in owner.call("GET", "").text
        assert machine["host"] in owner.call("GET", f"runs/{machine['id']}").text
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
    "CUDA_VISIBLE_DEVICES",  # the GPUs' UUIDs
    "NVIDIA_VISIBLE_DEVICES",
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


def contents(hub: Hub, user: str, token: str, method: str, path: str, **kw: Any) -> Any:
    """The user's own server's contents API, as JupyterLab uses it."""
    url = f"{hub.url}/user/{user}/api/contents/starter-kits/digits/{path}"
    reply = requests.request(
        method, url, headers={"Authorization": f"token {token}"}, timeout=30, **kw
    )
    assert reply.ok, reply.text
    return reply


@pytest.mark.timeout(300)
def test_a_starter_kit_lands_in_the_home_and_the_users_work_survives_the_next_start(
    hub: Hub,
) -> None:
    env = started_on(hub, "teacher1", {"kit": "digits"})
    kit = Path(env["HOME"]) / "starter-kits" / "digits"
    token = env["JUPYTERHUB_API_TOKEN"]
    try:
        assert env["COMPOSE_STACK"] == "pytorch"  # the kit's stack
        assert env["JUPYTERHUB_DEFAULT_URL"] == "/lab/tree/starter-kits/digits/digits.ipynb"
        for name in ("digits.ipynb", "digits_kit.py"):
            assert (kit / name).read_bytes() == (KITS / "digits" / name).read_bytes()
        assert (kit / "digits.ipynb").stat().st_uid == Path(env["HOME"]).stat().st_uid
        manifest = json.loads(Path(env["COMPOSE_RUN_MANIFEST"]).read_text())
        assert manifest["options"]["kit"] == "digits"

        # The user changes the notebook and deletes the data module, from the server.
        edited = contents(hub, "teacher1", token, "GET", "digits.ipynb").json()
        edited["content"]["cells"][0]["source"] = "# My own digits"
        body = {"type": "notebook", "format": "json", "content": edited["content"]}
        contents(hub, "teacher1", token, "PUT", "digits.ipynb", json=body)
        contents(hub, "teacher1", token, "DELETE", "digits_kit.py")
    finally:
        hub.stop("teacher1")

    started_on(hub, "teacher1", {"kit": "digits"})
    try:
        first_cell = json.loads((kit / "digits.ipynb").read_text())["cells"][0]["source"]
        assert "".join(first_cell) == "# My own digits"  # the user's changes win
        assert (kit / "digits_kit.py").read_bytes() == (
            KITS / "digits" / "digits_kit.py"
        ).read_bytes()
    finally:
        hub.stop("teacher1")


@pytest.mark.timeout(300)
def test_a_cohort_keeps_its_members_to_its_stacks_and_offers_them_its_kit(hub: Hub) -> None:
    admin = Visitor(hub, "admin")
    course = {"stacks": ["tensorflow"], "starter_kit": None}
    assert admin.call("PUT", "api/cohorts/cs-101", json=course).status_code == 200
    try:
        refused = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "stack": "pytorch"})
        assert refused.status_code == 403, refused.text
        assert "cohort cs-101 uses these stacks only: TensorFlow 2.21" in refused.json()["message"]
        assert hub.composed_hosts() == {}
        on_kit = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "kit": "digits"})
        assert on_kit.status_code == 403, on_kit.text  # the kit runs on PyTorch

        # The form offers only what the cohort uses, and no kit on another stack.
        form = hub.login("student1").get(f"{hub.url}/hub/spawn", timeout=30).text
        assert 'value="tensorflow"' in form
        assert 'value="pytorch"' not in form
        assert 'name="kit"' not in form
        assert "Your cohort cs-101 uses these." in form

        # Without a stack asked for: the first the cohort uses.
        assert started_on(hub, "student1", {})["COMPOSE_STACK"] == "tensorflow"
        hub.stop("student1")

        # Someone outside the cohort is not held to it, and is offered the kits.
        form = hub.login("researcher1").get(f"{hub.url}/hub/spawn", timeout=30).text
        assert 'value="pytorch"' in form
        assert 'value="digits"' in form
    finally:
        hub.stop("student1")
        assert admin.call("DELETE", "api/cohorts/cs-101").status_code == 204


RUN_AND_SUBMIT = """
import json, os, subprocess, sys
from composespawner import client
kit = os.path.expanduser("~/starter-kits/digits")
subprocess.run(
    [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--inplace",
     "digits.ipynb"],
    cwd=kit, check=True, capture_output=True, timeout=240,
)
first = client.submit("digits", team="blue", folder=kit)
again = client.submit("digits", team="blue", folder=kit)
print(json.dumps({"first": first, "again": again,
                  "record": json.load(open(os.path.join(kit, "runs", "last.json")))}))
"""


@pytest.mark.timeout(400)
def test_a_kit_run_in_the_server_is_scored_blind_onto_its_cohorts_leaderboard(hub: Hub) -> None:
    admin, member, outsider = (
        Visitor(hub, "admin"),
        Visitor(hub, "student1"),
        Visitor(hub, "researcher1"),
    )
    course = {"starter_kit": "digits"}
    assert admin.call("PUT", "api/cohorts/cs-101", json=course).status_code == 200
    started_on(hub, "student2", {"kit": "digits"})
    try:
        done = in_kernel(hub, "student2", RUN_AND_SUBMIT)
        first, again = done["first"], done["again"]
        assert (first["kit"], first["cohort"], first["rank"]) == ("digits", "cs-101", 1)
        assert 0.8 < first["score"] <= 1.0
        assert abs(first["score"] - done["record"]["metric"]) < 0.1  # blind, yet close
        # The same model gets the same score: it can be checked again.
        assert (again["score"], again["model_sha256"]) == (first["score"], first["model_sha256"])

        board = member.call("GET", "api/kits/digits/leaderboard?cohort=cs-101").json()
        [standing] = board["standings"]
        assert (standing["name"], standing["score"], standing["submissions"]) == (
            "student2",
            first["score"],
            2,
        )
        assert standing["best"]["weights"] == done["record"]["weights"]
        assert standing["best"]["stack"] == "pytorch"
        teams = member.call("GET", "api/kits/digits/leaderboard?cohort=cs-101&by=team").json()
        assert [s["name"] for s in teams["standings"]] == ["blue"]

        page = member.call("GET", "leaderboards?kit=digits&cohort=cs-101")
        assert page.status_code == 200, page.text
        assert '<tr data-name="student2">' in page.text
        assert f"{first['score']:.4f}" in page.text
        assert member.call("GET", "leaderboards?cohort=cs-101").status_code == 200
        assert outsider.call("GET", "leaderboards?kit=digits&cohort=cs-101").status_code == 403
        closed = outsider.call("GET", "api/kits/digits/leaderboard?cohort=cs-101")
        assert closed.status_code == 403, closed.text
        assert outsider.call("GET", "api/kits/digits/leaderboard").json()["standings"] == []

        garbage = {"model": base64.b64encode(b"not a model").decode(), "record": {}}
        for path, body, status, words in [
            ("api/kits/digits/submissions", garbage, 400, "not a TorchScript model"),
            ("api/kits/mnist/submissions", garbage, 404, "No starter kit 'mnist'"),
            ("api/kits/digits/submissions", {**garbage, "team": "<b>"}, 400, "team must be"),
            ("api/kits/digits/submissions", {**garbage, "cohort": "vision-lab"}, 403, "not in"),
        ]:
            refused = member.call("POST", path, json=body)
            assert refused.status_code == status, refused.text
            assert words in refused.json()["message"]
        after = member.call("GET", "api/kits/digits/leaderboard?cohort=cs-101").json()
        assert after["standings"][0]["submissions"] == 2  # nothing refused was kept
    finally:
        hub.stop("student2")
        assert admin.call("DELETE", "api/cohorts/cs-101").status_code == 204
