"""What the hub and a compute host's agent say to each other over SSH.

The hub's key is authorized on each compute host only for one forced command,
``composespawner-host`` (:mod:`composespawner.hostagent`): every SSH channel the hub
opens runs that program, which reads ONE request, a JSON object on its stdin
(ended by EOF), and answers with JSON lines on its stdout: any number of
progress lines, then one final line.

Requests (``"v": 1`` in each)::

    {"op": "start", "user": ..., "server": ..., "machine": ..., "gpus": [...],
     "cores": 4 | null, "memory_gib": 32 | null, "env": {...}, "args": [...],
     "stack": {"id", "label", "lock_sha256", "lock", "common": {name: text}} | null,
     "manifest": {...} | null, "gpu_share": 4, "image": "registry/repo@sha256:…"}
    {"op": "stop", "machine": ...}
    {"op": "poll", "machine": ...}
    {"op": "watch"}      stays open: one line per notebook of this host that exits
    {"op": "list"}       the notebooks this host's agent runs
    {"op": "activity"}   what the host's GPUs are doing, from NVML on the host

``gpu_share`` n (2-64) asks for 1/n of its one GPU, which other notebooks may hold in
shares of the same size; absent is 1, whole GPUs, and the hub leaves it out for them,
so an agent that predates shares takes every whole-GPU start (and refuses a share's,
as a field it does not know).

``image`` (by digest) is what a host whose agent runs notebooks in containers runs;
the hub sends it only to such hosts (its ``host_runtime``), and the stack's source
then stays behind: nothing is built. An agent that runs processes refuses it, and
one that runs containers refuses a start without it: the hub and its hosts disagree,
and the refusal says which setting to change.

Replies: ``{"progress": "building…", "percent": 40}`` lines while a start builds
its stack, then ``{"ok": true, ...}`` (a start: ``ip``, ``port``, ``pid``; a poll:
``running`` and ``status``; a list: ``notebooks``; an activity: ``gpus``, see
:func:`activity_fields`), or ``{"ok": false, "refused":
why}`` for a request the agent will not do (nothing was done), or ``{"ok": false,
"error": why}`` for one that failed on the host (what was begun is undone). A
watch writes ``{"exited": machine, "status": n | null}`` lines until the channel
closes.

Everything here is pure: the agent parses with :func:`parse_request` (anything
it does not understand is refused, with the reason), the launcher encodes with
:func:`encode_request` and reads replies with :func:`parse_reply`. The limits
are the agent's defence: the hub's key must not be able to do more than start a
notebook as an ordinary account, with the devices and share the request names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from composespawner.domain.activity import GpuActivity, Holder, gpu_uuid

VERSION = 1
MAX_REQUEST_BYTES = 4 << 20  # a stack's lock and common files are the bulk
MAX_ENV = 256  # variables
MAX_ARGS = 64
MAX_CORES = 4096
MAX_MEMORY_GIB = 1 << 16
MAX_GPU_SHARE = 64  # holders of one GPU at most
# What useradd takes on every Linux without --badname (shadow's is_valid_user_name):
# no "/", "..", spaces or shell metacharacters can pass.
ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
SERVER_NAME = re.compile(r"[A-Za-z0-9._-]{0,255}")
MACHINE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
STACK_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# A GPU as CUDA_VISIBLE_DEVICES names it: by UUID (GPU-…, or a MIG instance's MIG-…)
# on a shared host, by index only where the machine has the host to itself.
# An index has no leading zero: "00" is "0" by another name.
# A notebook's image by digest: a registry and repository podman takes (no option: it
# starts with a letter or digit), then the manifest's digest.
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,254}@sha256:[0-9a-f]{64}")
GPU_SELECTOR = re.compile(r"(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{7,63}|0|[1-9][0-9]{0,2}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A GPU's UUID as NVML gives it, and a Jupyter kernel's id as its connection file names it.
GPU_UUID = re.compile(r"(GPU-)?[0-9A-Fa-f][0-9A-Fa-f-]{7,63}")
KERNEL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_MIB = 1 << 24  # framebuffer of one GPU, far above any made
# Set by the agent itself (PATH from the stack, the GPUs from "gpus"), or able to
# change what a program loads before it runs: never taken from a request.
ENV_REFUSED_PREFIXES = ("LD_", "COMPOSE_AGENT_")
ENV_SET_BY_AGENT = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
)
OPS = ("start", "stop", "poll", "watch", "list", "activity")
MAX_GPUS_READ = 64  # GPUs of one host in an activity reply
MAX_HOLDERS = 1024  # processes holding one GPU


class Refused(ValueError):
    """A request the agent will not carry out; the message says why (the hub logs it)."""


@dataclass(frozen=True, slots=True)
class StackSource:
    """What a host needs to build a stack's environment: its lock and common files.

    The agent builds it on first use and keeps it by the lock's hash, as the local
    launcher does on the hub's machine; the hash is checked against the lock sent.
    """

    id: str
    label: str
    lock_sha256: str
    lock: str
    common: tuple[tuple[str, str], ...] = ()  # (file name, text)


@dataclass(frozen=True, slots=True)
class StartNotebook:
    user: str
    server: str
    machine: str
    gpus: tuple[str, ...]
    cores: int | None  # None: the whole host
    memory_gib: int | None
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    stack: StackSource | None = None
    manifest: dict[str, Any] | None = None
    gpu_share: int = 1  # n > 1: 1/n of its one GPU, beside holders of same-size shares
    image: str | None = None  # the stack's image by digest, for a host that runs containers
    op: str = field(default="start", init=False)


@dataclass(frozen=True, slots=True)
class StopNotebook:
    machine: str
    op: str = field(default="stop", init=False)


@dataclass(frozen=True, slots=True)
class PollNotebook:
    machine: str
    op: str = field(default="poll", init=False)


@dataclass(frozen=True, slots=True)
class WatchExits:
    op: str = field(default="watch", init=False)


@dataclass(frozen=True, slots=True)
class ListNotebooks:
    op: str = field(default="list", init=False)


@dataclass(frozen=True, slots=True)
class ReadActivity:
    op: str = field(default="activity", init=False)


Request = StartNotebook | StopNotebook | PollNotebook | WatchExits | ListNotebooks | ReadActivity


# -- replies -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    message: str
    percent: int


@dataclass(frozen=True, slots=True)
class Done:
    """The request was carried out; ``fields`` is what the op answers with."""

    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RefusedReply:
    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


@dataclass(frozen=True, slots=True)
class Exited:
    machine: str
    status: int | None


Reply = Progress | Done | RefusedReply | Failed | Exited


# -- the hub's side ------------------------------------------------------------


def encode_request(request: Request) -> bytes:
    """The request as the agent reads it (checked as the agent will: a bad one raises)."""
    body: dict[str, Any] = {"v": VERSION, "op": request.op}
    if isinstance(request, StartNotebook):
        body.update(
            user=request.user,
            server=request.server,
            machine=request.machine,
            gpus=list(request.gpus),
            cores=request.cores,
            memory_gib=request.memory_gib,
            env=dict(request.env),
            args=list(request.args),
            stack=_stack_body(request.stack),
            manifest=request.manifest,
        )
        if request.gpu_share != 1:  # whole GPUs say nothing: agents before shares read them
            body["gpu_share"] = request.gpu_share
        if request.image is not None:  # agents before containers take starts without it
            body["image"] = request.image
    elif isinstance(request, StopNotebook | PollNotebook):
        body["machine"] = request.machine
    data = json.dumps(body, separators=(",", ":")).encode()
    parse_request(data)
    return data


def parse_reply(line: bytes | str) -> Reply:
    """One line of the agent's answer; raises ValueError for anything else."""
    try:
        body = json.loads(line)
    except ValueError as e:
        raise ValueError(f"not a JSON line: {_excerpt(line)}") from e
    if not isinstance(body, dict):
        raise ValueError(f"not a JSON object: {_excerpt(line)}")
    if "progress" in body:
        return Progress(str(body["progress"]), _int(body.get("percent", 0), "percent", 0, 100))
    if "exited" in body:
        status = body.get("status")
        return Exited(str(body["exited"]), status if isinstance(status, int) else None)
    if body.get("ok") is True:
        return Done({k: v for k, v in body.items() if k != "ok"})
    if body.get("ok") is False and isinstance(body.get("refused"), str):
        return RefusedReply(body["refused"])
    if body.get("ok") is False and isinstance(body.get("error"), str):
        return Failed(body["error"])
    raise ValueError(f"not a reply the agent sends: {_excerpt(line)}")


