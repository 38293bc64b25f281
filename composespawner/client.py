"""Your composed machine, from inside its notebook: ``from composespawner import client``.

    client.machine()          # this server's host, zone, GPUs and devices; idle GPUs' warnings
    client.keep()             # keep the GPUs you were warned about (or name one: keep("gpu-id"))
    client.quota()            # your effective quota: each limit, and where it comes from
    client.use()              # what you hold now, and your GPU-hours in the last 7 days
    client.quota_left()       # GPUs, servers and GPU-hours your quota leaves you now
    client.grow(1)            # one more GPU, in place: within quota, all or nothing
    client.shrink()           # give the last GPU back (or name one: shrink("gpu-id"))
    client.apply()            # this kernel's environment to the machine as it is now
    client.manifest()         # what this server runs on: stack, lock hash, machine, settings
    client.runs()             # your latest runs' manifests, newest first
    client.launch_again(name="again")  # a new server as this one started (stack, GPUs)
    client.limit_gpu_memory() # a GPU share: cap this kernel's PyTorch to the share's memory

It calls the GPU portal with the token the notebook already has
(``$JUPYTERHUB_API_TOKEN``) at the address the spawner gave it
(``$COMPOSE_PORTAL_URL``), for the server it runs in
(``$JUPYTERHUB_SERVER_NAME``). Growing or shrinking rewrites this server's
manifest and environment file, ``~/.composespawner/<server>.json`` and
``.env`` (``default`` for the default server): a terminal picks the change up
with ``source ~/.composespawner/default.env``, and a kernel, which counts its
GPUs only as it starts, after a restart and :func:`apply` before importing its
framework. Standard library only, so it imports in any kernel.

Also a command: ``python -m composespawner.client
[machine|quota|use|grow N|shrink [ID]|keep [ID]|manifest]``.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMEOUT = 120.0  # seconds; a grow waits for the fabric to attach
SCORING_TIMEOUT = 240.0  # seconds; the portal scores a submission before it answers
MANIFESTS = Path("~/.composespawner")


class PortalError(Exception):
    """The portal said no, or could not be reached; the message says what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Gpu:
    id: str
    model: str
    # Seconds it has done no work, as the pool's reclaimer last saw (None: not known).
    idle_s: float | None = None
    # Set when it will be given back to the pool if it stays idle: what, when, and how to
    # keep it (use it, or keep()).
    warning: str | None = None
    reclaim_at: str | None = None
    kept_until: str | None = None  # a Keep holds it off until then


def _gpu(data: dict[str, Any]) -> Gpu:
    """One GPU of the portal's answer; fields an older portal lacks are None."""
    warning = data.get("warning") if isinstance(data.get("warning"), dict) else None
    idle = data.get("idle_s")
    return Gpu(
        data["id"],
        data["model"],
        idle_s=float(idle)
        if isinstance(idle, int | float) and not isinstance(idle, bool)
        else None,
        warning=warning.get("message") if warning else None,
        reclaim_at=warning.get("reclaim_at") if warning else None,
        kept_until=data.get("kept_until") if isinstance(data.get("kept_until"), str) else None,
    )


@dataclass(frozen=True)
class Machine:
    """One server's composed machine, as the portal sees it now."""

    server: str
    machine: str
    state: str
    host: str | None
    zone: str | None
    since: str
    gpus: tuple[Gpu, ...]
    devices: tuple[dict[str, str], ...]
    # 1: its GPUs are its own; n: it holds 1/n of its one GPU, time-sliced with others.
    gpu_share: int = 1

    @property
    def gpu_memory_fraction(self) -> float | None:
        """The part of its GPU's memory a share may fairly use (None: whole GPUs)."""
        return 1 / self.gpu_share if self.gpu_share > 1 else None

    @property
    def warnings(self) -> list[str]:
        """What you are told of idle GPUs that will be given back unless used or kept."""
        return [g.warning for g in self.gpus if g.warning]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Machine:
        share = data.get("gpu_share")
        if not isinstance(share, int) or isinstance(share, bool) or share < 1:
            share = _started_share()  # a portal that does not say: as this notebook started
        return cls(
            server=data["server"],
            machine=data["machine"],
            state=data["state"],
            host=data["host"],
            zone=data["zone"],
            since=data["since"],
            gpus=tuple(_gpu(g) for g in data["gpus"]),
            devices=tuple(data["devices"]),
            gpu_share=share,
        )


@dataclass(frozen=True)
class Resized:
    """A machine after a grow or shrink, its kernels' environment, and what to do next."""

    machine: Machine
    environment: dict[str, str]
    next_step: str

    def __str__(self) -> str:
        return self.next_step


def machine() -> Machine:
    """This server's machine."""
    return _resized(_call("GET", _gpus_path())).machine


def machine_json(timeout: float = TIMEOUT) -> dict[str, Any]:
    """The portal's whole answer for this server, every field (newer ones too), as JSON."""
    return _call("GET", _gpus_path(), timeout=timeout)


