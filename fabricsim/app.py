"""The simulator's HTTP face: a tornado application speaking Redfish.

Handlers are thin: they authenticate, apply the fault switches, parse the body
into a command (:mod:`.commands`), run it on the state model through
:class:`Simulator`, and render answers with :mod:`.resources`. Every refusal
is a :class:`~.errors.SimulatorError`, written as a Redfish error body by
:meth:`RedfishHandler.write_error`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tornado.web

from . import resources, uris
from .commands import (
    Stanza,
    parse_block_command,
    parse_compose_action,
    parse_login,
    parse_system_create,
    parse_tag_patch,
)
from .errors import (
    AccessUnauthorized,
    ETagMismatch,
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
from .faults import FaultSettings, FaultSettingsError, FaultSwitch
from .metadata import OEM_SCHEMA_DOCUMENT, json_schema_uri, metadata_document
from .persistence import StateFile
from .quirks import NO_QUIRKS, ServiceQuirks, loose_error_answer
from .sessions import SessionStore
from .state import CompositionRequest, FabricState, if_none_match_matches
from .tasks import Outcome, Task, TaskStore

log = logging.getLogger("fabricsim")

Work = Callable[[], Outcome]
WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
ODATA_VERSION = "4.0"
# "$expand" values we answer, and how many levels deep each expands.
EXPAND_LEVELS = {".": 1} | {
    f".($levels={n})": n for n in range(1, resources.EXPAND_FEATURES["MaxLevels"] + 1)
}


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    username: str = "admin"
    password: str = "fabric-password"
    async_tasks: bool = False  # answer writes of blocks and systems with 202 + task monitor
    task_duration_s: float = 0.2
    faults_api: bool = False  # serve /sim/faults and /sim/state
    session_timeout_s: int = 1800
    quirks: ServiceQuirks = NO_QUIRKS  # answer like an older or looser service


class Simulator:
    """The running service: fabric state, sessions, tasks, faults, state file."""

    def __init__(
        self,
        state: FabricState,
        config: SimulatorConfig,
        *,
        state_file: StateFile | None = None,
    ) -> None:
        self.state = state
        self.config = config
        self.state_file = state_file
        self.sessions = SessionStore(timeout_s=config.session_timeout_s)
        self.tasks = TaskStore()
        self.faults = FaultSwitch()
        self._next_save: asyncio.Future[None] | None = None

    @property
    def view(self) -> resources.ServiceView:
        return resources.ServiceView(
            self.state, self.sessions, self.tasks, self.config.session_timeout_s, self.config.quirks
        )

    def describe_quirks(self) -> list[str]:
        """How this service departs from DMTF's current mockups, for its log."""
        quirks = self.config.quirks
        described = [f"not expandable: {h}" for h in sorted(self.state.not_expandable)]
        if quirks.zone_capabilities:
            described.append("composition advertised on resource zones")
        if quirks.stale_block_status:
            described.append("stale block status")
        if quirks.error_bodies != "redfish":
            described.append(f"{quirks.error_bodies} error bodies")
        return described

    def check_credentials(self, username: str, password: str) -> bool:
        user_ok = secrets.compare_digest(username.encode(), self.config.username.encode())
        password_ok = secrets.compare_digest(password.encode(), self.config.password.encode())
        return user_ok and password_ok

    def run(self, work: Work) -> Outcome:
        """Do a task's write now; the answer it gets. Saves the state when it changed."""
        outcome, changed = _apply(work)
        if changed:
            self.save()
        return outcome

    def start_task(self, name: str, work: Work) -> Task:
        """Do ``work`` after the task duration, as a Redfish task."""
        task = self.tasks.create(name, self.config.task_duration_s)
        asyncio.get_running_loop().call_later(
            self.config.task_duration_s, self._finish_task, task, work
        )
        return task

    def _finish_task(self, task: Task, work: Work) -> None:
        if self.faults.settings.task_failure:
            task.finish(Outcome.refused(InternalError()))
        else:
            task.finish(self.run(work))
        log.info("task %s (%s) ended: %s", task.id, task.name, task.state)

    def compose(self, request: CompositionRequest) -> Outcome:
        system_id = self.state.compose_system(request)
        created = resources.system(self.view, system_id)
        return Outcome(201, created, location=uris.system_uri(system_id))

    def decompose(self, system_id: str) -> Outcome:
        self.state.decompose_system(system_id)
        return Outcome(204)

    def apply_manifest(self, stanzas: list[Stanza]) -> Outcome:
        """CompositionService.Compose with RequestType Apply: every stanza, or none."""
        undo: list[Callable[[], None]] = []
        answers = []
        try:
            for stanza in stanzas:
                answers.append(self._apply_stanza(stanza, undo))
        except SimulatorError:
            for step in reversed(undo):
                step()
            raise
        return Outcome(200, resources.compose_response(answers))

    def _apply_stanza(self, stanza: Stanza, undo: list[Callable[[], None]]) -> dict[str, Any]:
        state = self.state
        if stanza.compose is not None:
            system_id = state.compose_system(stanza.compose)

            def take_apart() -> None:
                state.decompose_system(system_id)

            undo.append(take_apart)
            kind, response = "ComposeSystem", resources.system(self.view, system_id)
        else:
            assert stanza.decompose is not None
            system_id = stanza.decompose
            response = resources.system(self.view, system_id)
            gone, tag = state.decompose_system(system_id)
            undo.append(lambda: state.restore_system(system_id, gone, tag))
            kind = "DecomposeSystem"
        return {"StanzaType": kind, "StanzaId": stanza.stanza_id, "Response": response}

    async def write(self, handler: RedfishHandler, name: str, work: Work) -> None:
        """Answer a write once it is saved, or with 202 and a task monitor under --async-tasks."""
        if self.config.async_tasks:
            handler.send_accepted(self.start_task(name, work))
            return
        outcome, changed = _apply(work)
        if changed:
            await self.saved()
        handler.send_outcome(outcome)

    def save(self) -> None:
        if self.state_file is not None:
            self.state_file.save(self.state.to_json())

    async def saved(self) -> None:
        """Save the state, once for all the changes made in this turn of the loop.

        A group commit: under a burst of writes (a spawn storm attaches hundreds
        of devices) one save serves every write of a turn, where a save per write
        spent most of the simulator's time rewriting the same file. Each write is
        still answered only once its change is in the file.
        """
        if self.state_file is None:
            return
        if self._next_save is None:
            loop = asyncio.get_running_loop()
            self._next_save = loop.create_future()
            loop.call_soon(self._save_now)
        # Shielded: a writer whose client went away must not cancel the others' save.
        await asyncio.shield(self._next_save)

    def _save_now(self) -> None:
        done, self._next_save = self._next_save, None
        assert done is not None
        try:
            self.save()
        except Exception as err:  # each waiting writer answers it (a 500)
            done.set_exception(err)
        else:
            done.set_result(None)


