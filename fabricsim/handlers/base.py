"""What every Redfish handler of the simulator shares: faults, authentication,
Redfish errors, JSON answers, ``$expand``.

Handlers are thin: they authenticate, apply the fault switches, parse the body
into a command (:mod:`fabricsim.commands`), run it on the state model through
:class:`~fabricsim.simulator.Simulator`, and render answers with
:mod:`fabricsim.resources`. Every refusal is a :class:`~fabricsim.errors.SimulatorError`,
written as a Redfish error body by :meth:`RedfishHandler.write_error`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Callable, Mapping
from typing import Any

import tornado.web

from .. import resources, uris
from ..errors import (
    InternalError,
    NoValidSession,
    ODataVersionUnsupported,
    OperationNotAllowed,
    QueryParameterUnsupported,
    QueryParameterValueFormatError,
    ResourceMissing,
    ServiceTemporarilyUnavailable,
    SimulatorError,
    UnsupportedMediaType,
)
from ..metadata import json_schema_uri
from ..quirks import loose_error_answer
from ..simulator import Simulator, log
from ..state import if_none_match_matches
from ..tasks import Outcome, Task

WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
ODATA_VERSION = "4.0"
# "$expand" values we answer, and how many levels deep each expands.
EXPAND_LEVELS = {".": 1} | {
    f".($levels={n})": n for n in range(1, resources.EXPAND_FEATURES["MaxLevels"] + 1)
}


class RedfishHandler(tornado.web.RequestHandler):
    """Common ground: faults, authentication, Redfish errors, JSON answers."""

    ALLOW = "GET, HEAD"  # the Allow header; handlers may narrow or widen it per mode
    dropped = False  # closed unanswered by the drop_connections / unreachable faults

    def initialize(self, simulator: Simulator) -> None:
        self.sim = simulator

    def set_default_headers(self) -> None:
        self.set_header("OData-Version", ODATA_VERSION)
        self.set_header("Cache-Control", "no-cache")

    async def prepare(self) -> None:
        if self.sim.faults.drops_request():
            self._drop_connection()
        latency = self.sim.faults.settings.latency_s
        if latency:
            await asyncio.sleep(latency)
        if self.request.method in WRITE_METHODS and self.sim.faults.write_fails():
            raise ServiceTemporarilyUnavailable(1)
        if not self.is_open():
            self._authenticate()
        check_request_headers(self.request.method or "", self.request.headers, self.request.body)

    def is_open(self) -> bool:
        """Whether this request may be answered without credentials."""
        return False

    def head(self, *args: str) -> Any:
        return self.get(*args)  # tornado sends the headers and drops the body

    def _authenticate(self) -> None:
        token = self.request.headers.get("X-Auth-Token")
        if token is not None and self.sim.sessions.authenticate(token) is not None:
            return
        credentials = _basic_credentials(self.request.headers.get("Authorization", ""))
        if credentials is not None and self.sim.check_credentials(*credentials):
            return
        raise NoValidSession()

    def _drop_connection(self) -> None:
        self.dropped = True
        self.request.connection.close()  # type: ignore[union-attr]
        raise tornado.web.Finish()

    def send_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        etag = payload.get("@odata.etag") if isinstance(payload, dict) else None
        if etag:
            self.set_header("ETag", etag)
        self.set_header("Allow", self.ALLOW)
        odata_type = payload.get("@odata.type") if isinstance(payload, dict) else None
        schema = json_schema_uri(odata_type) if isinstance(odata_type, str) else None
        if schema and self.request.method in ("GET", "HEAD"):
            self.set_header("Link", f"<{schema}>; rel=describedby")
        if etag and status == 200 and self._not_modified(etag):
            self.set_status(304)  # the client's copy is current: headers only
            self.finish()
            return
        self.finish(json.dumps(payload))

    def _not_modified(self, etag: str) -> bool:
        if_none_match = self.request.headers.get("If-None-Match")
        return (
            self.request.method in ("GET", "HEAD")
            and if_none_match is not None
            and if_none_match_matches(if_none_match, etag)
        )

    def send_accepted(self, task: Task) -> None:
        """202 for a running task: where to poll and when."""
        self.set_header("Location", uris.task_monitor_uri(task.id))
        self.set_header("Retry-After", str(task.retry_after_s(self.sim.tasks.now())))
        self.send_json(resources.task_resource(task), status=202)

    def send_outcome(self, outcome: Outcome) -> None:
        if outcome.location is not None:
            self.set_header("Location", outcome.location)
        if outcome.body is None:
            self.set_status(outcome.status)
            self.finish()
        elif not outcome.succeeded and self.loose_errors:
            self.set_status(outcome.status)
            self.set_header("Allow", self.ALLOW)
            self.finish_loose_error(outcome.body)
        else:
            self.send_json(outcome.body, status=outcome.status)

    def send_xml(self, document: str) -> None:
        self.set_header("Content-Type", "application/xml; charset=utf-8")
        self.set_header("Allow", self.ALLOW)
        self.finish(document)

    def send_resource(self, payload: dict[str, Any] | None) -> None:
        """Answer a GET with ``payload`` (None: 404), expanded if asked to."""
        if payload is None:
            raise ResourceMissing(self.request.path)
        levels = self.expand_levels()
        if levels:
            payload = resources.expand(self.sim.view, payload, levels)
        self.send_json(payload)

    def expand_levels(self) -> int:
        """Check the query: levels to expand (0: none); ``.`` up to MaxLevels deep."""
        for name in self.request.query_arguments:
            if name != "$expand" and name.startswith("$"):
                raise QueryParameterUnsupported(name)
        value = self.get_query_argument("$expand", None)
        if value is None:
            return 0
        if value not in EXPAND_LEVELS:
            raise QueryParameterValueFormatError(value, "$expand")
        return EXPAND_LEVELS[value]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = _as_simulator_error(kwargs.get("exc_info"), status_code, self.request.path)
        self.set_status(error.status)
        if error.status == 401 and not self.request.headers.get("X-Auth-Token"):
            self.set_header("WWW-Authenticate", 'Basic realm="Redfish"')
        if error.status == 405:
            self.set_header("Allow", self.ALLOW)
        if isinstance(error, ServiceTemporarilyUnavailable):
            self.set_header("Retry-After", error.message_args[0])
        if self.loose_errors:
            self.finish_loose_error(error.body())
            return
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(error.body()))

    @property
    def loose_errors(self) -> bool:
        """Whether error answers carry something else than a Redfish error (--error-bodies)."""
        return self.sim.config.quirks.error_bodies != "redfish"

    def finish_loose_error(self, redfish_error: Mapping[str, Any]) -> None:
        """Finish an error answer with what --error-bodies says instead of ``redfish_error``."""
        message = str(redfish_error.get("error", {}).get("message", ""))
        shape = self.sim.config.quirks.error_bodies
        content_type, body = loose_error_answer(shape, self.get_status(), message)
        self.set_header("Content-Type", content_type)
        self.finish(body)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # A refusal is an answer, not a crash: the access log line says enough.
        if isinstance(value, SimulatorError | tornado.web.HTTPError):
            log.debug("%s %s refused: %s", self.request.method, self.request.uri, value)
        else:
            super().log_exception(typ, value, tb)


def check_request_headers(method: str, headers: Mapping[str, str], body: bytes) -> None:
    """Refuse an OData-Version we do not speak (412) and a body not typed JSON (415)."""
    odata_version = headers.get("OData-Version")
    if odata_version is not None and odata_version.strip() != ODATA_VERSION:
        raise ODataVersionUnsupported(f"OData-Version: {odata_version}")
    content_type = headers.get("Content-Type", "")
    media_type = content_type.partition(";")[0].strip().lower()
    if method in WRITE_METHODS and body and media_type != "application/json":
        raise UnsupportedMediaType(f"Content-Type: {content_type}")


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        username, sep, password = base64.b64decode(encoded).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (username, password) if sep else None


def _as_simulator_error(exc_info: Any, status: int, path: str) -> SimulatorError:
    error = exc_info[1] if exc_info else None
    if isinstance(error, SimulatorError):
        return error
    factories: dict[int, Callable[[], SimulatorError]] = {
        404: lambda: ResourceMissing(path),
        405: OperationNotAllowed,
    }
    return factories.get(status, InternalError)()