def _stack_body(stack: StackSource | None) -> dict[str, Any] | None:
    if stack is None:
        return None
    return {
        "id": stack.id,
        "label": stack.label,
        "lock_sha256": stack.lock_sha256,
        "lock": stack.lock,
        "common": dict(stack.common),
    }


# -- an activity's answer (the agent writes it, the hub reads it) -------------------


def activity_fields(gpus: Iterable[GpuActivity]) -> dict[str, Any]:
    """The fields of the agent's answer to an activity: ``{"gpus": [{"uuid",
    "utilization", "memory_used_mib", "processes", "holders"}]}``, each holder a
    ``[pid, kernel id or null]`` pair, ``holders`` null where they could not be named.

    A GPU whose holders include a kernel id the hub would refuse (a connection file any
    user can name) is sent with its holders unknown: one such process must not make the
    whole host's reading garbage, nor pass for a process that is no kernel's."""
    return {
        "gpus": [
            {
                "uuid": gpu.uuid,
                "utilization": gpu.utilization,
                "memory_used_mib": gpu.memory_used_mib,
                "processes": gpu.processes,
                "holders": None
                if gpu.holders is None
                else [[holder.pid, holder.kernel_id] for holder in gpu.holders],
            }
            for gpu in map(_nameable, gpus)
        ]
    }


