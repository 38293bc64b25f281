"""What podman is told for a notebook's container (composespawner.launchers.containers)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from composespawner.domain.catalog import Catalog, Stack
from composespawner.domain.hardware import Share
from composespawner.launchers import stack_images
from composespawner.launchers.containers import (
    ContainerSpec,
    ContainerSpecError,
    cdi_devices,
    container_name,
    create_body,
    forwarded_names,
    image_command,
    image_for,
    notebook_listens_everywhere,
    run_arguments,
)
from composespawner.launchers.gpu_devices import device_nodes
from composespawner.launchers.relay import HubRelays
from composespawner.launchers.relayed import inside_command, loopback_addresses
from composespawner.launchers.stack_images import StackImages
from harness.paths import HUB_CONFIG

pytestmark = pytest.mark.timeout(10)

IMAGE = "registry.example/composespawner/pytorch@sha256:" + "ab" * 32


def spec(**changes: object) -> ContainerSpec:
    base: dict[str, object] = {
        "name": "composespawner-ada-0123456789ab",
        "image": IMAGE,
        "uid": 1001,
        "gid": 1001,
        "home": "/home/ada",
        "port": 45001,
        "command": ("jupyterhub-singleuser",),
        "environment": ("JUPYTERHUB_API_TOKEN",),
        "share": Share(cores=2, memory_gib=8),
        "pids": 2048,
        "devices": ("/dev/nvidia3", "/dev/nvidiactl"),
    }
    return ContainerSpec(**{**base, **changes})  # type: ignore[arg-type]


def option(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == name]


def test_the_container_is_held_to_its_share_and_runs_as_the_user_without_privileges() -> None:
    args = run_arguments(spec())
    assert args[:2] == ["run", "--rm"]
    assert option(args, "--user") == ["1001:1001"]
    assert option(args, "--cpus") == ["2"]
    assert option(args, "--memory") == option(args, "--memory-swap") == [str(8 << 30)]
    assert option(args, "--pids-limit") == ["2048"]
    assert option(args, "--shm-size") == [str(8 << 30)]
    assert option(args, "--tmpfs") == [f"/tmp:rw,nosuid,nodev,mode=1777,size={8 << 30}"]
    assert option(args, "--cap-drop") == ["all"]
    assert option(args, "--security-opt") == ["no-new-privileges"]
    assert {"--init", "--read-only", "--read-only-tmpfs=false"} <= set(args)
    assert option(args, "--device") == ["/dev/nvidia3", "/dev/nvidiactl"]
    assert option(args, "--volume") == ["/home/ada:/home/ada:rw"]
    assert option(args, "--workdir") == ["/home/ada"]
    assert option(args, "--publish") == ["127.0.0.1:45001:45001"]
    assert option(args, "--network") == ["slirp4netns:allow_host_loopback=false"]
    assert args[-2:] == [IMAGE, "jupyterhub-singleuser"]


def test_the_token_goes_by_name_never_on_the_command_line() -> None:
    args = run_arguments(spec())
    assert option(args, "--env") == ["JUPYTERHUB_API_TOKEN", "HOME=/home/ada"]
    names = forwarded_names(
        {
            **{"JUPYTERHUB_API_TOKEN": "secret", "PATH": "/usr/bin", "VIRTUAL_ENV": "/x"},
            **{"A B": "1", "HOME": "/home/ada"},
        }
    )
    assert names == ("JUPYTERHUB_API_TOKEN",)


def test_the_home_is_given_by_value_and_an_env_file_by_path() -> None:
    """Podman's own HOME stays root's: the container's comes from the spec, never from
    podman's environment (where a user's ~/.config would be read by root)."""
    args = run_arguments(replace(spec(), env_file="/var/lib/agent/m1.env"))
    assert option(args, "--env-file") == ["/var/lib/agent/m1.env"]
    assert "HOME=/home/ada" in option(args, "--env")


def test_a_container_without_a_share_has_no_cpu_or_memory_limit_but_its_pids() -> None:
    args = run_arguments(spec(share=None))
    assert option(args, "--memory") == option(args, "--cpus") == []
    assert option(args, "--pids-limit") == ["2048"]


def test_podmans_api_is_told_what_its_command_line_is() -> None:
    """The API's body holds the same limits and isolation as run_arguments: the share,
    the pids, private /tmp and /dev/shm in the memory, no capabilities, podman's init,
    the image read-only without tmpfs of podman's own, the network without loopback."""
    body = create_body(spec(), {"JUPYTERHUB_API_TOKEN": "secret", "PATH": "/usr/bin"})
    assert body["user"] == "1001:1001"
    assert body["userns"] == {"nsmode": "host"}
    assert body["resource_limits"] == {
        "cpu": {"quota": 200_000, "period": 100_000},
        "memory": {"limit": 8 << 30, "swap": 8 << 30},
        "pids": {"limit": 2048},
    }
    assert body["shm_size"] == 8 << 30
    tmp = [m for m in body["mounts"] if m["destination"] == "/tmp"]
    assert tmp == [
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["rw", "nosuid", "nodev", "mode=1777", f"size={8 << 30}"],
        }
    ]
    assert (body["cap_drop"], body["no_new_privileges"], body["init"]) == (["all"], True, True)
    assert (body["read_only_filesystem"], body["read_write_tmpfs"]) == (True, False)
    assert body["devices"] == [{"path": "/dev/nvidia3"}, {"path": "/dev/nvidiactl"}]
    assert body["netns"] == {"nsmode": "slirp4netns"}
    assert body["network_options"] == {"slirp4netns": ["allow_host_loopback=false"]}
    assert body["portmappings"] == [
        {"host_ip": "127.0.0.1", "host_port": 45001, "container_port": 45001}
    ]
    home = {"destination": "/home/ada", "type": "bind", "source": "/home/ada"}
    assert body["mounts"][0] == {**home, "options": ["rbind", "rw"]}
    assert body["work_dir"] == "/home/ada"
    assert body["image"] == IMAGE
    assert body["command"] == ["jupyterhub-singleuser"]
    # The forwarded names' values (the host's PATH is not one), and the user's HOME.
    assert body["env"] == {"JUPYTERHUB_API_TOKEN": "secret", "HOME": "/home/ada"}
    assert "remove" not in body  # the launcher reads its exit status, then removes it


