"""A small, strict, in-process Redfish service for the client's unit tests.

It answers like a real CompositionService would (sessions with 201 +
X-Auth-Token + Location, ETags that change on every write, 412 on a stale
ETag, 428 without one, 409 ResourceBlockInUse, Redfish error bodies), and it
can be told to misbehave for the next few requests to one path: answer a
status (503 ...), drop the connection, drop it after doing the work (a lost
answer), never answer, or run the work as a 202 task.

``FakeRedfish`` holds the state and answers requests as plain data; the
tornado handler around it only moves bytes, drops or hangs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from tornado.web import Application, RequestHandler

from tests.support.loopback import LoopbackServer

USER, PASSWORD = "hubadmin", "s3cret-pass"
BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
SYSTEMS = "/redfish/v1/Systems"
SESSIONS = "/redfish/v1/SessionService/Sessions"
MONITORS = "/redfish/v1/TaskService/TaskMonitors"
ADD = "Actions/ComputerSystem.AddResourceBlock"
REMOVE = "Actions/ComputerSystem.RemoveResourceBlock"


def error_body(message_id: str, message: str = "refused") -> dict[str, Any]:
    return {
        "error": {
            "code": "Base.1.22.1.GeneralError",
            "message": "See ExtendedInfo.",
            "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}],
        }
    }


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


FaultKind = Literal["status", "drop", "lost_answer", "hang", "task"]


@dataclass
class Fault:
    """Misbehave on the next ``times`` requests ``method path``."""

    method: str
    path: str
    kind: FaultKind
    times: int = 1
    reply: Reply | None = None  # for "status"; for "task": the monitor's final answer
    polls: int = 2  # for "task": how many 202s the monitor gives first
    task_body: Any = None  # for "task": what each 202 poll carries


@dataclass
class _Monitor:
    polls_left: int
    final: Reply
    running_body: Any


class FakeRedfish:
    """Two expandable hosts in one zone, three GPUs; gpu-3 is on host-2."""

    def __init__(self, *, sessions: bool = True) -> None:
        self.sessions_supported = sessions
        self.tokens: dict[str, str] = {}  # token -> session id
        self.logins = 0
        self.logouts: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self.action_payloads: list[Any] = []
        self.faults: list[Fault] = []
        self.monitors: dict[str, _Monitor] = {}
        self.attached: dict[str, list[str]] = {"host-1": [], "host-2": ["gpu-3"]}
        self.versions: dict[str, int] = {"host-1": 1, "host-2": 1}
        self.oem: dict[str, dict[str, Any]] = {"host-1": {}, "host-2": {}}
        self.gpus = ("gpu-1", "gpu-2", "gpu-3")
        # A PATCH answers 204 by default; with this, 200 and the system as it left it.
        self.patch_answers_resource = False
        self.latency = 0.0  # seconds each answer takes, as a busy service's would
        self.in_flight = 0
        self.most_in_flight = 0

    # -- faults ----------------------------------------------------------------------------

    def fail(self, fault: Fault) -> None:
        self.faults.append(fault)

    def take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and fault.path == path and fault.times > 0:
                fault.times -= 1
                return fault
        return None

    def expire_sessions(self) -> None:
        self.tokens.clear()

    # -- dispatch --------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: dict[str, str], payload: Any) -> Reply:
        path = path.rstrip("/") or "/"
        if path == "/redfish/v1":
            return Reply(200, self.service_root())
        if method == "POST" and path == SESSIONS:
            return self.login(payload)
        if not self.authorized(headers):
            return Reply(401, error_body("Base.1.22.1.NoValidSession", "log in"))
        if method == "DELETE" and path.startswith(SESSIONS + "/"):
            return self.logout(path)
        if path.startswith(MONITORS + "/"):
            return self.poll(path)
        if method == "GET":
            return self.get(path)
        if method == "PATCH" and path.startswith(SYSTEMS + "/"):
            return self.patch_system(path.rsplit("/", 1)[-1], headers, payload)
        if method == "POST":
            return self.action(path, payload)
        return Reply(405, error_body("Base.1.22.1.OperationNotAllowed"))

    def authorized(self, headers: dict[str, str]) -> bool:
        if self.sessions_supported:
            return headers.get("X-Auth-Token") in self.tokens
        basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return headers.get("Authorization") == f"Basic {basic}"

    # -- sessions --------------------------------------------------------------------------

    def login(self, payload: Any) -> Reply:
        if not self.sessions_supported:
            return Reply(405, error_body("Base.1.22.1.OperationNotAllowed"))
        if payload != {"UserName": USER, "Password": PASSWORD}:
            return Reply(401, error_body("Base.1.22.1.ResourceAtUriUnauthorized"))
        self.logins += 1
        session_id = str(self.logins)
        token = f"token-{session_id}-abcdef"
        self.tokens[token] = session_id
        location = f"{SESSIONS}/{session_id}"
        body = {"@odata.id": location, "Id": session_id, "UserName": USER}
        return Reply(201, body, {"X-Auth-Token": token, "Location": location})

    def logout(self, path: str) -> Reply:
        session_id = path.rsplit("/", 1)[-1]
        self.tokens = {t: s for t, s in self.tokens.items() if s != session_id}
        self.logouts.append(session_id)
        return Reply(204)

    # -- reading ---------------------------------------------------------------------------

    def service_root(self) -> dict[str, Any]:
        return {
            "@odata.id": "/redfish/v1/",
            "Id": "RootService",
            "Systems": {"@odata.id": SYSTEMS},
            "CompositionService": {"@odata.id": "/redfish/v1/CompositionService"},
            "Links": {"Sessions": {"@odata.id": SESSIONS}},
        }

    def get(self, path: str) -> Reply:
        documents = {
            "/redfish/v1/CompositionService": {
                "@odata.id": "/redfish/v1/CompositionService",
                "ResourceBlocks": {"@odata.id": BLOCKS},
                "ResourceZones": {"@odata.id": "/redfish/v1/CompositionService/ResourceZones"},
            },
            BLOCKS: _collection(BLOCKS, ["host-1-block", "host-2-block", *self.gpus]),
            "/redfish/v1/CompositionService/ResourceZones": _collection(
                "/redfish/v1/CompositionService/ResourceZones", ["zone-a"]
            ),
            "/redfish/v1/CompositionService/ResourceZones/zone-a": {
                "@odata.id": "/redfish/v1/CompositionService/ResourceZones/zone-a",
                "Id": "zone-a",
                "ZoneType": "ZoneOfResourceBlocks",
            },
            SYSTEMS: _collection(SYSTEMS, list(self.attached)),
        }
        if path in documents:
            return Reply(200, documents[path])
        if (block := _child(path, BLOCKS)) is not None:
            return self.get_block(block)
        if (processor := re.fullmatch(rf"{BLOCKS}/(gpu-\d)/Processors/GPU", path)) is not None:
            return self.get_gpu_processor(processor.group(1))
        if (system := _child(path, SYSTEMS)) is not None and system in self.attached:
            return Reply(200, self.system(system), {"ETag": self.etag(system)})
        return Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", path))

    def get_block(self, block_id: str) -> Reply:
        if block_id.endswith("-block") and block_id.removesuffix("-block") in self.attached:
            system = block_id.removesuffix("-block")
            return Reply(200, _block(block_id, ["ComputerSystem"], system, parts={}))
        if block_id not in self.gpus:
            return Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", block_id))
        holder = self.holder(block_id)
        processors = [{"@odata.id": f"{BLOCKS}/{block_id}/Processors/GPU"}]
        return Reply(200, _block(block_id, ["Processor"], holder, {"Processors": processors}))

    def get_gpu_processor(self, block_id: str) -> Reply:
        return Reply(
            200,
            {
                "@odata.id": f"{BLOCKS}/{block_id}/Processors/GPU",
                "Id": "GPU",
                "ProcessorType": "GPU",
                "Model": "Fake GPU 40GB",
                "ProcessorMemory": [{"CapacityMiB": 40960}],
            },
        )

    def holder(self, block_id: str) -> str | None:
        return next((s for s, blocks in self.attached.items() if block_id in blocks), None)

    def etag(self, system_id: str) -> str:
        return f'W/"{system_id}-{self.versions[system_id]}"'

    def system(self, system_id: str) -> dict[str, Any]:
        uri = f"{SYSTEMS}/{system_id}"
        blocks = [f"{system_id}-block", *self.attached[system_id]]
        document: dict[str, Any] = {
            "@odata.id": uri,
            "@odata.etag": self.etag(system_id),
            "Id": system_id,
            "Composition": {"UseCases": ["ExpandableSystem"]},
            "ProcessorSummary": {"Count": 32},
            "MemorySummary": {"TotalSystemMemoryGiB": 256},
            "Status": {"State": "Enabled"},
            "Links": {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/{b}"} for b in blocks]},
            "Actions": {
                "#ComputerSystem.AddResourceBlock": {"target": f"{uri}/{ADD}"},
                "#ComputerSystem.RemoveResourceBlock": {"target": f"{uri}/{REMOVE}"},
            },
        }
        if self.oem[system_id]:
            document["Oem"] = self.oem[system_id]
        return document

    # -- writing ---------------------------------------------------------------------------

    def action(self, path: str, payload: Any) -> Reply:
        match = re.fullmatch(rf"{SYSTEMS}/([^/]+)/({ADD}|{REMOVE})", path)
        if match is None or match.group(1) not in self.attached:
            return Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", path))
        system_id = match.group(1)
        self.action_payloads.append(payload)
        etag = payload.get("ComputerSystemETag")
        if etag is not None and etag != self.etag(system_id):
            return Reply(412, error_body("Base.1.22.1.PreconditionFailed", "stale ETag"))
        block_id = str(payload.get("ResourceBlock", {}).get("@odata.id", "")).rsplit("/", 1)[-1]
        if block_id not in self.gpus:
            return Reply(404, error_body("Composition.1.1.3.ResourceBlockNotFound", block_id))
        if match.group(2) == ADD:
            return self.add(system_id, block_id)
        return self.remove(system_id, block_id)

    def add(self, system_id: str, block_id: str) -> Reply:
        holder = self.holder(block_id)
        if holder == system_id:
            return Reply(204)
        if holder is not None:
            return Reply(409, error_body("Composition.1.1.3.ResourceBlockInUse", block_id))
        self.attached[system_id].append(block_id)
        self.versions[system_id] += 1
        if self.patch_answers_resource:
            return Reply(200, self.system(system_id), {"ETag": self.etag(system_id)})
        return Reply(204)

    def remove(self, system_id: str, block_id: str) -> Reply:
        if block_id not in self.attached[system_id]:
            return Reply(400, error_body("Composition.1.1.3.ResourceBlockNotFound", block_id))
        self.attached[system_id].remove(block_id)
        self.versions[system_id] += 1
        if self.patch_answers_resource:
            return Reply(200, self.system(system_id), {"ETag": self.etag(system_id)})
        return Reply(204)

    def patch_system(self, system_id: str, headers: dict[str, str], payload: Any) -> Reply:
        if system_id not in self.attached:
            return Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", system_id))
        if "If-Match" not in headers:
            return Reply(428, error_body("Base.1.22.1.PreconditionRequired", "send If-Match"))
        if headers["If-Match"] != self.etag(system_id):
            return Reply(412, error_body("Base.1.22.1.PreconditionFailed", "stale ETag"))
        for key, value in payload.get("Oem", {}).items():
            if value is None:
                self.oem[system_id].pop(key, None)
            else:
                self.oem[system_id][key] = value
        self.versions[system_id] += 1
        if self.patch_answers_resource:
            return Reply(200, self.system(system_id), {"ETag": self.etag(system_id)})
        return Reply(204)

    # -- tasks -----------------------------------------------------------------------------

    def start_task(self, fault: Fault, outcome: Reply) -> Reply:
        monitor = f"{MONITORS}/{len(self.monitors) + 1}"
        final = fault.reply if fault.reply is not None else outcome
        self.monitors[monitor] = _Monitor(fault.polls, final, fault.task_body)
        return Reply(202, fault.task_body, {"Location": monitor, "Retry-After": "0"})

    def poll(self, path: str) -> Reply:
        monitor = self.monitors.get(path)
        if monitor is None:
            return Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", path))
        if monitor.polls_left > 0:
            monitor.polls_left -= 1
            return Reply(202, monitor.running_body, {"Retry-After": "0"})
        return monitor.final


def _collection(uri: str, member_ids: list[str]) -> dict[str, Any]:
    return {
        "@odata.id": uri,
        "Members@odata.count": len(member_ids),
        "Members": [{"@odata.id": f"{uri}/{m}"} for m in member_ids],
    }


def _child(path: str, collection: str) -> str | None:
    match = re.fullmatch(rf"{re.escape(collection)}/([^/]+)", path)
    return match.group(1) if match else None


def _block(
    block_id: str, types: list[str], holder: str | None, parts: dict[str, Any]
) -> dict[str, Any]:
    systems = [{"@odata.id": f"{SYSTEMS}/{holder}"}] if holder else []
    return {
        "@odata.id": f"{BLOCKS}/{block_id}",
        "Id": block_id,
        "ResourceBlockType": types,
        "Status": {"State": "Enabled"},
        "CompositionStatus": {
            "Reserved": False,
            "CompositionState": "Composed" if holder else "Unused",
        },
        "Links": {
            "ComputerSystems": systems,
            "Chassis": [{"@odata.id": "/redfish/v1/Chassis/drawer-1"}],
            "Zones": [{"@odata.id": "/redfish/v1/CompositionService/ResourceZones/zone-a"}],
        },
        **parts,
    }


class _Handler(RequestHandler):
    service: FakeRedfish
    server: FakeRedfishServer

    def initialize(self, server: FakeRedfishServer) -> None:
        self.server = server
        self.service = server.service

    async def _answer(self) -> None:
        self.service.in_flight += 1
        self.service.most_in_flight = max(self.service.most_in_flight, self.service.in_flight)
        try:
            if self.service.latency:
                await asyncio.sleep(self.service.latency)
            await self._answer_now()
        finally:
            self.service.in_flight -= 1

    async def _answer_now(self) -> None:
        method, path = self.request.method or "", self.request.path
        self.service.requests.append((method, self.request.uri or ""))
        fault = self.service.take_fault(method, path)
        if fault is not None and fault.kind in ("drop", "hang"):
            await self._misbehave(fault.kind)
            return
        if fault is not None and fault.kind == "status" and fault.reply is not None:
            self._write(fault.reply)
            return
        payload = json.loads(self.request.body) if self.request.body else None
        reply = self.service.handle(method, path, dict(self.request.headers), payload)
        if fault is not None and fault.kind == "lost_answer":
            await self._misbehave("drop")
        elif fault is not None and fault.kind == "task":
            self._write(self.service.start_task(fault, reply))
        else:
            self._write(reply)

    async def _misbehave(self, kind: str) -> None:
        if kind == "hang":
            await self.server.released.wait()
        self.request.connection.detach().close()  # type: ignore[attr-defined]
        self._finished = True  # nothing more may be written to a dropped connection

    def _write(self, reply: Reply) -> None:
        self.set_status(reply.status)
        for name, value in reply.headers.items():
            self.set_header(name, value)
        if reply.body is not None:
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(reply.body))
        else:
            self.finish()

    get = post = patch = delete = _answer


class FakeRedfishServer(LoopbackServer):
    """Serves a :class:`FakeRedfish` on a free port of 127.0.0.1."""

    def __init__(self, service: FakeRedfish) -> None:
        super().__init__()
        self.service = service

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def application(self) -> Application:
        return Application([(r".*", _Handler, {"server": self})])
