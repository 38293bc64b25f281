"""A notebook in a container of its own, from its stack's image: what podman is told.

On a shared host a notebook's process shares everything with its neighbours that a
cgroup does not divide: the process list, ``/dev/shm`` and ``/tmp``, System V IPC, the
loopback network (every neighbour's server and kernel ports), every device node. In
a container it has its own of each, as DockerSpawner's and Kubernetes' notebooks do:

- the user's own uid and gid, their home bind-mounted at the same path, the image
  read-only (a notebook changes its home, never its stack);
- its share: ``--cpus``, ``--memory`` with ``--memory-swap`` equal (no swap beyond it),
  ``--pids-limit`` from its size (:func:`~.cgroups.pids_limit`);
- ``/dev/shm`` and ``/tmp`` its own, in memory and so inside the memory limit, gone
  with the container;
- every capability dropped, no new privileges, a small init as PID 1 that reaps;
- only its own GPUs' device nodes (CDI names where the host has NVIDIA's CDI spec),
  and the device cgroup closes every other's even where a node is reachable;
- a network namespace of its own, user-mode (slirp4netns) without a way to the
  host's loopback: the hub's proxy reaches the notebook at the port published on
  the host's loopback, and the notebook reaches no neighbour's server or kernel and
  no service listening on the host's loopback (the hub's API, the database).

What to run is decided here, purely (:func:`run_arguments`); running it is the
launcher's (:mod:`.local_container`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from composespawner.domain.hardware import Share

GIB = 1 << 30
# A user-mode network per notebook: no bridge its neighbours are on, and 10.0.2.2 (the
# host's loopback through slirp4netns) closed.
ISOLATED_NETWORK = "slirp4netns:allow_host_loopback=false"
# The notebook's environment comes from the hub's, where the host's paths mean nothing:
# the image's own PATH and virtual environment stay.
HOST_ONLY_VARIABLES = frozenset(
    {
        "PATH",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "CONDA_ROOT",
        "CONDA_DEFAULT_ENV",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "SHELL",
        # The container's is its user's, given as --env HOME=…; podman's own is root's
        # (a root podman reading a user's ~/.config is not to be thought of).
        "HOME",
    }
)
NOTEBOOK_SERVER = "jupyterhub-singleuser"  # on every stack image's PATH
LABEL = "io.composespawner.notebook"  # on every notebook container: the hub's server name
STOP_SECONDS = 10  # seconds podman gives a notebook after SIGTERM, before SIGKILL
_UNSAFE = re.compile(r"[^a-z0-9_.-]+")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ContainerSpecError(ValueError):
    """A notebook container cannot be described as asked; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One notebook's container."""

    name: str  # the container's name (container_name): one per user and server
    image: str  # the stack's image, by digest (…@sha256:…)
    uid: int
    gid: int
    home: str  # the user's home on the host, mounted at the same path and the workdir
    port: int  # the notebook's port, published on the host's loopback only
    command: tuple[str, ...]
    environment: tuple[str, ...] = ()  # names passed from podman's own environment
    share: Share | None = None  # None: the host's cores and memory (a whole host)
    pids: int = 0  # the pids limit (0: podman's default)
    devices: tuple[str, ...] = ()  # device nodes (/dev/nvidia0) or CDI names
    network: str = ISOLATED_NETWORK
    host_ip: str = "127.0.0.1"  # where the port is published
    labels: tuple[tuple[str, str], ...] = field(default=())
    read_only_mounts: tuple[str, ...] = ()  # host folders mounted read-only at the same path
    env_file: str = ""  # a file of NAME=value lines for the container (root's alone), or none
    # Podman's pull policy: never (the launcher pulled it, with progress, just before),
    # or missing (pulled before, and looked for again only if it is gone since).
    pull: str = "never"