def test_the_api_body_of_a_container_without_a_share_keeps_its_pids() -> None:
    body = create_body(spec(share=None, network="none"), {})
    assert body["resource_limits"] == {"pids": {"limit": 2048}}
    assert body["shm_size"] == 1 << 30
    assert body["netns"] == {"nsmode": "none"}
    assert body["network_options"] == {}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"image": "composespawner/pytorch:latest"}, "by digest"),
        ({"port": 0}, "port"),
        ({"uid": 0}, "root"),
        ({"env_file": "/var/lib/agent/m1.env"}, "environment file"),
    ],
)
def test_what_the_api_cannot_be_told_is_refused(changes: dict[str, object], says: str) -> None:
    with pytest.raises(ContainerSpecError, match=says):
        create_body(spec(**changes), {})


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"image": "composespawner/pytorch:latest"}, "by digest"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"uid": 0}, "root"),
        ({"pull": "always"}, "pull policy"),
    ],
)
def test_what_cannot_be_run_is_refused(changes: dict[str, object], says: str) -> None:
    with pytest.raises(ContainerSpecError, match=says):
        run_arguments(spec(**changes))


def test_names_are_what_podman_takes_and_new_at_each_start() -> None:
    names = {
        container_name("ada", "", "t1"),
        container_name("ada", "", "t2"),
        container_name("Ada@Uni", "<b>x</b>", "t1"),
        container_name("ada-", "", "t1"),
        container_name("ada", "-", "t1"),
    }
    assert len(names) == 5
    for name in names:
        assert name.startswith("composespawner-")
        assert all(c.isalnum() or c in "_.-" for c in name), name
    assert container_name("@@", "", "t").startswith("composespawner-")


