"""The stacks' CPU images as ``make images`` built them here: up to date with their inputs,
pulled by digest from the registry, holding their lock, manifest and notebook side,
running as the notebook user, and reproducible (the installed tree repeats).

``make test`` runs ``make images`` first (cached by inputs: seconds when warm). Runs
podman as root, under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from composespawner.domain.catalog import Catalog
from harness import images
from harness.paths import HUB_CONFIG
from tests.support.kits import CATALOG, KITS, last_line_hash, run_kit
from tests.support.stacks import make_lock

pytestmark = [pytest.mark.timeout(300), pytest.mark.containers]


@pytest.fixture(scope="module")
def built() -> dict[str, images.BuiltImage]:
    found = images.built()
    missing = [f"{stack}-cpu" for stack in images.STACKS if f"{stack}-cpu" not in found]
    assert not missing, f"no image built for {missing}: run make images"
    return found


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    with images.registry() as address:
        yield address


def run_in(image: str, *command: str) -> str:
    return images.podman("run", "--rm", "--network", "none", image, *command, timeout=120)


@pytest.mark.parametrize("stack", images.STACKS)
def test_each_image_is_built_from_the_inputs_checked_in(
    built: dict[str, images.BuiltImage], stack: str
) -> None:
    image = built[f"{stack}-cpu"]
    base = f"localhost/composespawner/base:{images.base_inputs()[:16]}"
    assert image.inputs == images.stack_inputs(stack, "cpu", base), "run make images"
    assert images.image_exists(image.tag)
    label = images.podman(
        "image", "inspect", "--format", '{{index .Labels "io.composespawner.inputs"}}', image.tag
    )
    assert label.strip() == image.inputs


@pytest.mark.parametrize("stack", images.STACKS)
def test_the_image_pulled_by_its_digest_is_the_one_built(
    built: dict[str, images.BuiltImage], registry: str, stack: str
) -> None:
    image = built[f"{stack}-cpu"]
    assert image.by_digest.startswith(f"{registry}/composespawner/{stack}-cpu@sha256:")
    pulled = images.podman("pull", "--tls-verify=false", "--quiet", image.by_digest).strip()
    local = images.podman("image", "inspect", "--format", "{{.Id}}", image.tag).strip()
    assert pulled == local


@pytest.mark.parametrize("stack", images.STACKS)
def test_the_image_holds_its_lock_manifest_and_notebook_side_as_the_notebook_user(
    built: dict[str, images.BuiltImage], stack: str
) -> None:
    image = built[f"{stack}-cpu"]
    catalog = Catalog.from_file(HUB_CONFIG / "catalog.toml")
    (entry,) = [s for s in catalog.stacks if s.id == stack]
    assert entry.cpu is not None
    manifest = json.loads(run_in(image.tag, "cat", "/opt/stack/manifest.json"))
    assert (manifest["stack"], manifest["variant"]) == (stack, "cpu")
    assert manifest["lock_sha256"] == entry.cpu.lock_sha256
    assert manifest["framework"]["built_with_cuda"] is None
    said = run_in(
        image.tag,
        "sh",
        "-c",
        "id -u; command -v jupyterhub-singleuser;"
        " python -c 'import composespawner.client, repro, composespawner_lab';"
        " head -1 /opt/stack/base-packages.txt",
    ).split("\n")
    assert said[0] == "1000"
    assert said[1] == "/opt/stack/venv/bin/jupyterhub-singleuser"
    assert said[2].split()[0] in ("adduser", "apt", "base-files")  # the base's dpkg list


# A tiny stack on the same base, built twice as make images builds (no layer reused):
# the same inputs give the same image, to its ID, as the stacks' images do.
TINY = """\
ARG BASE
FROM ${BASE}
ARG SOURCE_DATE_EPOCH
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
COPY requirements-cpu.lock /opt/stack/requirements.lock
RUN python3 -m venv /opt/stack/venv \\
 && /opt/stack/venv/bin/pip install --no-cache-dir --no-deps --require-hashes \\
        -r /opt/stack/requirements.lock
"""


def test_two_builds_from_the_same_inputs_are_the_same_image(tmp_path: Path) -> None:
    base = images.build_base()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_lock(wheels)
    lock = (wheels / "requirements-cpu.lock").read_text().replace(str(wheels), "/wheels")
    (tmp_path / "requirements-cpu.lock").write_text(lock)
    (tmp_path / "Dockerfile").write_text(TINY)
    tags = [f"localhost/composespawner/test-tiny:{n}" for n in ("one", "two")]
    try:
        for tag in tags:
            images.reproducible_build(
                tag,
                tmp_path / "Dockerfile",
                tmp_path,
                wheels,
                {"BASE": base},
                "1700000000",
                cache=False,
            )
        ids = [images.podman("image", "inspect", "--format", "{{.Id}}", t).strip() for t in tags]
        assert ids[0] == ids[1]
        assert images.tree_sha256(tags[0]) == images.tree_sha256(tags[1])
        said = run_in(
            tags[0], "/opt/stack/venv/bin/python", "-c", "import tiny; print(tiny.VERSION)"
        )
        assert said.strip() == "1.0"
    finally:
        images.podman("rmi", "--force", *tags)


def kit_in_image(image: str, folder: Path, env: dict[str, str]) -> str:
    """The digits kit run headless in ``image`` with no network, as the notebook user in
    a folder of its own: the weights hash its last cell prints."""
    shutil.copytree(KITS / "digits", folder)
    for path in (folder, *folder.rglob("*")):
        os.chown(path, 1000, 1000)
    images.podman(
        *("run", "--rm", "--network", "none", "-v", f"{folder}:/home/jovyan/work"),
        *("-w", "/home/jovyan/work"),
        *(arg for name, value in env.items() for arg in ("-e", f"{name}={value}")),
        *(image, "jupyter", "nbconvert", "--to", "notebook", "--execute", "digits.ipynb"),
        *("--output", "executed.ipynb"),
        timeout=240,
    )
    return last_line_hash(nbformat.read(folder / "executed.ipynb", as_version=4))


@pytest.mark.timeout(600)
def test_the_digits_kit_gives_the_same_weights_in_the_image_twice_and_in_the_venv(
    built: dict[str, images.BuiltImage], tmp_path: Path
) -> None:
    stack = CATALOG.stack("pytorch")
    env = dict(stack.env)
    image = built["pytorch-cpu"].tag
    first = kit_in_image(image, tmp_path / "first", env)
    again = kit_in_image(image, tmp_path / "again", env)
    assert first == again
    venv = run_kit("digits", "digits.ipynb", tmp_path / "venv", stack, timeout=120, seed=0)
    assert venv.weights == first  # the image's Python is Debian's 3.11.2, the venv's another