def _nameable(gpu: GpuActivity) -> GpuActivity:
    if gpu.holders is None or all(
        h.kernel_id is None or KERNEL_ID.fullmatch(h.kernel_id) for h in gpu.holders
    ):
        return gpu
    return replace(gpu, holders=None)


def parse_activity(fields: Mapping[str, Any]) -> dict[str, GpuActivity]:
    """The GPUs of an activity's answer by UUID. Raises ValueError for anything the agent
    does not send (a figure out of range, a GPU twice, a kernel id that is none): a
    reading is never guessed at, so a garbled one counts as unread, never as idle."""
    gpus = fields.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS_READ:
        raise ValueError(f"gpus is not a list of at most {MAX_GPUS_READ} GPUs")
    read: dict[str, GpuActivity] = {}
    for gpu in gpus:
        if not isinstance(gpu, dict):
            raise ValueError(f"a GPU is not an object: {_excerpt(repr(gpu))}")
        uuid = gpu_uuid(_matching(gpu.get("uuid"), GPU_UUID, "uuid", ValueError))
        if uuid in read:
            raise ValueError(f"GPU {uuid} is listed twice")
        processes = gpu.get("processes")
        if processes is not None:
            processes = _int(processes, "processes", 0, MAX_HOLDERS)
        holders = _holders(gpu.get("holders"))
        # NVML names each process it counts: never more holders than processes.
        if holders is not None and (processes is None or len(holders) > processes):
            raise ValueError(f"GPU {uuid}: {len(holders)} holders of {processes} processes")
        read[uuid] = GpuActivity(
            uuid,
            _figure(gpu.get("utilization"), "utilization", 100),
            _figure(gpu.get("memory_used_mib"), "memory_used_mib", MAX_MIB),
            processes,
            holders,
        )
    return read