def keep(gpu: str | None = None) -> str:
    """Press *Keep* on ``gpu`` (its id), or on every GPU you were warned about: it is not
    given back for the policy's while, used or not. What the portal said."""
    if gpu is None:
        warned = [g.id for g in machine().gpus if g.warning]
        if not warned:
            return "No GPU of this server has a warning: nothing to keep."
        return "\n".join(keep(g) for g in warned)
    path = f"{_gpus_path()}/{urllib.parse.quote(gpu, safe='')}/keep"
    return str(_call("POST", path, {})["message"])


def quota() -> dict[str, Any]:
    """Your effective quota: each limit's value (None: no limit) and where it comes from."""
    quota: dict[str, Any] = _call("GET", "api/me")["quota"]
    return quota


def use() -> dict[str, Any]:
    """GPUs and servers you hold now, and your GPU-hours in the last 7 days."""
    held: dict[str, Any] = _call("GET", "api/me")["use"]
    return held


def manifest() -> dict[str, Any]:
    """This server's run manifest: its stack (lock hash, image digest), its machine as
    composed (host, each GPU's model and id), the settings it was given, when it started."""
    path = os.environ.get("COMPOSE_RUN_MANIFEST")
    if not path:
        raise PortalError("This server has no run manifest ($COMPOSE_RUN_MANIFEST is not set).")
    try:
        with open(path, encoding="utf-8") as file:
            found: dict[str, Any] = json.load(file)
    except (OSError, ValueError) as e:
        raise PortalError(f"The run manifest {path} cannot be read: {e}") from e
    return found


def runs() -> list[dict[str, Any]]:
    """Your latest runs (at most 10), newest first, each with its whole manifest."""
    found: list[dict[str, Any]] = _call("GET", "api/me")["runs"]
    return found


def launch_again(name: str | None = None, machine: str | None = None) -> dict[str, Any]:
    """Start a server as a run started: the same stack lock and GPU model and count.

    ``machine``: the run's machine id (default: this server's); ``name``: the new
    server's (default: the run's own, which must not be running, so from inside
    a server give another).
    """
    run = machine or str(manifest()["machine"]["id"])
    body = {} if name is None else {"name": name}
    path = f"api/runs/{urllib.parse.quote(run, safe='')}/launch"
    started: dict[str, Any] = _call("POST", path, body)
    return started


def quota_left() -> dict[str, float | None]:
    """What your quota leaves you now: GPUs, servers, GPU-hours this week (None: no limit)."""
    me = _call("GET", "api/me")
    limits, held = me["quota"], me["use"]

    def left(limit: str, used: float) -> float | None:
        value = limits[limit]["value"]
        return None if value is None else max(value - used, 0)

    return {
        "gpus": left("gpus_held", held["gpus_held"]),
        "servers": left("servers", held["servers"]),
        "gpu_hours_week": left("gpu_hours_week", held["gpu_hours_week"]),
    }


def grow(count: int = 1) -> Resized:
    """Add ``count`` GPUs of this server's model to its machine, in place."""
    return _changed(_call("POST", _gpus_path(), {"count": count}))


def shrink(gpu: str | None = None) -> Resized:
    """Give one GPU back: ``gpu`` (its id), or the last one."""
    if gpu is None:
        gpus = machine().gpus
        if not gpus:
            raise PortalError("This server holds no GPU to give back.")
        gpu = gpus[-1].id
    return _changed(_call("DELETE", f"{_gpus_path()}/{urllib.parse.quote(gpu, safe='')}"))


def apply() -> Resized:
    """Set this process's environment (``CUDA_VISIBLE_DEVICES`` and the ``COMPOSE_*``
    variables) to the machine as it is now. Call it before importing PyTorch, JAX or
    TensorFlow: they count GPUs once, as they start."""
    resized = _changed(_call("GET", _gpus_path()))
    os.environ.update(resized.environment)
    return resized


def limit_gpu_memory() -> float | None:
    """Hold this process's PyTorch to its GPU share's memory; the fraction set, or None.

    Advisory: time-slicing shares a GPU's compute, not its memory, so nothing but
    this cap (and the holders' good manners) keeps one holder from filling the GPU
    and the others' allocations from failing. Call it once, before allocating on
    the GPU. None when the server holds whole GPUs, PyTorch is not installed, or it
    sees no GPU. JAX and TensorFlow are asked through their environment already
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``, ``TF_FORCE_GPU_ALLOW_GROWTH``).
    """
    fraction = _memory_fraction()
    if fraction is None:
        return None
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_per_process_memory_fraction(fraction)  # its one GPU: the current device
    return fraction


def _started_share() -> int:
    """The share this notebook was started with (``COMPOSE_GPU_SHARE`` ``1/4``): 4; 1 else."""
    _, slash, size = os.environ.get("COMPOSE_GPU_SHARE", "").partition("/")
    return int(size) if slash and size.isdigit() and int(size) > 0 else 1


def _memory_fraction() -> float | None:
    """``COMPOSE_GPU_MEMORY_FRACTION`` where it is a fraction in (0, 1); None else."""
    try:
        fraction = float(os.environ.get("COMPOSE_GPU_MEMORY_FRACTION", ""))
    except ValueError:
        return None
    return fraction if 0 < fraction < 1 else None


