"""A small, strict, in-process JupyterHub REST API for the hub client's unit tests.

It answers as JupyterHub 6.1's ``apihandlers`` do, for the calls composespawner
makes: a token in ``Authorization`` or 403; ``GET /users`` and ``GET /groups``
paginated only when asked with the pagination media type (a bare list cut at
the page limit otherwise, as the hub answers clients older than 2.0), ``limit``
clamped to ``max_limit``, ``state`` one of active, ready, inactive or 400; a 404
for a user, group or named server it does not have; ``DELETE`` of a server that
is not running answered 204; ``POST`` of a running one 400 "already running".
It can be told to answer every request with a status (a crashing hub's 500 with
an HTML page), to hang until it is stopped, or to refuse one server's spawn as
a spawner would (its status and message).

``FakeHubAPI`` holds the state and answers requests as plain data; the tornado
handler around it only moves bytes or hangs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

from tornado.escape import url_unescape
from tornado.web import Application, RequestHandler

from tests.support.loopback import LoopbackServer

TOKEN = "service-token-for-tests"
PAGINATED = "application/jupyterhub-pagination+json"
PREFIX = "/hub/api"


@dataclass
class Reply:
    status: int
    body: Any = None
    content_type: str = "application/json"


@dataclass
class FakeServer:
    pending: str | None = None  # 'spawn' or 'stop'
    state: dict[str, Any] = field(default_factory=dict)  # the spawner's, as get_state keeps it


@dataclass
class FakeUser:
    groups: list[str] = field(default_factory=list)
    servers: dict[str, FakeServer] = field(default_factory=dict)  # the running ones
    named: set[str] = field(default_factory=set)  # named servers the hub knows, running or not


class FakeHubAPI:
    """Users, groups and servers as a test sets them; every request recorded."""

    def __init__(self, *, max_limit: int = 200, named_servers: bool = True) -> None:
        self.max_limit = max_limit
        self.named_servers = named_servers
        self.users: dict[str, FakeUser] = {}
        self.requests: list[tuple[str, str, str]] = []  # method, path?query (decoded), Accept
        self.answer_all: Reply | None = None  # a hub in trouble: this to every request
        self.hang = False  # never answer (until the server stops)
        self.refusals: dict[tuple[str, str], Reply] = {}  # a spawner's refusal of a spawn

    def add_user(self, name: str, *groups: str) -> FakeUser:
        self.users[name] = FakeUser(groups=list(groups))
        return self.users[name]

    def run(self, user: str, server: str = "", machine_id: str | None = None) -> None:
        state = {"compose": {"machine_id": machine_id}} if machine_id else {}
        self.users[user].servers[server] = FakeServer(state=state)
        if server:
            self.users[user].named.add(server)

    def handle(self, method: str, parts: list[str], query: dict[str, str], accept: str) -> Reply:
        """``parts``: the path below /hub/api, split at '/' and each part unquoted."""
        match method, parts:
            case "GET", ["users"]:
                state = query.get("state")
                if state not in (None, "active", "ready", "inactive"):
                    return _error(400, f"Unrecognized state filter: {state!r}")
                return self.page(query, accept, self.user_models(state))
            case "GET", ["users", name]:
                user = self.users.get(name)
                return Reply(200, self.user_model(name)) if user else _error(404, "Not Found")
            case "GET", ["groups"]:
                return self.page(query, accept, self.group_models())
            case "GET", ["groups", name]:
                models = [g for g in self.group_models() if g["name"] == name]
                return Reply(200, models[0]) if models else _error(404, "Not Found")
            case "DELETE", ["users", name, "server"] | ["users", name, "servers", _]:
                return self.stop(name, parts[3] if len(parts) == 4 else "")
            case "POST", ["users", name, "server"] | ["users", name, "servers", _]:
                return self.start(name, parts[3] if len(parts) == 4 else "")
        return _error(404, "Not Found")

    def page(self, query: dict[str, str], accept: str, items: list[dict[str, Any]]) -> Reply:
        """One page, as ``APIHandler.get_api_pagination`` and ``paginated_model`` make it."""
        paginated = PAGINATED in {a.strip().lower() for a in accept.split(",")}
        try:
            offset = abs(int(query.get("offset", 0)))
            limit = abs(int(query.get("limit", 50 if paginated else self.max_limit)))
        except ValueError:
            return _error(400, "Invalid argument type, offset and limit must be integers")
        limit = max(1, min(limit, self.max_limit))
        shown = items[offset : offset + limit]
        if not paginated:
            return Reply(200, shown)
        following = None
        if offset + limit < len(items):
            again = {**query, "offset": str(offset + limit), "limit": str(limit)}
            url = f"http://127.0.0.1{PREFIX}/users?{urlencode(again)}"
            following = {"offset": offset + limit, "limit": limit, "url": url}
        pagination = {"offset": offset, "limit": limit, "total": len(items), "next": following}
        return Reply(200, {"items": shown, "_pagination": pagination})

    def user_models(self, state: str | None) -> list[dict[str, Any]]:
        """Every user, or those with (active) or without (inactive) a server."""
        return [
            self.user_model(name)
            for name, user in self.users.items()
            if state is None or bool(user.servers) == (state != "inactive")
        ]

    def user_model(self, name: str) -> dict[str, Any]:
        user = self.users[name]
        servers = {
            server: {"name": server, "pending": s.pending, "ready": not s.pending, "state": s.state}
            for server, s in user.servers.items()
        }
        return {"kind": "user", "name": name, "groups": user.groups, "servers": servers}

    def group_models(self) -> list[dict[str, Any]]:
        groups: dict[str, list[str]] = {}
        for name, user in self.users.items():
            for group in user.groups:
                groups.setdefault(group, []).append(name)
        return [{"kind": "group", "name": g, "users": users} for g, users in groups.items()]

    def stop(self, name: str, server: str) -> Reply:
        user = self.users.get(name)
        if user is None:
            return _error(404, "Not Found")
        if server and not self.named_servers:
            return _error(400, "Named servers are not enabled.")
        if server and server not in user.named:
            return _error(404, f"{name} has no server named '{server}'")
        running = user.servers.pop(server, None)
        if running is not None and running.pending is None:
            return Reply(202, None, "text/plain")  # the hub stops it in the background
        return Reply(204, None, "text/plain")

    def start(self, name: str, server: str) -> Reply:
        user = self.users.get(name)
        if user is None:
            return _error(404, "Not Found")
        if server in user.servers:
            return _error(400, f"{name}:{server} is already running")
        refusal = self.refusals.get((name, server))
        if refusal is not None:
            return refusal
        self.run(name, server)
        return Reply(201, None, "text/plain")


def _error(status: int, message: str) -> Reply:
    return Reply(status, {"status": status, "message": message})


class _Handler(RequestHandler):
    hub: FakeHubAPIServer

    def initialize(self, hub: FakeHubAPIServer) -> None:
        self.hub = hub

    async def _answer(self) -> None:
        api, request = self.hub.api, self.request
        method, accept = request.method or "", request.headers.get("Accept", "")
        below = request.path[len(PREFIX) :].strip("/")
        parts = [url_unescape(p, plus=False) for p in below.split("/")]
        query = {k: v[-1] for k, v in parse_qs(request.query).items()}
        asked = "/" + "/".join(parts) + (f"?{request.query}" if request.query else "")
        api.requests.append((method, asked, accept))
        if api.hang:
            await self.hub.released.wait()
            self.request.connection.detach().close()  # type: ignore[union-attr]
            self._finished = True  # nothing more may be written to a dropped connection
            return
        if api.answer_all is not None:
            reply = api.answer_all
        elif request.headers.get("Authorization") != f"token {TOKEN}":
            reply = _error(403, "Missing or invalid credentials")
        elif not request.path.startswith(PREFIX + "/"):
            reply = _error(404, "Not Found")
        else:
            reply = api.handle(method, parts, query, accept)
        self._write(reply)

    def _write(self, reply: Reply) -> None:
        self.set_status(reply.status)
        self.set_header("Content-Type", reply.content_type)
        if reply.body is None:
            self.finish()
        else:
            body = reply.body
            self.finish(body if isinstance(body, str) else json.dumps(body))

    get = post = delete = _answer


class FakeHubAPIServer(LoopbackServer):
    """Serves a :class:`FakeHubAPI` on a free port of 127.0.0.1, at /hub/api."""

    def __init__(self, api: FakeHubAPI) -> None:
        super().__init__()
        self.api = api

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{PREFIX}"

    def application(self) -> Application:
        return Application([(r".*", _Handler, {"hub": self})])
