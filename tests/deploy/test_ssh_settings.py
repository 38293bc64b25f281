"""The production config's compose-ssh settings, as the Ansible role writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_production_config import load

pytestmark = pytest.mark.timeout(60)

SSH = {
    "COMPOSE_SPAWNER": "compose-ssh",
    "COMPOSE_SSH_KEY": "/etc/composespawner/ssh/id_ed25519",
    "COMPOSE_SSH_KNOWN_HOSTS": "/etc/composespawner/ssh/known_hosts",
}


def test_the_hosts_table_keys_and_the_hub_api_on_the_hosts_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load(
        tmp_path,
        monkeypatch,
        **SSH,
        COMPOSE_SSH_HOSTS="host-1=10.0.0.11:22, host-2=10.0.0.12:2222,host-3=[fd00::3]:22",
        COMPOSE_HUB_API_IP="10.0.0.2",
        COMPOSE_SSH_MAX_SESSIONS="64",
    )
    assert config.JupyterHub.spawner_class == "compose-ssh"
    assert config.SSHLauncher.max_sessions == 64
    assert config.SSHLauncher.hosts == {
        "host-1": "10.0.0.11:22",
        "host-2": "10.0.0.12:2222",
        "host-3": "[fd00::3]:22",
    }
    assert config.SSHLauncher.ssh_key == SSH["COMPOSE_SSH_KEY"]
    assert config.SSHLauncher.known_hosts == SSH["COMPOSE_SSH_KNOWN_HOSTS"]
    assert config.JupyterHub.hub_ip == "10.0.0.2"
    assert "hub_connect_url" not in config.JupyterHub
    assert "create_system_users" not in config.CampusAuthenticator  # the agents make them


def test_a_hub_api_the_hosts_cannot_reach_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="notebooks on host-2 cannot reach the hub's API"):
        load(tmp_path, monkeypatch, **SSH, COMPOSE_SSH_HOSTS="host-1=127.0.1.1,host-2=10.0.0.12")
    # Hosts on this machine's loopback (the tests'), or a URL the hosts do reach: taken.
    on_loopback = load(tmp_path, monkeypatch, **SSH, COMPOSE_SSH_HOSTS="host-1=127.0.1.1:2201")
    assert on_loopback.JupyterHub.hub_ip == "127.0.0.1"
    connect = "http://hub.cluster.example.edu:8081"
    behind_a_name = load(
        tmp_path,
        monkeypatch,
        **SSH,
        COMPOSE_SSH_HOSTS="host-2=10.0.0.12",
        COMPOSE_HUB_CONNECT_URL=connect,
    )
    assert behind_a_name.JupyterHub.hub_connect_url == connect


@pytest.mark.parametrize("table", ["", "host-1", "host-1=10.0.0.11,=10.0.0.12"])
def test_a_malformed_hosts_table_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    with pytest.raises(SystemExit, match="COMPOSE_SSH_HOSTS"):
        load(tmp_path, monkeypatch, **SSH, COMPOSE_SSH_HOSTS=table)


def test_compose_ssh_needs_its_key_and_known_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for missing in ("COMPOSE_SSH_KEY", "COMPOSE_SSH_KNOWN_HOSTS", "COMPOSE_SSH_HOSTS"):
        settings = {**SSH, "COMPOSE_SSH_HOSTS": "host-1=127.0.1.1"}
        del settings[missing]
        with pytest.raises(SystemExit, match=f"set {missing}"):
            load(tmp_path, monkeypatch, **settings)


IMAGE = "registry.example.edu/cs/pytorch-gpu@sha256:" + "a" * 64


def test_notebooks_run_in_their_stacks_images_unless_the_site_says_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = {**SSH, "COMPOSE_SSH_HOSTS": "host-1=127.0.1.1"}
    contained = load(tmp_path, monkeypatch, **hosts, COMPOSE_STACK_IMAGES=f"pytorch = {IMAGE},")
    assert contained.SSHLauncher.host_runtime == "containers"
    assert contained.SSHLauncher.stack_variant == "gpu"
    assert contained.SSHLauncher.stack_images == {"pytorch": IMAGE}
    processes = load(tmp_path, monkeypatch, **hosts, COMPOSE_HOST_RUNTIME="process")
    assert processes.SSHLauncher.host_runtime == "process"
    assert "stack_images" not in processes.SSHLauncher


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"COMPOSE_HOST_RUNTIME": "docker"}, "COMPOSE_HOST_RUNTIME is 'docker'"),
        ({"COMPOSE_STACK_IMAGES": "pytorch=cs/pytorch:latest"}, "COMPOSE_STACK_IMAGES"),
        ({"COMPOSE_STACK_IMAGES": f"={IMAGE}"}, "COMPOSE_STACK_IMAGES"),
    ],
)
def test_a_wrong_runtime_or_image_table_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], says: str
) -> None:
    with pytest.raises(SystemExit, match=says):
        load(tmp_path, monkeypatch, **SSH, COMPOSE_SSH_HOSTS="host-1=127.0.1.1", **settings)