def _changed(data: dict[str, Any]) -> Resized:
    resized = _resized(data)
    _write_manifest(resized)
    return resized


def _resized(data: dict[str, Any]) -> Resized:
    return Resized(Machine.from_json(data), dict(data["environment"]), data["next_step"])


def _write_manifest(resized: Resized) -> None:
    """This server's manifest and environment file, replaced whole (never half-written).

    The machine has changed already: a home that cannot take the files is said, not raised.
    """
    try:
        _write_files(resized)
    except OSError as e:
        print(f"composespawner.client: could not write {MANIFESTS}: {e}", file=sys.stderr)


def _write_files(resized: Resized) -> None:
    folder = MANIFESTS.expanduser()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = os.environ.get("JUPYTERHUB_SERVER_NAME") or "default"
    manifest = {
        "machine": resized.machine.machine,
        "host": resized.machine.host,
        "zone": resized.machine.zone,
        "gpus": [{"id": g.id, "model": g.model} for g in resized.machine.gpus],
        "devices": list(resized.machine.devices),
        "environment": resized.environment,
    }
    env = "".join(f"export {k}={_shell_quoted(v)}\n" for k, v in resized.environment.items())
    for path, text in (
        (folder / f"{name}.json", json.dumps(manifest, indent=2) + "\n"),
        (folder / f"{name}.env", env),
    ):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        partial.replace(path)


def _shell_quoted(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def submit(
    kit: str, team: str | None = None, cohort: str | None = None, folder: str | None = None
) -> dict[str, Any]:
    """Send the kit's last run (``runs/last-model.pt`` and ``runs/last.json``, from its
    record cell) to be scored on blind data and put on your cohort's leaderboard.

    ``team``: your team's name inside the cohort; ``cohort``: which of yours (default:
    the one whose starter kit it is); ``folder``: the kit's (default: where the
    notebook runs). Returns the score, your rank and the submission's id.
    """
    runs = Path(folder or ".") / "runs"
    try:
        model = (runs / "last-model.pt").read_bytes()
        record = json.loads((runs / "last.json").read_text())
    except (OSError, ValueError) as e:
        raise PortalError(
            f"No run to submit in {runs} ({e}): run the whole notebook first."
        ) from None
    body = {
        "model": base64.b64encode(model).decode(),
        "record": record,
        "server": os.environ.get("JUPYTERHUB_SERVER_NAME", ""),
        **({"team": team} if team is not None else {}),
        **({"cohort": cohort} if cohort is not None else {}),
    }
    path = f"api/kits/{urllib.parse.quote(kit, safe='')}/submissions"
    scored: dict[str, Any] = _call("POST", path, body, timeout=SCORING_TIMEOUT)
    return scored


def leaderboard(kit: str, cohort: str | None = None, by: str = "user") -> list[dict[str, Any]]:
    """The kit's leaderboard for ``cohort`` (None: the open one), by user or by team."""
    query = urllib.parse.urlencode({"by": by, **({"cohort": cohort} if cohort else {})})
    path = f"api/kits/{urllib.parse.quote(kit, safe='')}/leaderboard?{query}"
    standings: list[dict[str, Any]] = _call("GET", path)["standings"]
    return standings


def _gpus_path() -> str:
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    if not server:
        return "api/me/server/gpus"
    return f"api/me/servers/{urllib.parse.quote(server, safe='')}/gpus"


def _call(method: str, path: str, body: object = None, timeout: float = TIMEOUT) -> dict[str, Any]:
    base = os.environ.get("COMPOSE_PORTAL_URL")
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    if not base or not token:
        raise PortalError(
            "This is not a notebook the GPU hub started (no $COMPOSE_PORTAL_URL or"
            " $JUPYTERHUB_API_TOKEN): run it inside one."
        )
    request = urllib.request.Request(
        urllib.parse.urljoin(base.rstrip("/") + "/", path),
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: dict[str, Any] = json.load(response)
            return answer
    except urllib.error.HTTPError as e:
        raise PortalError(_message(e), status=e.code) from None
    except (urllib.error.URLError, TimeoutError) as e:
        raise PortalError(f"The GPU portal did not answer ({e}); try again.") from None


def _message(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(error)["message"])
    except (ValueError, KeyError, TypeError):
        return f"The GPU portal answered {error.code} {error.reason}."


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, rest = (args[0], args[1:]) if args else ("machine", [])
    try:
        if command == "machine":
            print(json.dumps(machine_json(), indent=2))
        elif command == "quota":
            print(json.dumps(quota(), indent=2))
        elif command == "use":
            print(json.dumps({**use(), "left": quota_left()}, indent=2))
        elif command == "grow":
            print(grow(int(rest[0]) if rest else 1))
        elif command == "shrink":
            print(shrink(rest[0] if rest else None))
        elif command == "keep":
            print(keep(rest[0] if rest else None))
        elif command == "manifest":
            print(json.dumps(manifest(), indent=2))
        else:
            print(
                "usage: python -m composespawner.client"
                " [machine|quota|use|grow N|shrink [ID]|keep [ID]|manifest]"
            )
            return 2
    except PortalError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
