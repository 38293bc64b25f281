"""Podman's own REST API (libpod), over its Unix socket: the calls the container launcher
makes, each with a timeout.

A notebook's container is created and started by ``podman system service``, one
long-lived process that has podman's storage and database open, as DockerSpawner
asks Docker's daemon: a ``podman run`` per notebook would start podman afresh each
time (its configuration, storage and database opened under their lock, about 0.05
CPU-seconds more a container here), and stay beside the notebook all its life.

Where the site runs podman's socket (``podman.socket``, ``/run/podman/podman.sock``)
the launcher uses it; otherwise the hub runs its own service on a socket of its own
(:class:`OwnPodmanService`), which ends with the hub. Containers outlive either: each
has its own monitor (conmon), and a hub started again finds its notebooks by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

import aiohttp

API = "http://podman/v4.0.0/libpod"  # the host part is not used on a Unix socket
CALL_TIMEOUT = 60.0  # seconds for a call that does not wait for a container's end
SERVICE_START_TIMEOUT = 30.0  # seconds for the hub's own service to answer
PR_SET_PDEATHSIG = 1
Log = logging.Logger | logging.LoggerAdapter[Any]


class PodmanError(Exception):
    """A podman call failed or timed out; the message says which and why."""


class NoSuchContainer(PodmanError):
    """Podman has no container by that name (removed, or never made)."""


class PodmanAPI:
    """The libpod calls of one podman service, at ``socket``."""

    # One connection pool per socket and event loop, shared by every launcher.
    _sessions: ClassVar[dict[tuple[str, int], aiohttp.ClientSession]] = {}

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def _session(self) -> aiohttp.ClientSession:
        key = (self.socket, id(asyncio.get_running_loop()))
        session = self._sessions.get(key)
        if session is None or session.closed:
            connector = aiohttp.UnixConnector(path=self.socket, limit=0)
            session = self._sessions[key] = aiohttp.ClientSession(connector=connector)
        return session

    async def call(
        self,
        method: str,
        path: str,
        *,
        within: float = CALL_TIMEOUT,
        params: Mapping[str, str] | list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> tuple[int, bytes]:
        """The status and body of one request; PodmanError for a 5xx, a 4xx other than
        404, no answer within ``within`` seconds, or no service on the socket."""
        what = f"{method} {path}"
        try:
            async with self._session().request(
                method,
                f"{API}{path}",
                params=params,
                json=body,
                timeout=aiohttp.ClientTimeout(total=within),
            ) as response:
                content = await response.read()
        except TimeoutError:
            raise PodmanError(f"podman's {what} took more than {within:.0f} s") from None
        except aiohttp.ClientError as e:
            raise PodmanError(f"podman's service at {self.socket} did not answer: {e}") from e
        if response.status >= 400 and response.status != 404:
            raise PodmanError(f"podman's {what} failed ({response.status}): {_said(content)}")
        return response.status, content

    async def answers(self) -> bool:
        """Whether a podman service answers on the socket."""
        with contextlib.suppress(PodmanError):
            status, _ = await self.call("GET", "/_ping", within=5)
            return status == 200
        return False

    # -- images ----------------------------------------------------------------

    async def image_exists(self, image: str) -> bool:
        status, _ = await self.call("GET", f"/images/{quote(image, safe='')}/exists")
        return status == 204

    async def pull(self, image: str, within: float) -> None:
        """Pull ``image``; the stream's error, if it has one, as PodmanError."""
        params = {"reference": image, "quiet": "true", "policy": "always"}
        _, content = await self.call("POST", "/images/pull", within=within, params=params)
        for line in content.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                said = json.loads(line)
                if isinstance(said, dict) and said.get("error"):
                    raise PodmanError(f"podman could not pull {image}: {said['error']}")

    # -- containers ------------------------------------------------------------

    async def create(self, spec: Mapping[str, Any]) -> None:
        status, content = await self.call("POST", "/containers/create", body=spec)
        if status == 404:
            raise PodmanError(f"podman cannot create {spec.get('name')}: {_said(content)}")

    async def start(self, name: str) -> None:
        status, content = await self.call("POST", f"/containers/{quote(name)}/start")
        if status == 404:
            raise NoSuchContainer(f"no container {name} to start: {_said(content)}")

    async def inspect(self, name: str) -> dict[str, Any] | None:
        """The container's description, or None where there is none by that name."""
        status, content = await self.call("GET", f"/containers/{quote(name)}/json")
        if status == 404:
            return None
        found = json.loads(content)
        return found if isinstance(found, dict) else None

    async def wait(self, name: str, within: float) -> int:
        """The container's exit status, once it has ended."""
        conditions = [("condition", "stopped"), ("condition", "exited")]
        status, content = await self.call(
            "POST", f"/containers/{quote(name)}/wait", within=within, params=conditions
        )
        if status == 404:
            raise NoSuchContainer(f"no container {name} to wait for")
        return int(json.loads(content))

    async def stop(self, name: str, seconds: int) -> None:
        """SIGTERM (the container's stop signal), SIGKILL after ``seconds``; done when it
        has ended. Nothing to stop is not an error."""
        await self.call(
            "POST",
            f"/containers/{quote(name)}/stop",
            within=seconds + CALL_TIMEOUT,
            params={"timeout": str(seconds)},
        )

    async def remove(self, name: str) -> None:
        """Remove the container, killed first if it runs; one not there is not an error."""
        await self.call(
            "DELETE",
            f"/containers/{quote(name)}",
            params={"force": "true", "timeout": "0", "ignore": "true"},
        )

    async def logs_tail(self, name: str, lines: int) -> str:
        """The container's last ``lines`` lines of output (both streams), as text."""
        params = {"stdout": "true", "stderr": "true", "tail": str(lines)}
        status, content = await self.call("GET", f"/containers/{quote(name)}/logs", params=params)
        return "" if status == 404 else _demultiplexed(content)

    @classmethod
    async def close_all(cls) -> None:
        """Close this event loop's connection pools (a hub's end, a test's)."""
        loop = id(asyncio.get_running_loop())
        for key in [key for key in cls._sessions if key[1] == loop]:
            await cls._sessions.pop(key).close()


