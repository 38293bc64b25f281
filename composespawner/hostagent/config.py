"""The agent's configuration: a TOML file of the host's administrator (``--config``).

Every key is optional; what the hub sends never changes any of these. Parsing
is pure (:func:`parse_config` takes the file's table, the environment and the
machine's figures); :func:`load_config` reads them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composespawner.launchers.accounts import BUILD_ACCOUNT
from composespawner.launchers.agent_protocol import ACCOUNT_NAME
from composespawner.launchers.cgroups import PIDS_PER_GIB, parent_parts
from composespawner.launchers.containers import ISOLATED_NETWORK
from composespawner.launchers.gpu_devices import NVIDIA_PROC

DEFAULT_STATE_DIR = "/var/lib/composespawner-host"
DEFAULT_STACKS_DIR = "/var/cache/composespawner/stacks"
NVIDIA_SMI_QUERY = ("--query-gpu=uuid", "--format=csv,noheader")
USERS_GROUP = "composespawner-users"  # the accounts the agent creates
# Groups that make an account more than a person's: root in all but name (docker, lxd,
# libvirt, disk, kvm's raw devices), a way to become root (sudo, wheel, admin; Debian's
# staff writes /usr/local, first on root's PATH), or secrets (shadow, adm, the journal).
REFUSED_GROUPS = (
    *("root", "sudo", "wheel", "admin", "staff"),
    *("docker", "lxd", "libvirt", "disk", "kvm"),
    *("shadow", "adm", "systemd-journal"),
)
# Above 60000 are ids no person should run as: systemd's homed (60001-60513) and
# DynamicUser (61184-65519) ranges, nobody, then containers' mapped ids. A directory that
# maps ids higher (SSSD's AD id mapping starts at 200000) raises max_uid.
DEFAULT_MAX_UID = 60_000
# create_accounts: whether the agent makes an account for a name the host does not know.
# "when-no-directory": only where NSS has no directory for passwd (see decisions.py).
CREATE_MODES = ("when-no-directory", "always", "never")

NOTEBOOK_SERVER = "jupyterhub-singleuser"
KEYS = frozenset(
    {
        "listen_address",
        "state_dir",
        "cgroup_parent",
        "home_root",
        "create_accounts",
        "min_uid",
        "max_uid",
        "stacks_dir",
        "notebook_command",
        "cores",
        "memory_gib",
        "log_file",
        "gpu_list_command",
        "build_account",
        "refused_groups",
        "keep_logs_days",
        "pids_per_gib",
        "nvidia_proc_dir",
        "runtime",
        "podman_command",
        "container_network",
        "gpu_devices",
        "device_dir",
        "relay_dir",
        "image_pull_timeout",
    }
)
# How notebooks run here: "process" (as the account, in cgroups of the agent's, the
# stack's environment built on the host) or "containers" (podman, the stack's image).
RUNTIMES = ("process", "containers")
GPU_DEVICE_WAYS = ("nodes", "cdi")  # see PodmanLauncher.gpu_devices
DEFAULT_RELAY_DIR = "/run/composespawner-host/relay"
MAX_RELAY_DIR = 107 - 1 - 12 - 1 - 30  # see _relay_dir
PULL_TIMEOUT = 1800  # seconds a first pull of a stack's image may take (gigabytes)


class ConfigError(ValueError):
    """The config file is unreadable or wrong; the message names the key."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    listen_address: str  # "" when neither configured nor known from SSH_CONNECTION
    state_dir: Path
    cgroup_parent: tuple[str, ...]
    home_root: Path
    create_accounts: str  # one of CREATE_MODES
    min_uid: int
    stacks_dir: Path
    notebook_command: tuple[str, ...]
    cores: int
    memory_gib: int
    log_file: Path | None
    gpu_list_command: tuple[str, ...]  # () : GPU presence is not checked
    build_account: str  # the system account stack environments are built as
    refused_groups: tuple[str, ...]  # an account in one of these runs no notebook
    keep_logs_days: int = 14  # an ended notebook's log in state_dir is kept this long
    max_uid: int = DEFAULT_MAX_UID  # the highest uid a notebook runs as
    pids_per_gib: int = PIDS_PER_GIB  # a notebook's processes and threads per GiB of memory
    nvidia_proc_dir: Path = NVIDIA_PROC  # where the driver lists each GPU's device minor
    runtime: str = RUNTIMES[0]
    podman_command: tuple[str, ...] = ("/usr/bin/podman",)  # rootful; the host's configuration
    container_network: str = ISOLATED_NETWORK  # podman's --network for notebooks
    gpu_devices: str = GPU_DEVICE_WAYS[0]
    device_dir: Path = Path("/dev")  # the GPUs' device nodes, with gpu_devices = "nodes"
    # The hub's services on loopback, served to each container as a Unix socket here
    # (only where the hub's URLs are on this host's loopback: a hub on one machine).
    relay_dir: Path = Path(DEFAULT_RELAY_DIR)
    image_pull_timeout: int = PULL_TIMEOUT


