"""What the SSH launcher sends a host's agent, and what it says when it cannot (pure parts)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import asyncssh
import pytest

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.domain.hardware import Device, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.agent_protocol import (
    Refused,
    StartNotebook,
    encode_request,
    parse_request,
)
from composespawner.launchers.ssh_requests import (
    host_key_problem,
    parse_address,
    request_env,
    start_request,
    unreachable,
)
from composespawner.launchers.stack_sources import stack_source

pytestmark = pytest.mark.timeout(10)


def gpu(n: int, uuid: str | None) -> Device:
    return Device(f"g{n}", "gpu", "NVIDIA T4", frozenset({"r"}), "r", "attached", uuid=uuid)


@pytest.mark.parametrize(
    ("where", "parsed"),
    [
        ("127.0.1.11", ("127.0.1.11", 22)),
        ("127.0.1.11:2201", ("127.0.1.11", 2201)),
        ("node7.example.edu", ("node7.example.edu", 22)),
        ("[fd00::7]:2222", ("fd00::7", 2222)),
        ("[fd00::7]", ("fd00::7", 22)),
        ("fd00::7", ("fd00::7", 22)),
    ],
)
def test_host_addresses(where: str, parsed: tuple[str, int]) -> None:
    assert parse_address(where) == parsed


@pytest.mark.parametrize("where", ["", ":22", "host:0", "host:70000", "host:ssh", "[fd00::7]x"])
def test_bad_host_addresses(where: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(where))):
        parse_address(where)


def test_the_env_leaves_out_what_the_agent_sets_refuses_or_only_the_hub_has() -> None:
    env = {
        "JUPYTERHUB_API_TOKEN": "t",
        "COMPOSE_GPUS": "[]",
        "PATH": "/usr/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "GPU-1",
        "NVIDIA_VISIBLE_DEVICES": "GPU-1",
        "LD_PRELOAD": "/tmp/evil.so",
        "LD_LIBRARY_PATH": "/x",
        "COMPOSE_AGENT_DEBUG": "1",
        "VIRTUAL_ENV": "/hub/venv",
        "COMPOSE_RUN_MANIFEST": "/hub/home/x.json",
    }
    assert request_env(env) == {"JUPYTERHUB_API_TOKEN": "t", "COMPOSE_GPUS": "[]"}


def test_a_start_names_the_machines_gpus_by_uuid_and_its_share() -> None:
    machine = ComposedMachine(
        "m-1", "host-1", "r", (gpu(1, "aa11bb22-0000"), gpu(2, "cc33dd44-0000")), None, ()
    )
    request = start_request(
        user="ada",
        server="lab",
        machine=machine,
        env={"A": "1", "PATH": "/x"},
        args=["--SingleUserNotebookApp.default_url=/lab"],
        share=Share(4, 32),
        stack=None,
        manifest={"user": "ada"},
    )
    assert request.gpus == ("GPU-aa11bb22-0000", "GPU-cc33dd44-0000")
    assert (request.cores, request.memory_gib) == (4, 32)
    assert request.env == (("A", "1"),)
    encode_request(request)  # as the agent will take it

    whole = start_request(
        user="ada",
        server="",
        machine=ComposedMachine("m-2", "host-1", "r", (), None, ()),
        env={},
        args=[],
        share=None,
        stack=None,
        manifest=None,
    )
    assert (whole.gpus, whole.cores, whole.memory_gib) == ((), None, None)


def test_a_share_holders_start_says_its_share_and_a_whole_ones_does_not() -> None:
    def asked(gpu_share: int) -> bytes:
        machine = ComposedMachine(
            "m-1", "host-1", "r", (gpu(1, "aa11bb22-0000"),), None, (), gpu_share=gpu_share
        )
        request = start_request(
            user="ada",
            server="",
            machine=machine,
            env={},
            args=[],
            share=Share(1, 4),
            stack=None,
            manifest=None,
        )
        assert request.gpu_share == gpu_share
        return encode_request(request)

    assert b'"gpu_share":4' in asked(4)
    assert b"gpu_share" not in asked(1)  # an agent before shares takes it


def bare_start(user: str = "ada", image: str | None = None) -> StartNotebook:
    """A start of a machine without devices or share, stack or manifest."""
    return start_request(
        user=user,
        server="",
        machine=ComposedMachine("m-1", "host-1", "r", (), None, ()),
        env={},
        args=[],
        share=None,
        stack=None,
        manifest=None,
        image=image,
    )


def test_a_start_the_agent_would_refuse_is_refused_here() -> None:
    with pytest.raises(Refused, match="account"):
        bare_start(user="../root")


def test_an_image_goes_by_digest_and_only_where_named() -> None:
    image = "127.0.0.1:5000/composespawner/pytorch@sha256:" + "a" * 64
    request = bare_start(image=image)
    assert json.loads(encode_request(request))["image"] == image
    assert parse_request(encode_request(request)) == request
    without = bare_start()
    assert "image" not in json.loads(encode_request(without))  # agents before images take it
    for bad in ("pytorch:latest", "-v/:/x@sha256:" + "a" * 64, "r/p@sha256:" + "A" * 64):
        with pytest.raises(Refused, match="image"):
            bare_start(image=bad)


def test_a_stack_goes_with_its_cpu_lock_and_common_files(tmp_path: Path) -> None:
    lock = tmp_path / "cpu.lock"
    lock.write_text("numpy==2.0.0 --hash=sha256:00\n")
    common = tmp_path / "common"
    common.mkdir()
    (common / "repro.py").write_text("SEED = 0\n")
    (common / "__pycache__").mkdir()
    sha = hashlib.sha256(lock.read_bytes()).hexdigest()
    stack = Stack("torch", "PyTorch", cpu=StackBuild(lock, sha), common=common)

    source = stack_source(stack)

    assert (source.id, source.lock_sha256, source.lock) == ("torch", sha, lock.read_text())
    assert source.common == (("repro.py", "SEED = 0\n"),)
    with pytest.raises(ValueError, match="does not hash"):
        stack_source(Stack("torch", "PyTorch", cpu=StackBuild(lock, "0" * 64)))


def test_a_host_key_not_listed_or_changed_is_said_so(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.1.11]:2201 {key}\n")
    assert "is not in known_hosts" in host_key_problem(str(known), "127.0.1.12", 2201)
    assert "showed another host key" in host_key_problem(str(known), "127.0.1.11", 2201)
    assert "cannot be read" in host_key_problem(str(tmp_path / "missing"), "127.0.1.11", 22)


@pytest.mark.parametrize(
    ("error", "reason", "check"),
    [
        (asyncssh.HostKeyNotVerifiable("x"), "host-key", "cannot verify"),
        (asyncssh.PermissionDenied("x"), "host-login", "authorized_keys"),
        (ConnectionRefusedError(), "host-down", "check that sshd runs"),
        (TimeoutError(), "host-down", "connect_timeout 10 s"),
        (OSError("no route"), "host-down", "connection failed"),
    ],
)
def test_an_unreachable_host_is_a_503_that_says_what_to_check(
    error: BaseException, reason: str, check: str
) -> None:
    log_line, refusal = unreachable(error, "host-3", "127.0.1.13:2201", "detail", 10)
    assert refusal.status_code == 503
    assert refusal.reason == reason
    assert "host-3" in refusal.jupyterhub_message
    assert "devices were given back" in refusal.jupyterhub_message
    assert check in log_line
    assert "127.0.1.13:2201" in log_line
