"""Where the demo's notebooks run (composespawner.commands.demo_runtime): containers where
podman runs them from built images, else processes, and always the reason said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from composespawner.commands.demo_runtime import RuntimeRefused, choose_runtime, stack_images
from composespawner.commands.supervise import demo_plan

pytestmark = pytest.mark.timeout(10)

IMAGES = {"pytorch": "127.0.0.1:5000/composespawner/pytorch-cpu@sha256:" + "a" * 64}
PODMAN = {"CONTAINERS_CONF": "/cache/containers.conf"}


def test_containers_where_podman_runs_the_built_images() -> None:
    runtime = choose_runtime("", IMAGES, None, PODMAN)
    assert runtime.name == "containers"
    assert "containers of their own" in runtime.said
    assert json.loads(runtime.env["COMPOSE_STACK_IMAGES"]) == IMAGES
    assert runtime.env["CONTAINERS_CONF"] == "/cache/containers.conf"
    plan = demo_plan({}, Path("/b"), [], runtime)
    assert plan.env["COMPOSE_RUNTIME"] == "containers"
    assert plan.said == runtime.said


@pytest.mark.parametrize(
    ("images", "problem", "because"),
    [
        ({}, None, "no stack image is built (make images)"),
        (IMAGES, "podman is not installed (make images installs it)", "podman is not installed"),
    ],
)
def test_processes_otherwise_saying_why(
    images: dict[str, str], problem: str | None, because: str
) -> None:
    runtime = choose_runtime("", images, problem, PODMAN)
    assert runtime.name == "processes"
    assert because in runtime.said
    assert runtime.env == {}
    with pytest.raises(RuntimeRefused, match=re.escape(because)):
        choose_runtime("containers", images, problem, PODMAN)


def test_the_choice_can_be_made_outright() -> None:
    assert choose_runtime("processes", IMAGES, None, PODMAN).name == "processes"
    with pytest.raises(RuntimeRefused, match="containers or processes"):
        choose_runtime("docker", IMAGES, None, PODMAN)
    assert demo_plan({}, Path("/b"), []).env["COMPOSE_RUNTIME"] == "processes"


def test_only_cpu_images_by_digest_are_taken_from_the_record() -> None:
    record = {
        "pytorch-cpu": {"stack": "pytorch", "variant": "cpu", "image": IMAGES["pytorch"]},
        "pytorch-gpu": {"stack": "pytorch", "variant": "gpu", "image": "x@sha256:1"},
        "tensorflow-cpu": {"stack": "tensorflow", "variant": "cpu", "tag": "local:1"},
        "junk": "text",
    }
    assert stack_images(record) == IMAGES
