"""Strict fakes at the reclaimer's two boundaries: GPU activity, and notebook servers' kernels.

``ScriptedActivity`` is an :class:`~composespawner.activity.ActivitySource` whose
readings the test sets host by host. It answers as the real sources do: keys are
normalised UUIDs (``gpu_uuid``), each matching its activity's ``uuid``, or the test
is refused; a host it has no reading for is unreadable, as a DCGM exporter without a
URL for it is.

``FakeKernels`` is Jupyter Server's ``/api/kernels`` behind JupyterHub's proxy, at
``/user/<name>/<server>/api/kernels``: the service token or 403; a server that is
not running answered 424 as the hub does; ``GET`` lists the kernel models,
``DELETE`` of one shuts it down (204) and of an unknown one is 404. It can be told
to answer every request with a status. Every request is recorded.
"""

from __future__ import annotations

import json
import ssl
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tornado.escape import url_unescape
from tornado.web import Application, RequestHandler

from composespawner.activity import ActivityUnreadable
from composespawner.domain.activity import ActivityReading, GpuActivity, gpu_uuid
from tests.support.loopback import LoopbackServer

TOKEN = "reclaimer-token-for-tests"


def idle(uuid: str, *, held: bool = False) -> GpuActivity:
    """A GPU doing no work: with a process holding it (``held``) or with none."""
    return GpuActivity(uuid, 0.0, 600.0 if held else 3.0, 1 if held else 0)


def busy(uuid: str) -> GpuActivity:
    return GpuActivity(uuid, 85.0, 9000.0, 1)


class ScriptedActivity:
    """An ActivitySource answering what the test set; ``reads`` counts reads per host."""

    def __init__(self) -> None:
        self._gpus: dict[str, dict[str, GpuActivity]] = {}
        self._failing: dict[str, str] = {}
        self.reads: Counter[str] = Counter()
        self.at = 0.0  # the time readings carry; the reclaimer goes by its own ``now``

    def set(self, host_id: str, *gpus: GpuActivity) -> None:
        """From now on ``host_id`` reads as these GPUs (replacing what it read before)."""
        for gpu in gpus:
            if gpu_uuid(gpu.uuid) != gpu.uuid:
                raise ValueError(
                    f"{gpu.uuid!r} is not as sources key GPUs ({gpu_uuid(gpu.uuid)!r})"
                )
        self._gpus[host_id] = {gpu.uuid: gpu for gpu in gpus}
        self._failing.pop(host_id, None)

    def fail(self, host_id: str, why: str = "HTTP 500 Internal Server Error") -> None:
        """From now on ``host_id`` cannot be read."""
        self._failing[host_id] = why

    async def read(self, host_id: str) -> ActivityReading:
        self.reads[host_id] += 1
        if host_id in self._failing:
            raise ActivityUnreadable(host_id, "scripted exporter", self._failing[host_id])
        if host_id not in self._gpus:
            raise ActivityUnreadable(host_id, "DCGM exporter", "no exporter URL configured")
        return ActivityReading(host_id, self.at, dict(self._gpus[host_id]))


@dataclass
class FakeKernels:
    """Running servers' kernels as a test sets them; every request recorded."""

    servers: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    answer_all: int | None = None  # every request answered with this status
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)

    def run(self, user: str, server: str, *kernel_ids: str) -> None:
        """``user``'s server runs with these kernels (idle, as after a cell ran)."""
        self.servers[(user, server)] = [
            {
                "id": k,
                "name": "python3",
                "last_activity": "2026-11-27T10:00:00.000000Z",
                "execution_state": "idle",
                "connections": 1,
            }
            for k in kernel_ids
        ]

    def kernel_ids(self, user: str, server: str) -> list[str]:
        return [k["id"] for k in self.servers.get((user, server), [])]

    def deletes(self) -> list[str]:
        return [path for method, path in self.requests if method == "DELETE"]

    def handle(self, method: str, user: str, server: str, kernel_id: str | None) -> tuple[int, Any]:
        kernels = self.servers.get((user, server))
        if kernels is None:  # the hub answers for a server that is not running
            return 424, {"status": 424, "message": f"{user}/{server} is not running"}
        if method == "GET" and kernel_id is None:
            return 200, kernels
        if method == "DELETE" and kernel_id is not None:
            if kernel_id not in self.kernel_ids(user, server):
                return 404, {"message": f"Kernel does not exist: {kernel_id}", "reason": None}
            kernels[:] = [k for k in kernels if k["id"] != kernel_id]
            return 204, None
        return 405, {"message": "Method Not Allowed"}


class _Handler(RequestHandler):
    """One route's shape: which of user, server and kernel its groups are."""

    def initialize(self, fake: FakeKernels, names: tuple[str, ...]) -> None:
        self.fake = fake
        self.names = names

    def _answer(self, *groups: str) -> None:
        method = self.request.method or ""
        self.fake.requests.append((method, self.request.path))
        found = {n: url_unescape(g, plus=False) for n, g in zip(self.names, groups, strict=True)}
        if self.fake.answer_all is not None:
            status, body = self.fake.answer_all, {"message": "scripted failure"}
        elif self.request.headers.get("Authorization") != f"token {TOKEN}":
            status, body = 403, {"message": "Forbidden"}
        else:
            user, server, kernel = found["user"], found.get("server", ""), found.get("kernel")
            status, body = self.fake.handle(method, user, server, kernel)
        self.set_status(status)
        if body is None:
            self.finish()
        else:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body))

    get = delete = _answer


class FakeKernelsServer(LoopbackServer):
    """Serves a :class:`FakeKernels` on a free port of 127.0.0.1, as the hub's proxy would."""

    def __init__(self, fake: FakeKernels, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls)
        self.fake = fake

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def application(self) -> Application:
        one = "([^/]+)"
        shapes = {
            f"/user/{one}/api/kernels/?": ("user",),
            f"/user/{one}/api/kernels/{one}": ("user", "kernel"),
            f"/user/{one}/{one}/api/kernels/?": ("user", "server"),
            f"/user/{one}/{one}/api/kernels/{one}": ("user", "server", "kernel"),
        }
        return Application(
            [(path, _Handler, {"fake": self.fake, "names": n}) for path, n in shapes.items()]
        )