def test_the_notebook_binds_every_address_of_its_own_network() -> None:
    assert (
        notebook_listens_everywhere("http://127.0.0.1:45001/user/ada/")
        == "http://0.0.0.0:45001/user/ada/"
    )
    assert notebook_listens_everywhere("https://[::1]:9/u/") == "https://0.0.0.0:9/u/"
    with pytest.raises(ContainerSpecError):
        notebook_listens_everywhere("not a url")


def test_the_site_setting_wins_and_only_a_digest_names_an_image() -> None:
    assert image_for({"pytorch": IMAGE}, "pytorch", "other@sha256:1") == IMAGE
    assert image_for({}, "pytorch", IMAGE) == IMAGE
    assert image_for({}, "pytorch", "") is None
    assert image_for({"pytorch": "composespawner/pytorch:latest"}, "pytorch", "") is None


def test_gpus_by_cdi_name_or_by_their_nodes(tmp_path: Path) -> None:
    assert cdi_devices(("GPU-aa", "GPU-bb")) == ("nvidia.com/gpu=GPU-aa", "nvidia.com/gpu=GPU-bb")
    dev = tmp_path
    (dev / "nvidiactl").touch()
    assert device_nodes([3, 1, 3], dev) == (
        str(dev / "nvidia1"),
        str(dev / "nvidia3"),
        str(dev / "nvidiactl"),
    )
    assert device_nodes([], dev) == ()


def test_only_the_hubs_loopback_services_are_relayed() -> None:
    urls = (
        "http://127.0.0.1:8081/hub/api",
        "http://localhost:8002/services/compose/",
        "https://hub.example.edu/hub/api",  # reached as the host reaches it
        "http://[::1]:8081/hub/api",
        "http://127.0.0.1:8081/hub/api/users/ada/activity",
        "",
        "not a url",
    )
    assert loopback_addresses(urls) == (("127.0.0.1", 8002), ("127.0.0.1", 8081), ("::1", 8081))


def test_the_relay_runs_first_and_then_the_notebooks_command() -> None:
    command = inside_command(Path("/run/relay"), [("127.0.0.1", 8081)], ["jupyterhub-singleuser"])
    assert command[:4] == ["python", "-I", "-S", "-c"]
    assert "def carry(" in command[4]
    assert command[5:] == [
        "127.0.0.1:8081=/run/relay/127.0.0.1-8081.sock",
        "--",
        "jupyterhub-singleuser",
    ]


