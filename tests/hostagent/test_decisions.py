"""The host agent's decisions, pure: its config, whose a start is, whether it fits,
what the notebook is given. No process, no account, no cgroup."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from composespawner.hostagent.agent import command_refusal, describe, who
from composespawner.hostagent.config import (
    REFUSED_GROUPS,
    ConfigError,
    MachineFacts,
    connected_address,
    memory_gib_in,
    parse_config,
)
from composespawner.hostagent.containers import env_file_text
from composespawner.hostagent.decisions import (
    Record,
    account_refusal,
    creation_refusal,
    directory_sources,
    interpreter_of,
    notebook_env,
    parse_gpu_list,
    passwd_sources,
    resolve_gpus,
    runtime_refusal,
    service_url,
    start_refusal,
)
from composespawner.hostagent.starting import StartFailed
from composespawner.hostagent.state import StateDir
from composespawner.launchers.agent_protocol import Refused, StackSource, StartNotebook
from composespawner.launchers.stack_sources import source_key, stack_of

pytestmark = pytest.mark.timeout(10)

FACTS = MachineFacts(cores=64, memory_gib=512, python="/opt/cs/venv/bin/python", nvidia_smi=None)
SSH = {"SSH_CONNECTION": "10.0.0.9 51234 10.0.1.7 22"}


def record(
    machine: str, gpus: tuple[str, ...] = (), cores: int = 4, memory: int = 16, gpu_share: int = 1
) -> Record:
    return Record(machine, "ada", 1001, "", 100, 5, 9000, gpus, cores, memory, ("/c/x",), gpu_share)


# -- config ------------------------------------------------------------------------------


def test_an_empty_config_takes_the_machine_and_the_connection() -> None:
    config = parse_config({}, SSH, FACTS)
    assert config.listen_address == "10.0.1.7"  # the address the hub connected to
    assert config.state_dir == Path("/var/lib/composespawner-host")
    assert config.cgroup_parent == ("composespawner",)
    assert config.home_root == Path("/home")
    assert config.create_accounts == "when-no-directory"
    assert (config.min_uid, config.max_uid) == (1000, 60000)
    assert config.stacks_dir == Path("/var/cache/composespawner/stacks")
    assert config.notebook_command == ("/opt/cs/venv/bin/jupyterhub-singleuser",)
    assert (config.cores, config.memory_gib) == (64, 512)
    assert config.log_file is None
    assert config.gpu_list_command == ()  # no nvidia-smi: GPU presence is not checked
    assert config.build_account == "composespawner-build"
    assert {"sudo", "wheel", "docker", "shadow"} <= set(config.refused_groups)
    assert {"staff", "kvm", "systemd-journal"} <= set(config.refused_groups)


def test_nvidia_smi_lists_the_gpus_where_it_exists() -> None:
    facts = MachineFacts(8, 64, "/usr/bin/python3", "/usr/bin/nvidia-smi")
    assert parse_config({}, {}, facts).gpu_list_command == (
        "/usr/bin/nvidia-smi",
        "--query-gpu=uuid",
        "--format=csv,noheader",
    )


def test_every_key_is_taken() -> None:
    config = parse_config(
        {
            "listen_address": "127.0.1.4",
            "state_dir": "/srv/state",
            "cgroup_parent": "cs/host-4",
            "home_root": "/srv/homes",
            "create_accounts": False,
            "min_uid": 2000,
            "max_uid": 2_000_200_000,
            "stacks_dir": "/srv/stacks",
            "notebook_command": "/srv/venv/bin/python -I /srv/nb.py",
            "cores": 8,
            "memory_gib": 32,
            "log_file": "/var/log/cs-host.log",
            "gpu_list_command": ["/bin/cat", "/srv/gpus"],
            "build_account": "stack-builder",
            "refused_groups": ["sudo"],
            "keep_logs_days": 3,
            "runtime": "containers",
            "podman_command": "/usr/bin/env CONTAINERS_CONF=/srv/c.conf /usr/bin/podman",
            "container_network": "slirp4netns",
            "gpu_devices": "cdi",
            "device_dir": "/srv/dev",
            "relay_dir": "/run/relay",
            "image_pull_timeout": 600,
        },
        SSH,
        FACTS,
    )
    assert config.listen_address == "127.0.1.4"
    assert config.cgroup_parent == ("cs", "host-4")
    assert config.notebook_command == ("/srv/venv/bin/python", "-I", "/srv/nb.py")
    assert (config.cores, config.memory_gib, config.min_uid) == (8, 32, 2000)
    assert config.log_file == Path("/var/log/cs-host.log")
    assert config.gpu_list_command == ("/bin/cat", "/srv/gpus")
    assert config.build_account == "stack-builder"
    assert config.refused_groups == ("sudo",)
    assert config.keep_logs_days == 3
    assert (config.create_accounts, config.max_uid) == ("never", 2_000_200_000)
    assert (config.runtime, config.gpu_devices, config.image_pull_timeout) == (
        "containers",
        "cdi",
        600,
    )
    assert config.podman_command[-1] == "/usr/bin/podman"
    assert (config.device_dir, config.relay_dir) == (Path("/srv/dev"), Path("/run/relay"))
    assert config.container_network == "slirp4netns"


@pytest.mark.parametrize(
    ("value", "mode"),
    [(True, "when-no-directory"), (False, "never"), ("always", "always"), ("never", "never")],
)
def test_create_accounts_says_when(value: object, mode: str) -> None:
    assert parse_config({"create_accounts": value}, {}, FACTS).create_accounts == mode


def test_a_min_uid_past_the_default_max_moves_the_max() -> None:
    assert parse_config({"min_uid": 70000}, {}, FACTS).max_uid == 70000


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"listen": "x"}, "unknown keys listen"),
        ({"state_dir": "relative"}, "state_dir"),
        ({"home_root": "/srv/../etc"}, "home_root"),
        ({"cgroup_parent": "../up"}, "cgroup_parent"),
        ({"min_uid": 0}, "min_uid"),
        ({"cores": True}, "cores"),
        ({"create_accounts": "yes"}, "create_accounts is one of"),
        ({"max_uid": 999}, "max_uid is a whole number, at least 1000"),
        ({"notebook_command": "jupyterhub-singleuser"}, "not an absolute path"),
        ({"notebook_command": []}, "notebook_command is empty"),
        ({"build_account": "root"}, "build_account"),
        ({"build_account": "a;b"}, "build_account"),
        ({"runtime": "docker"}, "runtime is one of 'process', 'containers'"),
        ({"gpu_devices": "all"}, "gpu_devices is one of"),
        ({"podman_command": "podman"}, "podman_command: 'podman' is not an absolute path"),
        ({"image_pull_timeout": 0}, "image_pull_timeout"),
        ({"relay_dir": "/tmp/" + "x" * 60}, "relay_dir: .* is longer than 63 bytes"),
    ],
)
def test_a_wrong_config_says_which_key(table: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config(table, {}, FACTS)


def test_the_connected_address_and_the_memory() -> None:
    assert connected_address("10.0.0.9 51234 10.0.1.7 22") == "10.0.1.7"
    assert connected_address("") == ""
    assert memory_gib_in("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 23
    assert memory_gib_in("nothing") == 1


# -- whose, and whether it fits ------------------------------------------------------------


@pytest.mark.parametrize(
    ("uid", "gid", "refused"),
    [
        (0, 0, True),
        (1, 1, True),
        (999, 999, True),
        (65534, 65534, True),
        (1000, 1000, False),
        (60000, 60000, False),
        (61184, 61184, True),  # systemd's DynamicUser range
        (1500000, 1500000, True),  # a container's mapped ids
        (1001, 0, True),
    ],
)
def test_only_peoples_accounts_run_notebooks(uid: int, gid: int, refused: bool) -> None:
    assert (account_refusal("x", uid, gid, 1000) is not None) is refused


def test_a_directory_with_high_ids_raises_max_uid() -> None:
    refusal = account_refusal("x", 1500000, 1500000, 1000)
    assert refusal is not None
    assert "above this host's max_uid 60000" in refusal
    assert account_refusal("x", 1500000, 1500000, 1000, max_uid=2_000_200_000) is None


def test_an_account_in_a_group_worth_root_is_refused() -> None:
    refusal = account_refusal("x", 1001, 1001, 1000, ["x", "docker", "sudo"], REFUSED_GROUPS)
    assert refusal is not None
    assert "docker, sudo" in refusal
    assert account_refusal("x", 1001, 1001, 1000, ["x", "video"], REFUSED_GROUPS) is None
    for group in ("staff", "kvm", "systemd-journal"):
        assert account_refusal("x", 1001, 1001, 1000, ["x", group], REFUSED_GROUPS) is not None


NSSWITCH_SSSD = """\
# /etc/nsswitch.conf
passwd:         files sss [NOTFOUND=return] # campus accounts
group:          files sss
hosts:          files dns
"""


@pytest.mark.parametrize(
    ("text", "sources", "directories"),
    [
        (NSSWITCH_SSSD, ("files", "sss"), ["sss"]),
        ("passwd: files systemd\ngroup: files ldap\n", ("files", "systemd"), []),
        ("passwd: compat\n", ("compat",), ["compat"]),  # compat's + lines are NIS
        ("passwd: files [ !UNAVAIL=return ] winbind\n", ("files", "winbind"), ["winbind"]),
        ("passwd:ldap\n", ("ldap",), ["ldap"]),
        ("#passwd: files nis\nhosts: files\n", ("files",), []),  # no line: glibc's files
        ("", ("files",), []),
    ],
)
def test_nss_sources_of_passwd(text: str, sources: tuple[str, ...], directories: list[str]) -> None:
    assert passwd_sources(text) == sources
    assert directory_sources(sources) == directories


def test_no_account_is_made_over_a_directorys_head_unless_said() -> None:
    refusal = creation_refusal("ada", "when-no-directory", ["sss"])
    assert refusal is not None
    assert "passwd: sss" in refusal
    assert "shadow the campus one" in refusal
    assert 'create_accounts = "always"' in refusal
    assert creation_refusal("ada", "when-no-directory", []) is None
    assert creation_refusal("ada", "always", ["sss"]) is None
    assert "creates none" in (creation_refusal("ada", "never", []) or "")


def test_a_start_fits_beside_the_running_ones() -> None:
    running = [record("m1", ("GPU-aaaa0000",), cores=2, memory=8)]
    assert start_refusal("m2", ("GPU-bbbb0000",), (2, 8), running, (4, 16)) is None


def test_a_second_start_of_a_machine_is_refused() -> None:
    refusal = start_refusal("m1", (), (1, 1), [record("m1")], (64, 512))
    assert refusal is not None
    assert "m1 already" in refusal


def test_a_gpu_another_notebook_holds_is_refused() -> None:
    refusal = start_refusal(
        "m2", ("GPU-aaaa0000",), (1, 1), [record("m1", ("GPU-aaaa0000",))], (64, 512)
    )
    assert refusal is not None
    assert "GPU-aaaa0000 (machine m1)" in refusal


GPU = ("GPU-aaaa0000",)


def holders(*shares: int) -> list[Record]:
    return [record(f"m{n}", GPU, cores=1, memory=1, gpu_share=s) for n, s in enumerate(shares)]


@pytest.mark.parametrize("held", [(), (4,), (4, 4), (4, 4, 4)])
def test_a_share_joins_holders_of_shares_of_its_size_while_a_slot_is_free(
    held: tuple[int, ...],
) -> None:
    assert start_refusal("new", GPU, (1, 1), holders(*held), (64, 512), gpu_share=4) is None


@pytest.mark.parametrize(
    ("held", "asked", "said"),
    [
        ((4, 4, 4, 4), 4, "all 4 of its 1/4 shares are held: machines m0, m1, m2, m3"),
        ((2, 2), 2, "all 2 of its 1/2 shares are held"),
        ((1,), 4, "held by machine m0 whole, not in 1/4 shares"),
        ((2,), 4, "held by machine m0 as a 1/2 share, not in 1/4 shares"),
        ((4, 2), 4, "m1 as a 1/2 share"),
        ((4,), 1, "GPU-aaaa0000 (machine m0)"),
        ((4, 4), 1, "GPU-aaaa0000 (machine m0, m1)"),
    ],
)
def test_a_gpu_is_shared_only_in_one_size_of_share_and_never_past_it(
    held: tuple[int, ...], asked: int, said: str
) -> None:
    refusal = start_refusal("new", GPU, (1, 1), holders(*held), (64, 512), gpu_share=asked)
    assert refusal is not None
    assert said in refusal


def test_an_old_record_holds_its_gpus_whole() -> None:
    old = record("m1", GPU).to_json()
    del old["gpu_share"]
    assert Record.from_json(old).gpu_share == 1
    refusal = start_refusal("m2", GPU, (1, 1), [Record.from_json(old)], (64, 512), gpu_share=2)
    assert refusal is not None
    assert "whole" in refusal


@pytest.mark.parametrize("share", [(3, 8), (2, 9)])
def test_a_share_past_the_host_is_refused(share: tuple[int, int]) -> None:
    refusal = start_refusal("m2", (), share, [record("m1", cores=2, memory=8)], (4, 16))
    assert refusal is not None
    assert "does not fit" in refusal


def test_gpus_the_host_lacks() -> None:
    listed = parse_gpu_list("GPU-aaaa0000\n GPU-bbbb0000 \n\n")
    assert listed == ["GPU-aaaa0000", "GPU-bbbb0000"]
    with pytest.raises(Refused, match=r"not on this host: GPU-cccc0000, 2$"):
        resolve_gpus(["GPU-aaaa0000", "GPU-cccc0000", "1", "2"], listed)


def test_every_name_of_a_gpu_is_its_uuid_before_anything_compares() -> None:
    listed = ["GPU-aaaa0000", "GPU-bbbb0000"]
    assert resolve_gpus(["1", "GPU-AAAA0000"], listed) == ("GPU-bbbb0000", "GPU-aaaa0000")
    assert resolve_gpus(["00"], listed) == ("GPU-aaaa0000",)


@pytest.mark.parametrize(
    "asked", [["0", "GPU-aaaa0000"], ["0", "00"], ["GPU-aaaa0000", "GPU-AAAA0000"]]
)
def test_one_gpu_by_two_names_is_refused(asked: list[str]) -> None:
    with pytest.raises(Refused, match="names the GPU GPU-aaaa0000 twice"):
        resolve_gpus(asked, ["GPU-aaaa0000"])


def test_without_a_gpu_list_only_uuids_pass() -> None:
    with pytest.raises(Refused, match=r"GPU 0 is an index.*name GPUs by UUID"):
        resolve_gpus(["GPU-aaaa0000", "0"], None)
    with pytest.raises(Refused, match="twice"):
        resolve_gpus(["GPU-aaaa0000", "GPU-AAAA0000"], None)
    assert resolve_gpus(["GPU-aaaa0000"], None) == ("GPU-aaaa0000",)


def test_a_uuid_in_another_case_is_the_held_gpu() -> None:
    held = [record("m1", gpus=("GPU-aaaa0000",))]
    refusal = start_refusal("m2", ("GPU-AAAA0000",), (1, 1), held, (4, 16))
    assert refusal is not None
    assert "held by another notebook" in refusal


# -- what the notebook is given -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "ip", "expected"),
    [
        ("http://127.0.0.1:0/user/ada/", "10.0.1.7", "http://10.0.1.7:9000/user/ada/"),
        ("https://hub:443/user/ada/x?y=1", "10.0.1.7", "https://10.0.1.7:9000/user/ada/x?y=1"),
        (None, "10.0.1.7", "http://10.0.1.7:9000/"),
        ("http://h:1/user/ada/", "fd00::7", "http://[fd00::7]:9000/user/ada/"),
    ],
)
def test_the_service_url_is_where_the_notebook_listens(
    url: str | None, ip: str, expected: str
) -> None:
    assert service_url(url, ip, 9000) == expected


def test_the_environment_is_the_hubs_with_what_the_agent_sets() -> None:
    asked = (("JUPYTERHUB_API_TOKEN", "t"), ("JUPYTERHUB_SERVICE_URL", "http://h:0/user/ada/"))
    env = notebook_env(
        asked,
        ("ada", "/home/ada", "/bin/bash"),
        ("GPU-aaaa0000", "GPU-bbbb0000"),
        ("10.0.1.7", 9000),
        "/stacks/x/bin",
        {"VIRTUAL_ENV": "/stacks/x"},
    )
    assert env == {
        "JUPYTERHUB_API_TOKEN": "t",
        "JUPYTERHUB_SERVICE_URL": "http://10.0.1.7:9000/user/ada/",
        "HOME": "/home/ada",
        "USER": "ada",
        "LOGNAME": "ada",
        "SHELL": "/bin/bash",
        "PATH": "/stacks/x/bin:/usr/local/bin:/usr/bin:/bin",
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa0000,GPU-bbbb0000",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa0000,GPU-bbbb0000",
        "VIRTUAL_ENV": "/stacks/x",
    }


def test_no_gpus_is_none_for_a_container_and_empty_for_cuda() -> None:
    env = notebook_env((), ("ada", "/home/ada", ""), (), ("10.0.1.7", 9000), "", {})
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]) == ("", "none")
    assert env["SHELL"] == "/bin/sh"
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_a_scripts_interpreter() -> None:
    assert interpreter_of(b"#!/opt/venv/bin/python\n") == "/opt/venv/bin/python"
    assert interpreter_of(b"#! /usr/bin/env python3\n") == "/usr/bin/env"
    assert interpreter_of(b"#!python\n") is None
    assert interpreter_of(b"\x7fELF\x02") is None


@pytest.mark.parametrize(
    ("runtime", "image", "says"),
    [
        ("process", None, None),
        ("containers", "r/pytorch@sha256:" + "0" * 64, None),
        ("containers", None, "host_runtime = 'containers'"),
        ("process", "r/pytorch@sha256:" + "0" * 64, "host_runtime = 'process'"),
    ],
)
def test_a_host_runs_the_start_its_runtime_runs_and_says_which_setting_differs(
    runtime: str, image: str | None, says: str | None
) -> None:
    refusal = runtime_refusal(runtime, image)
    assert refusal is None if says is None else says in str(refusal)


def test_a_containers_env_file_holds_each_variable_on_a_line_or_refuses() -> None:
    env = {"A": "1 2", "B": "x=y", "C": "not given"}
    assert env_file_text(env, ("A", "B")) == "A=1 2\nB=x=y\n"
    with pytest.raises(StartFailed, match="B hold a line break"):
        env_file_text({"B": "one\ntwo"}, ("B",))


def test_a_record_survives_its_file() -> None:
    kept = record("m1", ("GPU-aaaa0000",), gpu_share=4)
    assert Record.from_json(kept.to_json()) == kept
    contained = replace(kept, container="composespawner-ada-0123", cgroups=())
    assert Record.from_json(contained.to_json()) == contained
    assert kept.listed()["gpus"] == ["GPU-aaaa0000"]
    assert kept.listed()["gpu_share"] == 4
    with pytest.raises(ValueError, match="not a notebook record"):
        Record.from_json({"machine": "m1"})


def test_a_stacks_files_are_kept_by_what_they_are(tmp_path: Path) -> None:
    lock = "numpy==2.0 --hash=sha256:00\n"
    source = StackSource("pytorch", "PyTorch", hashlib.sha256(lock.encode()).hexdigest(), lock)
    changed = StackSource(source.id, source.label, source.lock_sha256, lock, (("repro.py", "x"),))
    assert source_key(source) != source_key(changed)
    stack = stack_of(source, tmp_path)
    assert stack.cpu is not None
    assert stack.cpu.lock == tmp_path / "requirements.lock"
    assert stack.common == tmp_path / "common"


# -- the channel ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "refused"),
    [
        ({}, False),
        ({"SSH_ORIGINAL_COMMAND": "composespawner-host"}, False),
        ({"SSH_ORIGINAL_COMMAND": "id"}, True),
        ({"SSH_ORIGINAL_COMMAND": ""}, True),
    ],
)
def test_only_the_agent_runs(environ: dict[str, str], refused: bool) -> None:
    assert (command_refusal(environ) is not None) is refused


def test_the_log_names_the_request_never_its_env() -> None:
    data = (
        b'{"v":1,"op":"start","user":"a;id","machine":"m1","env":{"LD_PRELOAD":"/x","T":"s3cret"}}'
    )
    assert who(data) == "op=start user=a;id machine=m1"
    assert who(b"\x00not json") == "op=? (not JSON)"
    assert "s3cret" not in who(data)
    request = StartNotebook("ada", "", "m1", (), None, None, env=(("T", "s3cret"),))
    assert describe(request) == "op=start user=ada machine=m1"


def test_old_logs_of_ended_notebooks_go_and_the_rest_stay(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.write(record("running"))
    for machine in ("running", "ended-old", "ended-new"):
        state.log_path(machine).write_text("output\n")
    for machine in ("running", "ended-old"):
        os.utime(state.log_path(machine), (1_000_000, 1_000_000))
    state.prune_logs(older_than=2_000_000)
    assert sorted(p.stem for p in state.path.glob("*.log")) == ["ended-new", "running"]
