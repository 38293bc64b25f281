"""Test harness for the fabric simulator: a real simulator process and a small HTTP client.

The simulator runs as a subprocess on a free port, exactly as the hub would
start it (harness/simulator.py polls its readiness with a deadline), and
the fixtures in ``conftest.py`` stop every process they start.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from harness import simulator as support
from harness.paths import SHARED
from harness.simulator import CREDENTIALS

USERNAME, PASSWORD = CREDENTIALS
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
SYSTEMS = "/redfish/v1/Systems"


def shared_dir() -> Path:
    """The ``shared`` folder beside the repository root (DMTF schemas, registries)."""
    return SHARED


def block_ref(block_id: str) -> dict[str, Any]:
    return {"ResourceBlock": {"@odata.id": f"{BLOCKS}/{block_id}"}}


def action(system_id: str, name: str) -> str:
    return f"{SYSTEMS}/{system_id}/Actions/ComputerSystem.{name}"


@dataclass
class Response:
    status: int
    headers: Message
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def message_ids(self) -> list[str]:
        infos = self.json["error"]["@Message.ExtendedInfo"]
        return [info["MessageId"] for info in infos]


class RedfishClient:
    """Just enough HTTP to poke the simulator: Basic auth unless told otherwise."""

    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.tls = tls

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        timeout: float = 10.0,
    ) -> Response:
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if auth and "X-Auth-Token" not in all_headers:
            token = base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
            all_headers["Authorization"] = f"Basic {token}"
        payload = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection = (
            http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.tls)
            if self.tls
            else http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        )
        try:
            connection.request(method, path, body=payload, headers=all_headers)
            answer = connection.getresponse()
            return Response(answer.status, answer.headers, answer.read())
        finally:
            connection.close()

    def get(self, path: str, **kwargs: Any) -> Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Response:
        return self.request("POST", path, body, **kwargs)

    def patch(self, path: str, body: Any = None, **kwargs: Any) -> Response:
        return self.request("PATCH", path, body, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> Response:
        return self.request("PUT", path, body, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Response:
        return self.request("DELETE", path, **kwargs)

    def attach(self, system_id: str, block_id: str, **extra: Any) -> Response:
        return self.post(action(system_id, "AddResourceBlock"), {**block_ref(block_id), **extra})

    def detach(self, system_id: str, block_id: str, **extra: Any) -> Response:
        return self.post(action(system_id, "RemoveResourceBlock"), {**block_ref(block_id), **extra})

    def faults(self, **settings: Any) -> Response:
        answer = self.put("/sim/faults", settings, auth=False)
        assert answer.status == 200, answer.body
        return answer

    def sim_state(self) -> dict[str, Any]:
        return self.get("/sim/state", auth=False).json


def poll_monitor(client: RedfishClient, monitor: str, deadline_s: float = 10.0) -> Response:
    """Poll a task monitor until it stops answering 202; its final answer."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        answer = client.get(monitor)
        if answer.status != 202:
            return answer
        assert int(answer.headers["Retry-After"]) >= 1
        time.sleep(0.05)  # polling a condition faster than Retry-After, for speed
    raise AssertionError(f"task monitor {monitor} still running after {deadline_s}s")


class SimulatorProcess(support.SimulatorProcess):
    """The shared simulator process (harness/simulator.py), with a client of its own.

    With ``tls`` it serves https with that certificate, and its client trusts the CA.
    """

    @property
    def client(self) -> RedfishClient:
        return RedfishClient(self.port, self.tls.client_context() if self.tls else None)


StartSimulator = Callable[..., SimulatorProcess]
