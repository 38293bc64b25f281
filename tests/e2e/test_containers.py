"""The demo hub with notebooks in containers (``compose-podman``): spawned from the form's
API, JupyterLab and its kernels run from the stack's image by digest, the run manifest
names that digest, and the stop leaves no container.

The images are ``make images``' (the CPU variants), pulled from the registry on
loopback by digest. Runs rootful podman, under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import json
import pwd
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from harness import images
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for
from harness.sshhosts import SSHHosts, ssh_hosts
from tests.support.kernel import run_in_kernel

PODMAN = "/usr/bin/podman"
pytestmark = [pytest.mark.e2e, pytest.mark.containers, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def built() -> dict[str, images.BuiltImage]:
    found = images.built()
    assert {"pytorch-cpu", "tensorflow-cpu"} <= set(found), "run make images"
    return found


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory, built: dict[str, images.BuiltImage]
) -> Iterator[Hub]:
    stack_images = {stack: built[f"{stack}-cpu"].by_digest for stack in images.STACKS}
    config = (
        'c.JupyterHub.spawner_class = "compose-podman"\n'
        f"c.PodmanLauncher.stack_images = {stack_images!r}\n"
        'c.PodmanLauncher.stack_variant = "cpu"\n'
    )
    podman = {k: v for k, v in images.podman_env().items() if k.startswith("CONTAINERS")}
    with (
        images.registry(),
        running_hub(tmp_path_factory.mktemp("containers"), config, **podman) as hub,
    ):
        yield hub


INSIDE = """
import json, os, sys, torch
manifest = json.load(open(os.environ["COMPOSE_RUN_MANIFEST"]))
print(json.dumps({
    "prefix": sys.prefix,
    "uid": os.getuid(),
    "pid1": open("/proc/1/cmdline").read().split("\\0")[0],
    "image": os.environ["COMPOSE_STACK_IMAGE"],
    "manifest_image": manifest["stack"]["image"] + "@" + manifest["stack"]["image_digest"],
    "torch": torch.__version__,
}))
"""


def seen_in_lab(hub: Hub, user: str, token: str) -> dict[str, Any]:
    """What ``INSIDE`` says from a kernel of ``user``'s server, once JupyterLab answers."""
    lab = requests.get(
        f"{hub.url}/user/{user}/lab", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert lab.status_code == 200
    assert "JupyterLab" in lab.text
    done = run_in_kernel(f"{hub.url}/user/{user}/", token, INSIDE, timeout=180)
    assert done.error is None, done.error
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_notebook_runs_in_its_stacks_image_and_its_container_goes_with_it(
    hub: Hub, built: dict[str, images.BuiltImage]
) -> None:
    image = built["pytorch-cpu"].by_digest
    response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "stack": "pytorch"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1", timeout=180)
    assert len(images.notebook_containers()) == 1
    token = process_env(notebook_pid(hub, "student1"))["JUPYTERHUB_API_TOKEN"]
    seen = seen_in_lab(hub, "student1", token)
    assert seen["prefix"] == "/opt/stack/venv"  # the image's, not the host's
    assert seen["uid"] == pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT).pw_uid
    assert seen["pid1"] == "/run/podman-init"  # its own pid namespace, podman's init first
    assert seen["image"] == seen["manifest_image"] == image
    assert seen["torch"].startswith("2.")
    hub.stop("student1")
    hub.wait_gone("student1")
    assert wait_for(
        lambda: images.notebook_containers() == [] or None, 60, "the container to be removed"
    )


@pytest.fixture(scope="module")
def ssh_hub(
    tmp_path_factory: pytest.TempPathFactory, built: dict[str, images.BuiltImage]
) -> Iterator[tuple[Hub, SSHHosts]]:
    """The demo hub on compose-ssh, whose hosts' agents run notebooks in containers."""
    stack_images = {stack: built[f"{stack}-cpu"].by_digest for stack in images.STACKS}
    podman = [f"{k}={v}" for k, v in images.podman_env().items() if k.startswith("CONTAINERS")]
    agents = {"runtime": "containers", "podman_command": ["/usr/bin/env", *podman, PODMAN]}
    with (
        images.registry(),
        ssh_hosts(tmp_path_factory.mktemp("hosts"), agent_settings=agents) as hosts,
        running_hub(
            tmp_path_factory.mktemp("ssh-containers"),
            hosts.hub_config()
            + 'c.SSHLauncher.host_runtime = "containers"\n'
            + f"c.SSHLauncher.stack_images = {stack_images!r}\n"
            + 'c.SSHLauncher.stack_variant = "cpu"\n',
        ) as hub,
    ):
        yield hub, hosts


def test_a_hosts_agent_runs_the_notebook_in_its_stacks_image_over_ssh(
    ssh_hub: tuple[Hub, SSHHosts], built: dict[str, images.BuiltImage]
) -> None:
    hub, hosts = ssh_hub
    image = built["pytorch-cpu"].by_digest
    response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1, "stack": "pytorch"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1", timeout=180)
    found = hosts.notebook("student1")
    assert found is not None, "no notebook of student1 on any host"
    host, record = found
    assert images.notebook_containers() == [record["container"]]
    # Its environment is the container's (podman's own process has none of it).
    inspected = json.loads(images.podman("inspect", record["container"], timeout=60))[0]
    env = dict(item.partition("=")[::2] for item in inspected["Config"]["Env"])
    seen = seen_in_lab(hub, "student1", env["JUPYTERHUB_API_TOKEN"])
    assert seen["prefix"] == "/opt/stack/venv"
    assert seen["uid"] == pwd.getpwnam("student1").pw_uid  # the user's own account
    assert seen["pid1"] == "/run/podman-init"
    assert seen["image"] == seen["manifest_image"] == image
    hub.stop("student1")
    hub.wait_gone("student1")
    assert hosts.records(host.host_id) == []
    assert images.notebook_containers() == []