def _holders(holders: Any) -> tuple[Holder, ...] | None:
    if holders is None:
        return None
    if not isinstance(holders, list) or len(holders) > MAX_HOLDERS:
        raise ValueError(f"holders is a list of at most {MAX_HOLDERS} [pid, kernel] pairs")
    named = []
    for holder in holders:
        if not isinstance(holder, list) or len(holder) != 2:
            raise ValueError(f"a holder is not a [pid, kernel] pair: {_excerpt(repr(holder))}")
        pid, kernel = holder
        if kernel is not None:
            kernel = _matching(kernel, KERNEL_ID, "a holder's kernel", ValueError)
        named.append(Holder(_int(pid, "a holder's pid", 1, 1 << 22), kernel))
    if len({h.pid for h in named}) != len(named):
        raise ValueError("holders name a process twice")
    return tuple(sorted(named, key=lambda h: h.pid))


def _figure(value: Any, what: str, most: float) -> float:
    # bool is an int in Python, and JSON's true is not a figure; NaN is no reading.
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= most:
        raise ValueError(f"{what}: {_excerpt(repr(value))} is not a figure 0-{most:g}")
    return float(value)


# -- the agent's side ------------------------------------------------------------


def reply(**fields: Any) -> bytes:
    """One line of the agent's answer."""
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def parse_request(data: bytes) -> Request:
    """The request in ``data``, checked; raises :class:`Refused` with the reason."""
    if len(data) > MAX_REQUEST_BYTES:
        raise Refused(f"the request is {len(data)} bytes, more than {MAX_REQUEST_BYTES}")
    try:
        body = json.loads(data)
    except ValueError:
        raise Refused("the request is not one JSON object") from None
    except RecursionError:  # 100,000 "[": Python's parser nests one call per level
        raise Refused("the request nests deeper than any request does") from None
    if not isinstance(body, dict):
        raise Refused("the request is not one JSON object")
    if body.get("v") != VERSION:
        raise Refused(f"protocol version {body.get('v')!r}: this agent speaks {VERSION}")
    op = body.get("op")
    if op not in OPS:
        raise Refused(f"unknown op {op!r}: the agent does {', '.join(OPS)}")
    if op == "start":
        return _start(body)
    if op in ("stop", "poll"):
        _only(body, {"v", "op", "machine"})
        machine = _matching(body.get("machine"), MACHINE_ID, "machine")
        return StopNotebook(machine) if op == "stop" else PollNotebook(machine)
    _only(body, {"v", "op"})
    if op == "watch":
        return WatchExits()
    return ListNotebooks() if op == "list" else ReadActivity()


def _start(body: dict[str, Any]) -> StartNotebook:
    _only(
        body,
        {"v", "op", "user", "server", "machine", "gpus", "cores", "memory_gib", "env", "args"}
        | {"stack", "manifest", "gpu_share", "image"},
    )
    user = body.get("user")
    if not isinstance(user, str) or not ACCOUNT_NAME.fullmatch(user) or user.isdigit():
        raise Refused(
            f"user {_excerpt(repr(user))} cannot be an account's name: lower-case letters,"
            " digits, '_', '.' or '-', at most 32, starting with a letter or '_'"
        )
    gpus = body.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > 64:
        raise Refused("gpus is a list of at most 64 GPUs")
    selectors = tuple(_matching(g, GPU_SELECTOR, "a GPU (GPU-<uuid> or an index)") for g in gpus)
    if len({s.lower() for s in selectors}) != len(selectors):  # a UUID's case is no other GPU
        raise Refused("gpus names a GPU twice")
    cores, memory = body.get("cores"), body.get("memory_gib")
    if (cores is None) != (memory is None):
        raise Refused("cores and memory_gib are both given (a share) or both null (whole host)")
    if cores is not None:
        cores = _int(cores, "cores", 1, MAX_CORES, Refused)
        memory = _int(memory, "memory_gib", 1, MAX_MEMORY_GIB, Refused)
    gpu_share = _int(body.get("gpu_share", 1), "gpu_share", 1, MAX_GPU_SHARE, Refused)
    if gpu_share > 1 and len(selectors) != 1:
        raise Refused(f"gpu_share {gpu_share} is a share of exactly one GPU, not {len(selectors)}")
    image = body.get("image")
    return StartNotebook(
        user=user,
        server=_matching(body.get("server", ""), SERVER_NAME, "server"),
        machine=_matching(body.get("machine"), MACHINE_ID, "machine"),
        gpus=selectors,
        cores=cores,
        memory_gib=memory,
        env=_env(body.get("env", {})),
        args=_args(body.get("args", [])),
        stack=_stack(body.get("stack")),
        manifest=_manifest(body.get("manifest")),
        gpu_share=gpu_share,
        image=None if image is None else _matching(image, IMAGE, "image (repository@sha256:…)"),
    )