class OwnPodmanService:
    """The hub's own ``podman system service``, where the site runs none: started at
    the first notebook, on a socket only root may open, and ended with the hub (the
    kernel sends it SIGTERM when the hub's process ends, however it ends)."""

    _processes: ClassVar[dict[str, subprocess.Popen[bytes]]] = {}
    _starting: ClassVar[dict[str, asyncio.Future[None]]] = {}

    @classmethod
    async def ensure(cls, podman: str, socket: str, log: Log) -> None:
        """A service answering at ``socket``: the one started before while it runs, or
        one started now (one for every caller meanwhile), said in ``log``."""
        process = cls._processes.get(socket)
        if process is not None and process.poll() is None:
            return
        starting = cls._starting.get(socket)
        if starting is None or starting.done():
            starting = asyncio.ensure_future(cls._start(podman, socket, log))
            cls._starting[socket] = starting
        await asyncio.shield(starting)

    @classmethod
    async def _start(cls, podman: str, socket: str, log: Log) -> None:
        await asyncio.to_thread(_clear_socket, Path(socket))
        process = _service_process(podman, socket)
        api = PodmanAPI(socket)
        deadline = asyncio.get_running_loop().time() + SERVICE_START_TIMEOUT
        while not await api.answers():
            if process.poll() is not None:
                raise PodmanError(f"podman's service exited ({process.returncode})")
            if asyncio.get_running_loop().time() > deadline:
                process.kill()
                process.wait()
                raise PodmanError(f"podman's service did not answer on {socket}")
            await asyncio.sleep(0.05)  # polling the socket: the condition itself
        cls._processes[socket] = process
        log.info("podman's service for notebooks runs on %s (pid %d)", socket, process.pid)

    @classmethod
    def stop_all(cls) -> None:
        """End every service this process started (a test's end; a hub's comes with it)."""
        for process in cls._processes.values():
            process.terminate()
        for process in cls._processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(SERVICE_START_TIMEOUT)
        cls._processes.clear()
        cls._starting.clear()


def _service_process(podman: str, socket: str) -> subprocess.Popen[bytes]:
    """``podman system service`` on ``socket``, for good, ended with this process.

    Started on the event loop's thread, not a worker's: the death signal comes when
    the thread that started the process ends, and this one lasts as long as the hub.
    """
    return subprocess.Popen(
        [podman, "system", "service", "--time=0", f"unix://{socket}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        preexec_fn=_end_with_parent,
    )


def _clear_socket(path: Path) -> None:
    """The socket's folder, root's alone, without a dead service's socket in it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


def _end_with_parent() -> None:
    """In the service's process before exec: SIGTERM when the hub ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the hub ended already
        os._exit(1)


def _said(content: bytes) -> str:
    """Podman's own words from an error body (``{"cause": …, "message": …}``)."""
    text = content.decode(errors="replace")
    with contextlib.suppress(ValueError):
        found = json.loads(text)
        if isinstance(found, dict) and found.get("message"):
            return str(found["message"])[-500:]
    return text.strip()[-500:]


def _demultiplexed(content: bytes) -> str:
    """The text of a log stream in Docker's framing (8-byte headers: stream, 0, 0, 0,
    length), which podman uses for a container without a terminal."""
    out, at = [], 0
    while at + 8 <= len(content):
        length = int.from_bytes(content[at + 4 : at + 8], "big")
        out.append(content[at + 8 : at + 8 + length])
        at += 8 + length
    return b"".join(out).decode(errors="replace")
