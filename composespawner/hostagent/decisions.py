"""What the agent decides, as pure functions: whose a start is, whether it fits, what
the notebook is given. The reads and writes are in :mod:`.notebooks`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from composespawner.domain.activity import gpu_uuid
from composespawner.launchers.agent_protocol import Refused

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# Accounts no notebook runs as whatever their uid: the kernel's overflow id (nobody)
# and the "no id" of chown(2).
UNUSABLE_UIDS = frozenset({65534, 4294967295})
# NSS's passwd sources that look nowhere but this host: files, systemd's userdb (its
# own and homed's accounts), Ubuntu's extrausers, altfiles, machined's containers.
# Any other (sss, ldap, winbind, nis, compat's +NIS lines, a vendor's) is a directory.
LOCAL_PASSWD_SOURCES = frozenset({"files", "systemd", "db", "extrausers", "altfiles", "mymachines"})


@dataclass(frozen=True, slots=True)
class Record:
    """A notebook this host's agent started: ``state_dir/<machine>.json``."""

    machine: str
    user: str
    uid: int
    server: str
    pid: int
    started: int  # the process's start time (clock ticks after boot): pid reuse is not it
    port: int
    gpus: tuple[str, ...]
    cores: int
    memory_gib: int
    cgroups: tuple[str, ...]
    gpu_share: int = 1  # n > 1: it holds its one GPU as a 1/n share (records before: 1)
    container: str = ""  # its podman container's name (the containers runtime), else ""
    # A start under way: pid and started are its agent's, until the notebook runs.
    starting: bool = False

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["gpus"], body["cgroups"] = list(self.gpus), list(self.cgroups)
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Record:
        """The record in ``body``; ValueError if it is not one (a damaged file)."""
        try:
            record = cls(
                machine=str(body["machine"]),
                user=str(body["user"]),
                uid=int(body["uid"]),
                server=str(body["server"]),
                pid=int(body["pid"]),
                started=int(body["started"]),
                port=int(body["port"]),
                gpus=tuple(str(g) for g in body["gpus"]),
                cores=int(body["cores"]),
                memory_gib=int(body["memory_gib"]),
                cgroups=tuple(str(c) for c in body["cgroups"]),
                gpu_share=int(body.get("gpu_share", 1)),
                container=str(body.get("container", "")),
                starting=body.get("starting", False) is True,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a notebook record: {e}") from None
        return record

    def listed(self) -> dict[str, Any]:
        """What ``list`` says of it."""
        return {
            "machine": self.machine,
            "user": self.user,
            "server": self.server,
            "pid": self.pid,
            "port": self.port,
            "gpus": list(self.gpus),
            "cores": self.cores,
            "memory_gib": self.memory_gib,
            "gpu_share": self.gpu_share,
        }


def account_refusal(
    name: str,
    uid: int,
    gid: int,
    min_uid: int,
    groups: Iterable[str] = (),
    refused: Iterable[str] = (),
    max_uid: int = 60_000,
) -> str | None:
    """Why an existing account ``name`` may not run a notebook, or None if it may.

    ``groups`` are the account's groups' names, ``refused`` those that make an account
    more than a person's (sudo, docker: what a notebook would hold through them).
    """
    if uid < min_uid or uid in UNUSABLE_UIDS:
        return (
            f"the account {name!r} is a system account (uid {uid}): notebooks run only as"
            f" people's accounts (uid {min_uid} or more)"
        )
    if uid > max_uid:
        return (
            f"the account {name!r} has uid {uid}, above this host's max_uid {max_uid}:"
            " ids there are services' (systemd's dynamic users) and containers', not"
            " people's. A directory whose people have such ids raises max_uid"
        )
    if gid == 0:
        return f"the account {name!r} has the root group as its own: no notebook runs in it"
    privileged = sorted(set(groups) & set(refused))
    if privileged:
        return (
            f"the account {name!r} is in the groups {', '.join(privileged)}, which give more"
            " than a person's account: the hub's notebooks do not run as it"
        )
    return None


def passwd_sources(nsswitch: str) -> tuple[str, ...]:
    """The sources of ``/etc/nsswitch.conf``'s ``passwd:`` lines, actions left out;
    glibc's default (files) where no line says."""
    sources: list[str] = []
    for line in nsswitch.splitlines():
        database, colon, rest = line.partition("#")[0].partition(":")
        if colon and database.strip() == "passwd":
            sources += re.sub(r"\[[^\]]*\]", " ", rest).split()  # [NOTFOUND=return]: an action
    return tuple(sources) or ("files",)


def directory_sources(sources: Iterable[str]) -> list[str]:
    """Of NSS's passwd ``sources``, those that look accounts up off this host."""
    return [s for s in sources if s not in LOCAL_PASSWD_SOURCES]


def creation_refusal(name: str, mode: str, directories: Sequence[str]) -> str | None:
    """Why no account ``name`` is made here (``create_accounts`` is ``mode``; NSS's
    passwd has ``directories``), or None if one may be.

    A name the host does not know may be a campus person's whose directory is
    unreachable just now (SSSD offline, nothing cached): an account made here
    under that name, with an id of its own, would shadow theirs for good.
    """
    if mode == "never":
        return f"no account {name!r} on this host, and this agent creates none"
    if mode == "when-no-directory" and directories:
        return (
            f"no account {name!r} on this host, and this agent creates none while accounts"
            f" come from a directory (nsswitch.conf's passwd: {' '.join(directories)}): it"
            " may be unreachable just now, and a local account would shadow the campus one."
            ' Where this host should make accounts anyway, set create_accounts = "always"'
        )
    return None


def start_refusal(
    machine: str,
    gpus: Sequence[str],
    share: tuple[int, int],
    running: Iterable[Record],
    capacity: tuple[int, int],
    gpu_share: int = 1,
) -> str | None:
    """Why a start of ``machine`` with ``gpus`` (as 1/``gpu_share`` of its one GPU where
    that is over 1) and ``share`` (cores, GiB) cannot run beside the ``running`` notebooks
    on a host of ``capacity``, or None if it can."""
    records = list(running)
    if any(r.machine == machine for r in records):
        return f"machine {machine} already has a notebook running on this host"
    holders: dict[str, list[Record]] = {}
    for record in records:
        for gpu in record.gpus:
            holders.setdefault(gpu.lower(), []).append(record)  # a UUID in any case is one GPU
    taken = [
        f"{gpu} ({why})"
        for gpu in gpus
        if (why := gpu_taken(holders.get(gpu.lower(), []), gpu_share))
    ]
    if taken:
        return f"GPUs held by another notebook on this host: {', '.join(taken)}"
    cores = sum(r.cores for r in records) + share[0]
    memory = sum(r.memory_gib for r in records) + share[1]
    if cores > capacity[0] or memory > capacity[1]:
        return (
            f"the share ({share[0]} cores, {share[1]} GiB) does not fit: notebooks here"
            f" would hold {cores} of {capacity[0]} cores and {memory} of {capacity[1]} GiB"
        )
    return None


def gpu_taken(holders: Sequence[Record], gpu_share: int) -> str | None:
    """Why a GPU that ``holders`` hold cannot be had as 1/``gpu_share`` of it (1: whole).

    Several notebooks hold one GPU only as shares of one size, at most that many: a
    whole GPU is never shared, and two sizes would leave no size's count meaningful.
    """
    if not holders:
        return None
    machines = ", ".join(r.machine for r in holders)
    if gpu_share == 1:
        return f"machine {machines}"
    if any(r.gpu_share != gpu_share for r in holders):
        held = ", ".join(f"{r.machine} {_held_as(r.gpu_share)}" for r in holders)
        return f"held by machine {held}, not in 1/{gpu_share} shares"
    if len(holders) >= gpu_share:
        return f"all {gpu_share} of its 1/{gpu_share} shares are held: machines {machines}"
    return None


def _held_as(gpu_share: int) -> str:
    return "whole" if gpu_share == 1 else f"as a 1/{gpu_share} share"


def resolve_gpus(asked: Sequence[str], listed: Sequence[str] | None) -> tuple[str, ...]:
    """``asked`` (UUIDs or indexes) as the host's own UUIDs, before anything compares them.

    ``listed`` is the host's GPU list in index order (``nvidia-smi``'s), or None where
    the host has none to read. One GPU has many names (its UUID in either case, its
    index), and a check that compares names lets ``["GPU-aaaa…"]``, ``["0"]`` and a
    share of ``"00"`` all hold it whole: so each is resolved to the UUID the host lists,
    and two that are one GPU are refused. Without a list an index cannot be told from
    a neighbour's GPU, so only UUIDs pass. Raises :class:`Refused` saying which.
    """
    if listed is None:
        indexes = [gpu for gpu in asked if gpu.isdigit()]
        if indexes:
            raise Refused(
                f"GPU {indexes[0]} is an index, and this host lists no GPUs (gpu_list_command)"
                " to tell which it is: name GPUs by UUID"
            )
        uuids = list(asked)
    else:
        names = {uuid.lower(): uuid for uuid in listed}
        names.update((str(index), uuid) for index, uuid in enumerate(listed))
        missing = [gpu for gpu in asked if _gpu_name(gpu) not in names]
        if missing:
            raise Refused(f"GPUs not on this host: {', '.join(missing)}")
        uuids = [names[_gpu_name(gpu)] for gpu in asked]
    seen: set[str] = set()
    for uuid in uuids:
        if uuid.lower() in seen:
            raise Refused(f"gpus names the GPU {uuid} twice (by its index and its UUID?)")
        seen.add(uuid.lower())
    return tuple(uuids)


def _gpu_name(gpu: str) -> str:
    """How :func:`resolve_gpus` looks a GPU up: UUIDs in lower case, indexes as numbers."""
    return str(int(gpu)) if gpu.isdigit() else gpu.lower()


def owners_by_gpu(records: Iterable[Record]) -> dict[str, frozenset[int]]:
    """The accounts of the notebooks holding each GPU, by its key (``gpu_uuid``)."""
    owners: dict[str, set[int]] = {}
    for record in records:
        for gpu in record.gpus:
            owners.setdefault(gpu_uuid(gpu), set()).add(record.uid)
    return {gpu: frozenset(uids) for gpu, uids in owners.items()}


def service_url(url: str | None, ip: str, port: int) -> str:
    """``JUPYTERHUB_SERVICE_URL`` with its host and port the notebook's own (it listens there)."""
    host = f"[{ip}]" if ":" in ip else ip
    if not url:
        return f"http://{host}:{port}/"
    parts = urlsplit(url)
    return urlunsplit((parts.scheme or "http", f"{host}:{port}", parts.path, parts.query, ""))


def runtime_refusal(runtime: str, image: str | None) -> str | None:
    """Why a start of ``image`` (None: the stack's environment, built here) cannot run on
    a host whose notebooks run as ``runtime``; None where it can."""
    if runtime == "containers" and image is None:
        return (
            "this host runs notebooks in containers (runtime = containers) and the start"
            " names no image: set c.SSHLauncher.host_runtime = 'containers' on the hub"
        )
    if runtime != "containers" and image is not None:
        return (
            f"this host runs notebooks as processes (runtime = {runtime}), not images: set"
            " c.SSHLauncher.host_runtime = 'process' on the hub, or runtime = 'containers'"
            " in this host's agent config"
        )
    return None


def notebook_env(
    asked: Iterable[tuple[str, str]],
    account: tuple[str, str, str],
    gpus: Sequence[str],
    listen: tuple[str, int],
    bin_dir: str,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """The notebook's whole environment: what the hub asked, then what the agent sets.

    ``account`` is (name, home, shell); ``extra`` the stack's and the run manifest's
    variables. Nothing of the agent's own environment is passed on.
    """
    env = dict(asked)
    name, home, shell = account
    selection = ",".join(gpus)
    env.update(
        HOME=home,
        USER=name,
        LOGNAME=name,
        SHELL=shell or "/bin/sh",
        PATH=f"{bin_dir}:{DEFAULT_PATH}" if bin_dir else DEFAULT_PATH,
        CUDA_VISIBLE_DEVICES=selection,
        NVIDIA_VISIBLE_DEVICES=selection or "none",
        JUPYTERHUB_SERVICE_URL=service_url(env.get("JUPYTERHUB_SERVICE_URL"), *listen),
    )
    env.update(extra)
    return env


def interpreter_of(first_line: bytes) -> str | None:
    """The program a script's ``#!`` line names (absolute), or None for no script."""
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].decode(errors="replace").split()
    return words[0] if words and words[0].startswith("/") else None


def parse_gpu_list(output: str) -> list[str]:
    """``nvidia-smi --query-gpu=uuid --format=csv,noheader``: one GPU a line."""
    return [line.strip() for line in output.splitlines() if line.strip()]