def container_name(user: str, server: str, token: str) -> str:
    """``composespawner-<user>-<server>-<hash>``: a name podman takes, new at each start
    (``token``), so that removing one start's container never removes a later one's.

    User and server names may hold anything a hub allows (``@``, capitals, markup);
    what podman does not take is dropped from the readable part, and the hash of the
    exact names and the token keeps two that read alike apart.
    """
    exact = hashlib.sha256(f"{user}\0{server}\0{token}".encode()).hexdigest()[:12]
    readable = "-".join(
        p for p in (_UNSAFE.sub("", user.lower()), _UNSAFE.sub("", server.lower())) if p
    )
    return f"composespawner-{readable[:40]}-{exact}" if readable else f"composespawner-{exact}"


def forwarded_names(environment: Mapping[str, str]) -> tuple[str, ...]:
    """The names of ``environment`` a notebook container gets (podman's ``--env NAME``
    takes each value from its own environment, never from its command line, where every
    account on the host could read the server's API token)."""
    return tuple(
        sorted(
            name
            for name in environment
            if name not in HOST_ONLY_VARIABLES and _VARIABLE.match(name)
        )
    )


def run_arguments(spec: ContainerSpec) -> list[str]:
    """``podman run``'s arguments for ``spec``: attached (its exit is the notebook's),
    removed when it ends."""
    check(spec)
    if spec.pull not in ("never", "missing"):
        raise ContainerSpecError(f"no pull policy {spec.pull!r}: never or missing")
    args = [
        *("run", "--rm", "--name", spec.name),
        *("--user", f"{spec.uid}:{spec.gid}", "--userns", "host"),
        *("--cap-drop", "all", "--security-opt", "no-new-privileges", "--init"),
        *("--read-only", "--read-only-tmpfs=false", "--pull", spec.pull),
        *("--stop-timeout", str(STOP_SECONDS), "--stop-signal", "SIGTERM"),
        *("--network", spec.network, "--publish", f"{spec.host_ip}:{spec.port}:{spec.port}"),
        *("--volume", f"{spec.home}:{spec.home}:rw", "--workdir", spec.home),
        *(arg for folder in spec.read_only_mounts for arg in ("--volume", f"{folder}:{folder}:ro")),
        *("--label", f"{LABEL}={spec.name}"),
    ]
    for key, value in spec.labels:
        args += ["--label", f"{key}={value}"]
    memory = _memory(spec)
    if spec.share is not None:
        args += ["--cpus", str(spec.share.cores), "--memory", str(memory)]
        args += ["--memory-swap", str(memory)]
    if spec.pids:
        args += ["--pids-limit", str(spec.pids)]
    args += ["--shm-size", str(_shm_size(spec))]
    args += ["--tmpfs", f"/tmp:{','.join(_tmp_options(spec))}"]
    for device in spec.devices:
        args += ["--device", device]
    if spec.env_file:
        args += ["--env-file", spec.env_file]
    for name in spec.environment:
        args += ["--env", name]
    args += ["--env", f"HOME={spec.home}"]
    return [*args, spec.image, *spec.command]


