"""A tiny read-only Redfish server for a DMTF mockup directory (tornado).

DMTF publishes Redfish mockups as directory trees: ``/redfish/v1/X`` lives in
``<dir>/X/index.json``, the service root in ``<dir>/index.json`` and the CSDL
document ``$metadata`` in ``<dir>/$metadata/index.xml``. This serves such a
tree, for tests and for poking at a mockup by hand::

    python -m tests.support.mockserver ../shared/redfish/mockups/public-composability \\
        --port 8000

It is static: every write (POST, PATCH, PUT, DELETE) is answered ``405`` with a
Redfish error body, as a service that forbids the method would. Two optional
behaviours make it usable as a test double for a client:

- ``expand``: answer ``$expand=.($levels=N)`` by inlining subordinate
  resources N levels deep (collection members first), as the mockup's service
  root says the service can;
- ``credentials``: require HTTP Basic auth everywhere except the service root,
  ``/redfish`` and ``$metadata`` (which Redfish serves unauthenticated).

Every request is recorded in ``MockupServer.requests`` as ``(method, uri)``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

# The simulator's $expand, not the client's: a double sharing the client's code
# could not catch the client's mistakes.
from fabricsim.expand import expand_subordinates

BASE_REGISTRY = "Base.1.22.1"
_UNAUTHENTICATED = frozenset({"", "$metadata", "odata"})


def redfish_error(message_id: str, message: str) -> dict[str, Any]:
    """A Redfish error body with one ``Base`` registry message."""
    full_id = f"{BASE_REGISTRY}.{message_id}"
    return {
        "error": {
            "code": full_id,
            "message": message,
            "@Message.ExtendedInfo": [{"MessageId": full_id, "Message": message}],
        }
    }


def mockup_file(root: Path, resource: str) -> Path | None:
    """The file holding ``/redfish/v1/<resource>``, or None (also for ``..`` tricks)."""
    resource = resource.strip("/")
    if resource == "$metadata":
        candidate = root / "$metadata" / "index.xml"
    else:
        candidate = root / resource / "index.json"
    candidate = candidate.resolve()
    if not candidate.is_relative_to(root.resolve()) or not candidate.is_file():
        return None
    return candidate


class MockupServer:
    """Serves one mockup directory on 127.0.0.1 until stopped."""

    def __init__(
        self,
        root: Path,
        *,
        expand: bool = True,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        if not (root / "index.json").is_file():
            raise ValueError(f"{root} is not a Redfish mockup (no index.json)")
        self.root = root
        self.expand = expand
        self.credentials = credentials
        self.requests: list[tuple[str, str]] = []
        self._server: HTTPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def application(self) -> Application:
        return Application(
            [
                (r"/redfish/?", VersionsHandler, {"mockup": self}),
                (r"/redfish/v1/?(.*)", MockupHandler, {"mockup": self}),
            ]
        )

    def listen(self, port: int = 0, address: str = "127.0.0.1") -> int:
        """Start serving (port 0: any free port); returns the port."""
        sockets = bind_sockets(port, address)
        self._server = HTTPServer(self.application())
        self._server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
            self._server = None


class _RedfishHandler(RequestHandler):
    mockup: MockupServer

    def initialize(self, mockup: MockupServer) -> None:
        self.mockup = mockup

    def prepare(self) -> None:
        self.mockup.requests.append((self.request.method or "", self.request.uri or ""))
        self.set_header("OData-Version", "4.0")

    def send_json(self, document: Any, status: int = 200) -> None:
        body = json.dumps(document, indent=1).encode()
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        if status == 200:
            self.set_header("ETag", f'"{hashlib.sha256(body).hexdigest()[:16]}"')
        self.finish(body)

    def refuse_write(self, *_path: str) -> None:
        self.set_header("Allow", "GET, HEAD")
        self.send_json(
            redfish_error("OperationNotAllowed", "This mockup service is read-only."), 405
        )

    post = patch = put = delete = refuse_write


class VersionsHandler(_RedfishHandler):
    def get(self) -> None:
        self.send_json({"v1": "/redfish/v1/"})


class MockupHandler(_RedfishHandler):
    def get(self, resource: str) -> None:
        if not self._authorized(resource):
            self.set_header("WWW-Authenticate", 'Basic realm="Redfish"')
            self.send_json(redfish_error("NoValidSession", "Authentication required."), 401)
            return
        path = mockup_file(self.mockup.root, resource)
        if path is None:
            message = f"The resource at the URI '{self.request.path}' was not found."
            self.send_json(redfish_error("ResourceMissingAtURI", message), 404)
        elif path.suffix == ".xml":
            self.set_header("Content-Type", "application/xml")
            self.finish(path.read_bytes())
        else:
            document = json.loads(path.read_bytes())
            expand = self.get_query_argument("$expand", None)
            if self.mockup.expand and expand:
                document = expand_subordinates(document, self._resource, _levels(expand))
            self.send_json(document)

    def _authorized(self, resource: str) -> bool:
        if self.mockup.credentials is None or resource.strip("/") in _UNAUTHENTICATED:
            return True
        user, password = self.mockup.credentials
        expected = base64.b64encode(f"{user}:{password}".encode()).decode()
        return self.request.headers.get("Authorization", "") == f"Basic {expected}"

    def _resource(self, uri: str) -> dict[str, Any] | None:
        if not uri.startswith("/redfish/v1/"):
            return None
        path = mockup_file(self.mockup.root, uri.removeprefix("/redfish/v1/"))
        if path is None or path.suffix != ".json":
            return None
        document: dict[str, Any] = json.loads(path.read_bytes())
        return document


def _levels(expand: str) -> int:
    """N of ``$expand=.($levels=N)`` (1 when not given)."""
    found = re.search(r"\(\$levels=(\d+)\)", expand)
    return int(found.group(1)) if found else 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mockup", type=Path, help="the mockup directory (holds index.json)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--no-expand", action="store_true", help="ignore $expand queries")
    options = parser.parse_args(argv)
    asyncio.run(_serve(MockupServer(options.mockup, expand=not options.no_expand), options))


async def _serve(server: MockupServer, options: argparse.Namespace) -> None:
    port = server.listen(options.port, options.address)
    print(f"serving {server.root} on http://{options.address}:{port}/redfish/v1/", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
