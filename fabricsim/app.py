"""The simulator's HTTP face: a tornado application speaking Redfish.

Routes each path to its handler (:mod:`fabricsim.handlers`, by resource); the
service behind them is :class:`~fabricsim.simulator.Simulator`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import tornado.web

from . import uris
from .handlers.activity import ActivityFaultsHandler, ActivityHandler, DcgmMetricsHandler
from .handlers.service import (
    MetadataHandler,
    NotFoundHandler,
    OemSchemaHandler,
    ResourceHandler,
    VersionsHandler,
)
from .handlers.sessions import SessionHandler, SessionMembersHandler, SessionsHandler
from .handlers.switches import FaultsHandler, StateHandler
from .handlers.systems import (
    ActionHandler,
    ComposeActionHandler,
    SystemHandler,
    SystemsHandler,
    TaskMonitorHandler,
)
from .simulator import Simulator, log


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
        # The hosts' DCGM exporters, always: read-only, as real hosts serve them, and
        # what the demo's reclaimer reads. Setting what the GPUs do is the test switches'.
        (r"/dcgm/([^/]+)/metrics", DcgmMetricsHandler, args),
    ]
    if simulator.config.faults_api:
        routes += [
            (r"/sim/faults", FaultsHandler, args),
            (r"/sim/state", StateHandler, args),
            (r"/sim/activity", ActivityHandler, args),
            (r"/sim/activity/faults", ActivityFaultsHandler, args),
        ]
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
