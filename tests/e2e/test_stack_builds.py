"""A stack's environment is built by the first start on it, with progress, and shared after.

The hub here offers a small stack made on the spot (one wheel, a hashed lock),
so the build is real (venv, pip with hashes, manifest) and takes seconds; the
notebook is the stand-in server, started by the bare name ``python``, which only
the stack's environment on the notebook's PATH can answer to. (The stack's
``jupyterhub`` is a made wheel of metadata alone: the stand-in reads its version.)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from composespawner.ledger import Ledger
from harness.hub import HUB_CONFIG, Hub, notebook_pid, process_env, running_hub
from harness.paths import ROOT
from tests.support.stacks import COMMON, make_lock

pytestmark = pytest.mark.e2e
STANDIN = ROOT / "benchmarks" / "standin_notebook.py"
BUILDING = "building the Tiny 1.0 stack (first use; cached after)"


def catalog_with_stacks(folder: Path) -> Path:
    """The demo's catalog with its stacks swapped for a good small one and a tampered one."""
    demo = (HUB_CONFIG / "catalog.toml").read_text()
    # The stand-in notebook answers with the hub's version, read from package metadata.
    good = make_lock(folder, also=(("jupyterhub", version("jupyterhub")),))
    (folder / "tampered").mkdir()
    tampered = make_lock(folder / "tampered")
    pinned = hashlib.sha256(tampered.read_bytes()).hexdigest()
    tampered.write_text(tampered.read_text() + "# changed after the catalog pinned it\n")
    text = demo[: demo.index("[[stacks]]")].replace(
        'stack_common = "../images/common"', f'stack_common = "{COMMON}"'
    )
    text += f"""
[[stacks]]
id = "tiny"
label = "Tiny 1.0"
cpu = {{ lock = "{good}", lock_sha256 = "{hashlib.sha256(good.read_bytes()).hexdigest()}" }}
[stacks.env]
PYTHONHASHSEED = "0"
TINY_DETERMINISTIC = "1"

[[stacks]]
id = "tampered"
label = "Tampered"
cpu = {{ lock = "{tampered}", lock_sha256 = "{pinned}" }}
"""
    path = folder / "catalog.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("stack-builds")
    # The build account reads the wheels, the notebook account the environments:
    # outside pytest's closed tmp folders.
    shared = Path(tempfile.mkdtemp(prefix="composespawner-stacks-"))
    shared.chmod(0o755)
    (shared / "source").mkdir(mode=0o755)
    catalog = catalog_with_stacks(shared / "source")
    environments = shared / "environments"
    config = (
        f"c.ComposeSpawner.catalog_file = {str(catalog)!r}\n"
        f"c.ComposeSpawner.stack_environments_dir = {str(environments)!r}\n"
    )
    try:
        with running_hub(tmp, config, COMPOSE_NOTEBOOK_CMD=f"python -I {STANDIN}") as hub:
            yield hub
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.timeout(180)
def test_the_first_start_builds_with_progress_and_the_next_waits_for_nothing(hub: Hub) -> None:
    response, events = hub.spawn_watching("student1", {"gpu_model": "t4", "gpu_count": 1})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    building = [e["message"] for e in events if e["message"].startswith(BUILDING)]
    assert building[-1] == f"{BUILDING}: 100%", events
    percents = [int(m.rsplit(" ", 1)[1].rstrip("%")) for m in building]
    assert percents == sorted(percents)
    assert len(percents) >= 3

    env = process_env(notebook_pid(hub, "student1"))
    assert env["COMPOSE_STACK"] == "tiny"
    assert (env["PYTHONHASHSEED"], env["TINY_DETERMINISTIC"]) == ("0", "1")
    root = Path(env["VIRTUAL_ENV"])
    assert env["PATH"].split(":")[0] == str(root / "bin")
    assert root.stat().st_uid == 0  # built as the build account, then made root's alone
    manifest = json.loads(Path(env["COMPOSE_STACK_MANIFEST"]).read_text())
    assert manifest["lock_sha256"] == env["COMPOSE_STACK_LOCK_SHA256"]
    assert manifest["packages"]["tiny"] == "1.0"

    # A start on a built stack is over too fast to watch: the hub's log says what it did.
    response = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student2")
    assert process_env(notebook_pid(hub, "student2"))["VIRTUAL_ENV"] == str(root)
    assert hub.log_path.read_text().count("Built the tiny stack in") == 1
    hub.stop("student1")
    hub.stop("student2")


@pytest.mark.timeout(120)
def test_a_stack_whose_lock_changed_is_refused_and_nothing_is_held(
    hub: Hub, ledger: Ledger
) -> None:
    options = {"gpu_model": "t4", "gpu_count": 1, "stack": "tampered"}
    response = hub.spawn("researcher1", options)
    assert response.status_code == 503, response.text
    message = response.json()["message"]
    assert "Tampered stack's lock" in message
    assert "An administrator puts the new hash in the catalog" in message
    assert ledger.live_machines("researcher1") == []
    assert ledger.holders() == {}
    assert hub.composed_hosts() == {}