def _apply(work: Work) -> tuple[Outcome, bool]:
    """Do a write: its answer, and whether it changed the state (a refusal changes nothing)."""
    try:
        return work(), True
    except SimulatorError as err:
        return Outcome.refused(err), False


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


class VersionsHandler(RedfishHandler):
    def is_open(self) -> bool:
        return True

    def get(self) -> None:
        self.send_json({"v1": uris.SERVICE_ROOT})


class MetadataHandler(RedfishHandler):
    """The open CSDL document ``$metadata``."""

    def is_open(self) -> bool:
        return True

    def get(self) -> None:
        self.send_xml(metadata_document())


class OemSchemaHandler(MetadataHandler):
    """Our OEM schema, referenced from ``$metadata``."""

    def get(self) -> None:
        self.send_xml(OEM_SCHEMA_DOCUMENT)


class ResourceHandler(RedfishHandler):
    """GET of any read-only resource; other methods are not allowed."""

    def is_open(self) -> bool:
        path = self.request.path.rstrip("/")
        is_public = path in (uris.ROOT, uris.ODATA)
        # An expanded service root would show protected resources.
        return (
            is_public
            and self.request.method in ("GET", "HEAD")
            and "$expand" not in (self.request.query_arguments)
        )

    def get(self, path: str) -> None:
        self.send_resource(resources.render(self.sim.view, self.request.path))

    def _not_allowed(self, path: str) -> None:
        if resources.render(self.sim.view, self.request.path) is None:
            raise ResourceMissing(self.request.path)
        raise OperationNotAllowed()

    post = put = patch = delete = _not_allowed


class SystemsHandler(RedfishHandler):
    """The Systems collection; POST composes a system under specific composition."""

    def initialize(self, simulator: Simulator) -> None:
        super().initialize(simulator)
        self.ALLOW = "GET, HEAD, POST" if self._creates() else "GET, HEAD"

    def _creates(self) -> bool:
        return self.sim.state.composition == "specific"

    def get(self) -> None:
        self.send_resource(resources.system_collection(self.sim.view))

    async def post(self) -> None:
        if not self._creates():
            raise OperationNotAllowed()
        request = parse_system_create(self.request.body)
        check_attachments(self.sim, request.blocks)
        await self.sim.write(self, f"compose {request.name}", lambda: self.sim.compose(request))

    def _not_allowed(self) -> None:
        raise OperationNotAllowed()

    put = patch = delete = _not_allowed