def create_body(spec: ContainerSpec, environment: Mapping[str, str]) -> dict[str, Any]:
    """Podman's API's description of ``spec``'s container (a libpod SpecGenerator): what
    :func:`run_arguments` says on a command line, with the environment's values given
    (``environment``'s names that :func:`forwarded_names` passes, and HOME).

    Not removed when it ends: its launcher reads its exit status, and its last output
    where the exit was not asked for, then removes it.
    """
    check(spec)
    if spec.env_file:
        raise ContainerSpecError("an environment file is podman run's, not its API's")
    mode, _, options = spec.network.partition(":")  # slirp4netns:allow_host_loopback=false
    body: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        "command": list(spec.command),
        "user": f"{spec.uid}:{spec.gid}",
        "userns": {"nsmode": "host"},
        "cap_drop": ["all"],
        "no_new_privileges": True,
        "init": True,
        "read_only_filesystem": True,
        "read_write_tmpfs": False,
        "stop_timeout": STOP_SECONDS,
        "stop_signal": 15,  # SIGTERM
        "netns": {"nsmode": mode},
        "network_options": {mode: options.split(",")} if options else {},
        "portmappings": [
            {"host_ip": spec.host_ip, "host_port": spec.port, "container_port": spec.port}
        ],
        "mounts": [
            _bind(spec.home, "rw"),
            *(_bind(folder, "ro") for folder in spec.read_only_mounts),
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": _tmp_options(spec),
            },
        ],
        "work_dir": spec.home,
        "labels": {LABEL: spec.name, **dict(spec.labels)},
        "shm_size": _shm_size(spec),
        "devices": [{"path": device} for device in spec.devices],
        "env": {
            **{name: environment[name] for name in spec.environment if name in environment},
            "HOME": spec.home,
        },
    }
    limits: dict[str, Any] = {}
    if spec.share is not None:
        memory = _memory(spec)
        period = 100_000  # microseconds: podman's own for --cpus
        limits["cpu"] = {"quota": round(spec.share.cores * period), "period": period}
        limits["memory"] = {"limit": memory, "swap": memory}
    if spec.pids:
        limits["pids"] = {"limit": spec.pids}
    if limits:
        body["resource_limits"] = limits
    return body


def check(spec: ContainerSpec) -> None:
    """ContainerSpecError where ``spec`` is no notebook container this project runs."""
    if not spec.image or "@sha256:" not in spec.image:
        raise ContainerSpecError(f"a notebook's image is named by digest, not {spec.image!r}")
    if not 0 < spec.port < 65536:
        raise ContainerSpecError(f"no port {spec.port} to publish")
    if spec.uid == 0:
        raise ContainerSpecError("a notebook container never runs as root")


def _memory(spec: ContainerSpec) -> int:
    return spec.share.memory_gib * GIB if spec.share is not None else 0


def _shm_size(spec: ContainerSpec) -> int:
    # In memory, so charged to the container's memory: never more than it may hold.
    return _memory(spec) or GIB


def _tmp_options(spec: ContainerSpec) -> list[str]:
    memory = _memory(spec)
    return ["rw", "nosuid", "nodev", "mode=1777", f"size={memory}" if memory else "size=50%"]


def _bind(folder: str, mode: str) -> dict[str, Any]:
    return {"destination": folder, "type": "bind", "source": folder, "options": ["rbind", mode]}


def image_command(configured: Sequence[str]) -> list[str]:
    """The notebook's command in its image: the configured one, where the image's own
    notebook server replaces the host's (its path on the host means nothing there)."""
    if configured and PurePath(configured[0]).name == NOTEBOOK_SERVER:
        return [NOTEBOOK_SERVER, *configured[1:]]
    return list(configured)


def notebook_listens_everywhere(service_url: str) -> str:
    """``JUPYTERHUB_SERVICE_URL`` as the notebook binds it inside its container: every
    address of its own network namespace (the published port arrives on its interface,
    not its loopback), the same port and path."""
    match = re.match(r"^(https?://)(\[[^\]]*\]|[^/:\[]+)(:\d+)?(/.*)?$", service_url)
    if match is None:
        raise ContainerSpecError(f"not a notebook URL: {service_url!r}")
    scheme, _host, port, rest = match.groups()
    return f"{scheme}0.0.0.0{port or ''}{rest or ''}"


def image_for(images: Mapping[str, str], stack_id: str, catalog_image: str) -> str | None:
    """The image ``stack_id``'s notebooks run: the site's setting, else the catalog's
    (``repository@digest``); None where neither names one by digest."""
    image = images.get(stack_id) or catalog_image
    return image if "@sha256:" in image else None


def cdi_devices(gpus: Sequence[str]) -> tuple[str, ...]:
    """The ``--device`` values of a notebook holding ``gpus`` (``GPU-<uuid>``) on a host
    with NVIDIA's CDI spec, its devices named by UUID (``nvidia-ctk cdi generate
    --device-name-strategy=uuid``): the spec adds the driver's libraries too."""
    return tuple(f"nvidia.com/gpu={gpu}" for gpu in gpus)
