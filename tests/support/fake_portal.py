"""A strict stand-in for the GPU portal's per-server GPU endpoints, for notebook-side tests.

It answers exactly what ``composespawner.client`` and the JupyterLab extension's server
side call for one server, in the portal's shapes (``portal/machine_views.py``
``resized``): ``GET``/``POST {gpus}``, ``DELETE {gpus}/{gpu}`` and ``POST
{gpus}/{gpu}/keep``, where ``{gpus}`` is ``api/me/server/gpus`` for the default server
and ``api/me/servers/<name>/gpus`` for a named one. Anything else (another path, method
or server, a wrong token, a body that is not what the portal takes) is refused as the
portal would and recorded in ``refused``, so a test can assert that nothing unexpected
was asked. Every accepted call is recorded in ``calls``.

Runs its own event loop in a thread, on 127.0.0.1 and a free port, for sync tests
(Playwright's): ``with FakePortal(token) as portal: ... portal.url``.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

START_TIMEOUT = 10.0  # seconds


@dataclass
class FakeGpu:
    id: str
    model: str
    idle_s: float | None = None
    warning: dict[str, Any] | None = None
    kept: int = 0


@dataclass
class PortalState:
    token: str
    server: str  # "" for the default server
    host: str
    gpus: list[FakeGpu]
    model: str = "T4"
    calls: list[tuple[str, str, object]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def machine_json(state: PortalState) -> dict[str, Any]:
    """The portal's answer for one server (``resized``), with the reclaim fields set."""
    gpus = []
    for gpu in state.gpus:
        entry: dict[str, Any] = {"id": gpu.id, "model": gpu.model}
        if gpu.idle_s is not None:
            entry["idle_s"] = gpu.idle_s
        if gpu.warning is not None:
            entry["warning"] = gpu.warning
        gpus.append(entry)
    uuids = ",".join(f"GPU-{g.id}" for g in state.gpus)
    return {
        "server": state.server,
        "machine": "machine-1",
        "state": "ready",
        "host": state.host,
        "zone": "zone-a",
        "size": None,
        "share": None,
        "gpu_share": 1,
        "since": "2026-01-01T00:00:00Z",
        "gpus": gpus,
        "devices": [{"id": g.id, "kind": "gpu", "model": g.model} for g in state.gpus],
        "environment": {
            "CUDA_VISIBLE_DEVICES": uuids,
            "COMPOSE_GPUS": str(len(state.gpus)),
            "COMPOSE_GPU_MODELS": ",".join(g.model for g in state.gpus),
            "COMPOSE_DEVICE_IDS": ",".join(g.id for g in state.gpus),
        },
        "next_step": f"Your server has {len(state.gpus)} GPU(s) now. Restart your kernel.",
    }