class SystemHandler(RedfishHandler):
    ALLOW = "GET, HEAD, PATCH"

    def initialize(self, simulator: Simulator) -> None:
        super().initialize(simulator)
        if not simulator.state.expandable:
            self.ALLOW = "GET, HEAD, PATCH, DELETE"

    async def delete(self, system_id: str) -> None:
        """Decompose a system of specific composition; hosts of expandable mode stay."""
        if not self.sim.state.has_system(system_id):
            raise ResourceMissing(self.request.path)
        if self.sim.state.expandable:
            raise OperationNotAllowed()
        await self.sim.write(self, f"decompose {system_id}", lambda: self.sim.decompose(system_id))

    def get(self, system_id: str) -> None:
        self.send_resource(resources.system(self.sim.view, system_id))

    async def patch(self, system_id: str) -> None:
        readable = resources.system(self.sim.view, system_id)
        if readable is None:
            raise ResourceMissing(self.request.path)
        tag = parse_tag_patch(self.request.body, readable)
        if_match = self.request.headers.get("If-Match")
        if if_match is not None and self.sim.faults.settings.stale_etags:
            raise ETagMismatch()
        self.sim.state.set_tag(system_id, tag, if_match=if_match)
        await self.sim.saved()
        self.send_resource(resources.system(self.sim.view, system_id))


class ActionHandler(RedfishHandler):
    """``POST /Systems/{id}/Actions/ComputerSystem.{Add,Remove}ResourceBlock``."""

    ALLOW = "POST"

    async def post(self, system_id: str, action: str) -> None:
        command = parse_block_command(system_id, action, self.request.body)
        command.check(self.sim.state)
        if command.action == uris.ADD_RESOURCE_BLOCK and self.sim.faults.attachment_fails():
            raise InternalError()
        if command.gives_etags and self.sim.faults.settings.stale_etags:
            raise ETagMismatch()

        def work() -> Outcome:
            command.apply(self.sim.state)
            return Outcome(204)

        await self.sim.write(self, f"{command.action} {command.block_id}", work)


class ComposeActionHandler(RedfishHandler):
    """``POST .../Actions/CompositionService.Compose``, where the service offers it."""

    ALLOW = "POST"

    async def post(self) -> None:
        if self.sim.state.composition != "action":
            raise ResourceMissing(self.request.path)
        stanzas = parse_compose_action(self.request.body)
        for stanza in stanzas:
            if stanza.compose is not None:
                check_attachments(self.sim, stanza.compose.blocks)
        await self.sim.write(self, "compose manifest", lambda: self.sim.apply_manifest(stanzas))


def check_attachments(simulator: Simulator, blocks: tuple[str, ...]) -> None:
    """The fail-after-k-attachments fault, counting each device a composition takes."""
    for block_id in blocks:
        if not simulator.state.is_host_block(block_id) and simulator.faults.attachment_fails():
            raise InternalError()


class TaskMonitorHandler(RedfishHandler):
    """A task monitor: 202 while the task runs, then the operation's final answer."""

    ALLOW = "GET"

    def get(self, task_id: str) -> None:
        task = self.sim.tasks.get(task_id)
        if task is None:
            raise ResourceMissing(self.request.path)
        if task.outcome is None:
            self.send_accepted(task)
        else:
            self.send_outcome(task.outcome)


class SessionsHandler(RedfishHandler):
    ALLOW = "GET, HEAD, POST"

    def is_open(self) -> bool:
        return self.request.method == "POST"  # logging in

    def get(self) -> None:
        self.send_resource(resources.session_collection(self.sim.view))

    def post(self) -> None:
        username, password = parse_login(self.request.body)
        if not self.sim.check_credentials(username, password):
            raise AccessUnauthorized()
        session = self.sim.sessions.create(username)
        self.set_header("X-Auth-Token", session.token)
        self.set_header("Location", uris.session_uri(session.id))
        self.send_json(resources.session_resource(session), status=201)


class SessionMembersHandler(SessionsHandler):
    """``POST .../Sessions/Members``: the same as POST to the collection (DSP0266)."""

    ALLOW = "POST"

    def get(self) -> None:
        raise OperationNotAllowed()