async def test_starts_at_once_share_one_relay_socket_that_carries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A class starting at once asks for the hub's socket 40 times: one is made, and a
    connection through it reaches the service behind it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hub:" + await reader.readline())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    caplog.set_level(logging.INFO, logger="composespawner.launchers.relay")
    service = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = service.sockets[0].getsockname()[1]
    try:
        await asyncio.gather(*(HubRelays.serve(tmp_path, [("127.0.0.1", port)]) for _ in range(40)))
        (made,) = await asyncio.to_thread(lambda: list(tmp_path.iterdir()))
        assert sum(r.getMessage().startswith("serving") for r in caplog.records) == 1
        reader, writer = await asyncio.open_unix_connection(str(made))
        writer.write(b"ping\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"hub:ping\n"
        writer.close()
        await writer.wait_closed()
    finally:
        await HubRelays.stop()
        service.close()
        await service.wait_closed()


def test_the_configured_notebook_server_is_the_images_own_and_another_command_stays() -> None:
    host = ["/opt/composespawner/venv/bin/jupyterhub-singleuser", "--debug"]
    assert image_command(host) == ["jupyterhub-singleuser", "--debug"]
    assert image_command(["/usr/bin/env", "python", "-I"]) == ["/usr/bin/env", "python", "-I"]


def demo_stack(stack_id: str) -> Stack:
    stack = Catalog.from_file(HUB_CONFIG / "catalog.toml").stack(stack_id)
    assert stack is not None
    return stack


def test_an_image_recorded_after_the_hub_started_is_run_at_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytorch = demo_stack("pytorch")
    record = tmp_path / "images.json"
    images = StackImages(stack_variant="cpu", stack_images_file=str(record))
    assert images.image_of(pytorch) is None  # nothing built, nor named in the catalog
    built = "127.0.0.1:5000/composespawner/pytorch-cpu@sha256:" + "b" * 64
    entry = {"stack": "pytorch", "variant": "cpu", "image": built}
    record.write_text(json.dumps({"pytorch-cpu": entry}))
    assert images.image_of(pytorch) == built
    images.stack_images = {"pytorch": IMAGE}  # the site's own setting comes first
    assert images.image_of(pytorch) == IMAGE
    images.stack_images = {}
    rebuilt = built.replace("b" * 64, "c" * 64)
    partial = tmp_path / ".images.json.partial"  # as harness.images writes it: whole
    partial.write_text(json.dumps({"pytorch-cpu": {**entry, "image": rebuilt}}))
    os.replace(partial, record)
    assert images.image_of(pytorch) == rebuilt
    record.write_text("{not json")
    assert images.image_of(pytorch) is None
    assert "cannot read the images' record" in caplog.text


def test_an_unchanged_images_record_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytorch = demo_stack("pytorch")
    record = tmp_path / "images.json"
    built = "127.0.0.1:5000/composespawner/pytorch-cpu@sha256:" + "b" * 64
    record.write_text(json.dumps({"p": {"stack": "pytorch", "variant": "cpu", "image": built}}))
    parsed = []
    real = stack_images.images_in_record
    monkeypatch.setattr(stack_images, "images_in_record", lambda *a: parsed.append(1) or real(*a))
    images = StackImages(stack_variant="cpu", stack_images_file=str(record))
    for _ in range(3):  # a start's checks, its time and its launch
        assert images.image_of(pytorch) == built
    assert len(parsed) == 1


CLIENT = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as hub:
    hub.sendall(b"ping\\n")
    print(hub.makefile().readline().strip())
sys.exit(7)
"""


def test_the_relay_carries_the_hubs_service_to_the_notebook_and_ends_with_its_status(
    tmp_path: Path,
) -> None:
    """relay_inside, run as the container runs it (by path-less source, without site):
    the notebook's connection to the hub's loopback address reaches the hub's socket,
    and the notebook's exit status is the relay's."""
    path = tmp_path / "hub.sock"
    with socket.socket(socket.AF_UNIX) as hub:
        hub.bind(str(path))
        hub.listen()

        def answer() -> None:
            conn, _ = hub.accept()
            with conn:
                conn.sendall(b"hub:" + conn.makefile("rb").readline())

        answering = threading.Thread(target=answer)
        answering.start()
        port = free_port()
        command = inside_command(tmp_path, [], [sys.executable, "-I", "-c", CLIENT, str(port)])
        command[0] = sys.executable
        command.insert(5, f"127.0.0.1:{port}={path}")
        done = subprocess.run(command, capture_output=True, timeout=8, check=False)
        answering.join(timeout=5)
    assert done.stdout.decode().strip() == "hub:ping", done.stderr.decode()
    assert done.returncode == 7


def test_the_relay_passes_a_stop_on_to_the_notebook() -> None:
    ready = "import signal, sys; print('up', flush=True); signal.pause()"
    command = inside_command(Path("/nowhere"), [], [sys.executable, "-I", "-c", ready])
    command[0] = sys.executable
    with subprocess.Popen(command, stdout=subprocess.PIPE) as relay:
        assert relay.stdout is not None
        assert relay.stdout.readline() == b"up\n"
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=5) == 128 + signal.SIGTERM  # the notebook's end, as a shell says


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