@dataclass(frozen=True, slots=True)
class MachineFacts:
    """What the machine itself says, for the defaults."""

    cores: int
    memory_gib: int
    python: str  # the agent's own interpreter: jupyterhub-singleuser is beside it
    nvidia_smi: str | None


def parse_config(
    table: Mapping[str, Any], environ: Mapping[str, str], facts: MachineFacts
) -> AgentConfig:
    """The config in ``table`` (a TOML document's top level), defaults filled in."""
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})")
    listen = _text(table, "listen_address", connected_address(environ.get("SSH_CONNECTION", "")))
    try:
        parent = parent_parts(_text(table, "cgroup_parent", "composespawner"))
    except ValueError as e:
        raise ConfigError(f"cgroup_parent: {e}") from None
    gpu_default = (facts.nvidia_smi, *NVIDIA_SMI_QUERY) if facts.nvidia_smi else ()
    log_file = _text(table, "log_file", "")
    min_uid = _number(table, "min_uid", 1000, least=1)
    return AgentConfig(
        listen_address=listen,
        state_dir=_absolute(table, "state_dir", DEFAULT_STATE_DIR),
        cgroup_parent=parent,
        home_root=_absolute(table, "home_root", "/home"),
        create_accounts=_create_mode(table, "create_accounts"),
        min_uid=min_uid,
        max_uid=_number(table, "max_uid", max(DEFAULT_MAX_UID, min_uid), least=min_uid),
        stacks_dir=_absolute(table, "stacks_dir", DEFAULT_STACKS_DIR),
        notebook_command=_command(
            table, "notebook_command", (str(Path(facts.python).parent / NOTEBOOK_SERVER),)
        ),
        cores=_number(table, "cores", facts.cores, least=1),
        memory_gib=_number(table, "memory_gib", facts.memory_gib, least=1),
        log_file=Path(log_file) if log_file else None,
        gpu_list_command=_command(table, "gpu_list_command", gpu_default, empty_ok=True),
        build_account=_account_name(table, "build_account", BUILD_ACCOUNT),
        refused_groups=_names(table, "refused_groups", REFUSED_GROUPS),
        keep_logs_days=_number(table, "keep_logs_days", 14, least=0),
        pids_per_gib=_number(table, "pids_per_gib", PIDS_PER_GIB, least=1),
        nvidia_proc_dir=_absolute(table, "nvidia_proc_dir", str(NVIDIA_PROC)),
        runtime=_one_of(table, "runtime", RUNTIMES),
        podman_command=_command(table, "podman_command", ("/usr/bin/podman",)),
        container_network=_text(table, "container_network", ISOLATED_NETWORK),
        gpu_devices=_one_of(table, "gpu_devices", GPU_DEVICE_WAYS),
        device_dir=_absolute(table, "device_dir", "/dev"),
        relay_dir=_relay_dir(table),
        image_pull_timeout=_number(table, "image_pull_timeout", PULL_TIMEOUT, least=1),
    )