class SessionHandler(RedfishHandler):
    ALLOW = "GET, HEAD, DELETE"

    def get(self, session_id: str) -> None:
        self.send_resource(resources.session(self.sim.view, session_id))

    def delete(self, session_id: str) -> None:
        if not self.sim.sessions.delete(session_id):
            raise ResourceMissing(self.request.path)
        self.set_status(204)
        self.finish()


class NotFoundHandler(RedfishHandler):
    """Anything outside ``/redfish/v1``: 404."""

    def is_open(self) -> bool:
        return True

    def _missing(self, *args: str) -> None:
        raise ResourceMissing(self.request.path)

    get = head = post = put = patch = delete = _missing


# --- test switches (--faults-api) ---------------------------------------------------------


class SimHandler(tornado.web.RequestHandler):
    """Base of the test-only ``/sim`` endpoints: plain JSON, no auth, no faults."""

    def initialize(self, simulator: Simulator) -> None:
        self.sim = simulator

    def send_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(payload))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        reason = str(exc_info[1]) if exc_info else self._reason
        self.send_json({"error": reason}, status=status_code)


class FaultsHandler(SimHandler):
    def get(self) -> None:
        self.send_json(self.sim.faults.settings.to_json())

    def put(self) -> None:
        try:
            settings = FaultSettings.from_json(json.loads(self.request.body or b"null"))
            self.sim.state.set_disabled(settings.disabled_blocks)
        except (ValueError, FaultSettingsError, SimulatorError) as err:
            raise tornado.web.HTTPError(400, reason=str(err)) from err
        self.sim.faults.replace(settings)
        log.info("faults: %s", settings)
        self.get()

    def delete(self) -> None:
        self.sim.state.set_disabled(())
        self.sim.faults.replace(FaultSettings())
        log.info("faults reset")
        self.get()


class StateHandler(SimHandler):
    def get(self) -> None:
        state = self.sim.state
        document = state.to_json()
        self.send_json(
            {
                "hosts": document["hosts"],
                "composed": document["composed"],
                "disabled_blocks": state.disabled(),
            }
        )

    async def delete(self) -> None:
        """Detach everything and clear tags (tests share one simulator)."""
        self.sim.state.reset()
        self.sim.faults.replace(FaultSettings())
        await self.sim.saved()
        self.set_status(204)
        self.finish()


def make_app(simulator: Simulator) -> tornado.web.Application:
    args = {"simulator": simulator}
    routes: list[Any] = [
        (r"/redfish/?", VersionsHandler, args),
        (r"/redfish/v1/\$metadata/?", MetadataHandler, args),
        (uris.OEM_SCHEMA, OemSchemaHandler, args),
        (rf"{uris.SESSIONS}/?", SessionsHandler, args),
        (rf"{uris.SESSIONS}/Members/?", SessionMembersHandler, args),
        (rf"{uris.SESSIONS}/([^/]+)/?", SessionHandler, args),
        (rf"{uris.SYSTEMS}/?", SystemsHandler, args),
        (rf"{uris.SYSTEMS}/([^/]+)/Actions/ComputerSystem\.([A-Za-z]+)/?", ActionHandler, args),
        (rf"{re.escape(uris.COMPOSE_ACTION)}/?", ComposeActionHandler, args),
        (rf"{uris.SYSTEMS}/([^/]+)/?", SystemHandler, args),
        (rf"{uris.TASK_MONITORS}/([^/]+)/?", TaskMonitorHandler, args),
        (r"/redfish/v1(/.*)?", ResourceHandler, args),
    ]
    if simulator.config.faults_api:
        routes += [(r"/sim/faults", FaultsHandler, args), (r"/sim/state", StateHandler, args)]
    return tornado.web.Application(
        routes,
        default_handler_class=NotFoundHandler,
        default_handler_args=args,
        log_function=_log_request,
    )


def _log_request(handler: tornado.web.RequestHandler) -> None:
    request = handler.request
    status = handler.get_status()
    # Reads that succeed are most of the traffic (every form view, every reconciler
    # pass) and say nothing new: keep them out of the hub's console unless asked.
    quiet = request.method in ("GET", "HEAD") and status < 400
    log.log(
        logging.DEBUG if quiet else logging.INFO,
        "%s %s %s (%s) %.1fms",
        "dropped" if getattr(handler, "dropped", False) else status,
        request.method,
        request.uri,
        request.remote_ip,
        1000.0 * request.request_time(),
    )


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