def _env(env: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        raise Refused(f"env is an object of at most {MAX_ENV} variables")
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise Refused(f"env: {_excerpt(repr(name))} is not a variable's name")
        if name.startswith(ENV_REFUSED_PREFIXES) or name in ENV_SET_BY_AGENT:
            raise Refused(f"env: {name} is not the hub's to set")
        if not isinstance(value, str) or "\0" in value:
            raise Refused(f"env: {name} is not a string without NUL")
    return tuple(sorted(env.items()))


def _args(args: Any) -> tuple[str, ...]:
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise Refused(f"args is a list of at most {MAX_ARGS} options")
    for arg in args:
        # Options of jupyterhub-singleuser only: never a program or a file to run.
        if not isinstance(arg, str) or not arg.startswith("--") or "\0" in arg:
            raise Refused(f"args: {_excerpt(repr(arg))} is not an option (--name=value)")
    return tuple(args)


def _stack(stack: Any) -> StackSource | None:
    if stack is None:
        return None
    if not isinstance(stack, dict):
        raise Refused("stack is an object or null")
    _only(stack, {"id", "label", "lock_sha256", "lock", "common"}, "stack")
    lock, sha = stack.get("lock"), _matching(stack.get("lock_sha256"), SHA256, "lock_sha256")
    if not isinstance(lock, str):
        raise Refused("stack.lock is the lock's text")
    if hashlib.sha256(lock.encode()).hexdigest() != sha:
        raise Refused("stack.lock does not hash to stack.lock_sha256")
    common = stack.get("common", {})
    if not isinstance(common, dict) or not all(
        isinstance(name, str) and FILE_NAME.fullmatch(name) and isinstance(text, str)
        for name, text in common.items()
    ):
        raise Refused("stack.common maps plain file names (no '/') to their text")
    label = stack.get("label", "")
    if not isinstance(label, str) or len(label) > 200:
        raise Refused("stack.label is a short text")
    return StackSource(
        id=_matching(stack.get("id"), STACK_ID, "stack.id"),
        label=label,
        lock_sha256=sha,
        lock=lock,
        common=tuple(sorted(common.items())),
    )


def _manifest(manifest: Any) -> dict[str, Any] | None:
    if manifest is not None and not isinstance(manifest, dict):
        raise Refused("manifest is an object or null")
    return manifest


def _only(body: dict[str, Any], allowed: set[str], what: str = "the request") -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise Refused(f"{what} has fields this agent does not know: {', '.join(unknown)}")


def _matching(
    value: Any, pattern: re.Pattern[str], what: str, error: type[ValueError] = Refused
) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise error(f"{what}: {_excerpt(repr(value))} is not allowed ({pattern.pattern})")
    return value


def _int(value: Any, what: str, least: int, most: int, error: type[ValueError] = ValueError) -> int:
    # bool is an int in Python, and JSON's true is not a count.
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise error(f"{what}: {_excerpt(repr(value))} is not a whole number {least}-{most}")
    return value


def _excerpt(value: bytes | str, most: int = 80) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    return text if len(text) <= most else text[:most] + "…"