class PortalHandler(RequestHandler):
    def initialize(self, state: PortalState, lock: threading.Lock) -> None:
        self.state = state
        self.lock = lock

    def check_xsrf_cookie(self) -> None:
        """A token-authenticated API, as the portal's: no XSRF cookie."""

    def prepare(self) -> None:
        with self.lock:
            answer = self._answer()
        status, body = answer
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _refuse(self, status: int, why: str) -> tuple[int, dict[str, Any]]:
        self.state.refused.append(f"{self.request.method} {self.request.path}: {why}")
        return status, {"message": why}

    def _answer(self) -> tuple[int, dict[str, Any]]:
        if self.request.headers.get("Authorization") != f"token {self.state.token}":
            return self._refuse(403, "Not your token.")
        gpus = (
            "/api/me/server/gpus"
            if not self.state.server
            else f"/api/me/servers/{urllib.parse.quote(self.state.server, safe='')}/gpus"
        )
        method, path = self.request.method or "", self.request.path
        one = re.fullmatch(re.escape(gpus) + r"/([^/]+)(/keep)?", path)
        try:
            body = json.loads(self.request.body) if self.request.body else None
        except ValueError:
            return self._refuse(400, "The body is not JSON.")
        self.state.calls.append((method, path, body))
        if path == gpus and method == "GET" and body is None:
            return 200, machine_json(self.state)
        if path == gpus and method == "POST":
            return self._grow(body)
        if one is not None:
            gpu = urllib.parse.unquote(one.group(1))
            if one.group(2) and method == "POST":
                return self._keep(gpu)
            if not one.group(2) and method == "DELETE":
                return self._shrink(gpu)
        return self._refuse(404, f"No such endpoint: {method} {path}")

    def _grow(self, body: object) -> tuple[int, dict[str, Any]]:
        count = body.get("count") if isinstance(body, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            return self._refuse(400, "count: a whole number of GPUs, at least 1")
        start = len(self.state.gpus)
        self.state.gpus += [FakeGpu(f"gpu-{start + i}", self.state.model) for i in range(count)]
        return 200, machine_json(self.state)

    def _shrink(self, gpu_id: str) -> tuple[int, dict[str, Any]]:
        kept = [g for g in self.state.gpus if g.id != gpu_id]
        if len(kept) == len(self.state.gpus):
            return self._refuse(404, f"This server holds no GPU {gpu_id}.")
        self.state.gpus = kept
        return 200, machine_json(self.state)

    def _keep(self, gpu_id: str) -> tuple[int, dict[str, Any]]:
        gpu = next((g for g in self.state.gpus if g.id == gpu_id), None)
        if gpu is None:
            return self._refuse(404, f"This server holds no GPU {gpu_id}.")
        if self.request.body not in (b"", b"{}"):
            return self._refuse(400, "Keep takes no body.")
        gpu.kept += 1
        gpu.warning = None
        return 200, {"message": f"Kept {gpu.model} ({gpu.id}) for another hour."}


class FakePortal:
    """The fake portal for one server; ``update`` changes what it will answer next."""

    def __init__(self, token: str, server: str = "", host: str = "host-01", gpus: int = 1) -> None:
        self.state = PortalState(
            token, server, host, [FakeGpu(f"gpu-{i}", "T4") for i in range(gpus)]
        )
        self.lock = threading.Lock()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-portal", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def calls(self) -> list[tuple[str, str, object]]:
        with self.lock:
            return list(self.state.calls)

    def refused(self) -> list[str]:
        with self.lock:
            return list(self.state.refused)

    def gpus(self) -> list[FakeGpu]:
        with self.lock:
            return list(self.state.gpus)

    def warn(self, gpu_id: str, reclaim_at: float, keep_allowed: bool = True) -> None:
        """The reclaimer's warning for one GPU, as the portal will show it."""
        with self.lock:
            for gpu in self.state.gpus:
                if gpu.id == gpu_id:
                    gpu.warning = {
                        "reclaim_at": reclaim_at,
                        "keep_allowed": keep_allowed,
                        "message": f"Your {gpu.model} has done no work for 30 min.",
                    }

    def reset(self, gpus: int = 1) -> None:
        """Back to ``gpus`` fresh GPUs, no calls seen."""
        with self.lock:
            self.state.gpus = [FakeGpu(f"gpu-{i}", self.state.model) for i in range(gpus)]
            self.state.calls.clear()
            self.state.refused.clear()

    def grow_quietly(self) -> None:
        """One more GPU, as if grown elsewhere (another tab, ``client.grow()``)."""
        with self.lock:
            self.state.gpus.append(FakeGpu(f"gpu-{len(self.state.gpus)}", self.state.model))

    def take(self, gpu_id: str) -> None:
        """The GPU detached, as the reclaimer does: gone from the next answer."""
        with self.lock:
            self.state.gpus = [g for g in self.state.gpus if g.id != gpu_id]

    def idle(self, gpu_id: str, seconds: float) -> None:
        with self.lock:
            for gpu in self.state.gpus:
                if gpu.id == gpu_id:
                    gpu.idle_s = seconds

    def __enter__(self) -> FakePortal:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError("The fake portal did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = Application([(r"/.*", PortalHandler, {"state": self.state, "lock": self.lock})])
        sockets = bind_sockets(0, "127.0.0.1")
        self.port = int(sockets[0].getsockname()[1])
        server = HTTPServer(app)
        server.add_sockets(sockets)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.stop()
            await server.close_all_connections()