def connected_address(ssh_connection: str) -> str:
    """The host's address the hub connected to: SSH_CONNECTION's third field."""
    fields = ssh_connection.split()
    return fields[2] if len(fields) == 4 else ""


def memory_gib_in(meminfo: str) -> int:
    """Whole GiB of ``MemTotal`` in ``/proc/meminfo``'s text (at least 1)."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return max(1, int(line.split()[1]) >> 20)  # kB
    return 1


def _text(table: Mapping[str, Any], key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{key} is a string")
    return value


def _absolute(table: Mapping[str, Any], key: str, default: str) -> Path:
    path = Path(_text(table, key, default))
    if not path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"{key}: {str(path)!r} is not an absolute path")
    return path


def _account_name(table: Mapping[str, Any], key: str, default: str) -> str:
    value = _text(table, key, default)
    if not ACCOUNT_NAME.fullmatch(value) or value == "root":
        raise ConfigError(f"{key}: {value!r} is not an account's name (nor root)")
    return value


def _names(table: Mapping[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = table.get(key, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} is a list of group names")
    return tuple(value)


def _create_mode(table: Mapping[str, Any], key: str) -> str:
    """One of CREATE_MODES; the older true/false read as "when-no-directory"/"never"
    (true never meant "over a campus directory's head")."""
    value = table.get(key, CREATE_MODES[0])
    if isinstance(value, bool):
        return CREATE_MODES[0] if value else "never"
    if value not in CREATE_MODES:
        raise ConfigError(f"{key} is one of {', '.join(map(repr, CREATE_MODES))}")
    return str(value)


def _relay_dir(table: Mapping[str, Any]) -> Path:
    """``relay_dir``, short enough for the sockets in it (a Unix socket's path holds at
    most 107 bytes: the folder, a notebook's 12, and ``127.x.y.z-port.sock``'s 30)."""
    path = _absolute(table, "relay_dir", DEFAULT_RELAY_DIR)
    if len(os.fsencode(path)) > MAX_RELAY_DIR:
        raise ConfigError(f"relay_dir: {str(path)!r} is longer than {MAX_RELAY_DIR} bytes")
    return path


def _one_of(table: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, the first by default."""
    value = table.get(key, choices[0])
    if value not in choices:
        raise ConfigError(f"{key} is one of {', '.join(map(repr, choices))}")
    return str(value)


def _number(table: Mapping[str, Any], key: str, default: int, least: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"{key} is a whole number, at least {least}")
    return value


def _command(
    table: Mapping[str, Any], key: str, default: tuple[str, ...], empty_ok: bool = False
) -> tuple[str, ...]:
    """A command: a list of words, or a string split as a shell would (no shell runs it)."""
    value = table.get(key, default)
    if isinstance(value, str):
        value = shlex.split(value)
    if not isinstance(value, list | tuple) or not all(isinstance(w, str) for w in value):
        raise ConfigError(f"{key} is a command: a string or a list of strings")
    if not value:
        if empty_ok:
            return ()
        raise ConfigError(f"{key} is empty")
    if not Path(value[0]).is_absolute():
        raise ConfigError(f"{key}: {value[0]!r} is not an absolute path")
    return tuple(value)


# -- the reads (the edges) -----------------------------------------------------------


def machine_facts() -> MachineFacts:
    try:
        memory = memory_gib_in(Path("/proc/meminfo").read_text())
    except OSError:
        memory = 1
    return MachineFacts(
        cores=os.cpu_count() or 1,
        memory_gib=memory,
        python=sys.executable,
        nvidia_smi=shutil.which("nvidia-smi"),
    )


def load_config(path: Path | None, environ: Mapping[str, str]) -> AgentConfig:
    """The config in ``path`` (None: every default); ConfigError says what is wrong."""
    table: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as file:
                table = tomllib.load(file)
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not TOML: {e}") from None
    return parse_config(table, environ, machine_facts())
