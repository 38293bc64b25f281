"""The hosts' DCGM exporters (``/dcgm/<system>/metrics``) and the test switches that set
what their GPUs are doing (``/sim/activity``, only with ``--faults-api``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web

from ..activity import ActivityError, dcgm_metrics
from ..simulator import Simulator, log
from .switches import SimHandler

# A hung exporter holds a request at most this long, then answers 503: no simulator
# request outlives its client by much, even a client without a timeout.
HANG_LIMIT_S = 300.0
GARBAGE = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class DcgmMetricsHandler(tornado.web.RequestHandler):
    """One system's DCGM exporter: open, as the exporter is (no auth), plain text."""

    dropped = False  # the request log's flag: closed unanswered

    def initialize(self, simulator: Simulator) -> None:
        self.sim = simulator
        self._gone = asyncio.Event()

    def on_connection_close(self) -> None:
        self._gone.set()

    async def get(self, system_id: str) -> None:
        if not self.sim.state.has_system(system_id):
            raise tornado.web.HTTPError(404, reason=f"no system {system_id}")
        fault = self.sim.activity.fault(system_id)
        if fault == "hang":
            await self._hang()
        elif fault == "error":
            raise tornado.web.HTTPError(500, reason="failed to collect DCGM metrics")
        self.set_header("Content-Type", PROMETHEUS_TEXT)
        if fault == "garbage":
            self.finish(GARBAGE)
        else:
            self.finish(dcgm_metrics(self.sim.state, self.sim.activity, system_id))

    async def _hang(self) -> None:
        try:
            await asyncio.wait_for(self._gone.wait(), HANG_LIMIT_S)
        except TimeoutError:
            raise tornado.web.HTTPError(503, reason="hung exporter gave up") from None
        self.dropped = True  # the client left: nobody to answer
        raise tornado.web.Finish()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}\n")


class ActivityHandler(SimHandler):
    """``/sim/activity``: the GPUs' figures, by block id (PUT replaces, PATCH merges)."""

    def get(self) -> None:
        self.send_json(self.sim.activity.to_json(self.sim.state))

    def put(self) -> None:
        self._change(self.sim.activity.replace)

    def patch(self) -> None:
        self._change(self.sim.activity.update)

    def delete(self) -> None:
        """Every GPU idle and every exporter well again."""
        self.sim.activity.reset()
        log.info("activity reset")
        self.get()

    def _change(self, apply: Any) -> None:
        try:
            apply(self.sim.state, json.loads(self.request.body or b"null"))
        except (ValueError, ActivityError) as err:
            raise tornado.web.HTTPError(400, reason=str(err)) from err
        log.info("activity: %s", self.sim.activity.to_json(self.sim.state))
        self.get()


class ActivityFaultsHandler(SimHandler):
    """``/sim/activity/faults``: which exporters misbehave (``"*"``: all of them)."""

    def get(self) -> None:
        self.send_json(self.sim.activity.faults)

    def put(self) -> None:
        try:
            self.sim.activity.set_faults(json.loads(self.request.body or b"null"))
        except (ValueError, ActivityError) as err:
            raise tornado.web.HTTPError(400, reason=str(err)) from err
        log.info("exporter faults: %s", self.sim.activity.faults)
        self.get()

    def delete(self) -> None:
        self.sim.activity.faults = {}
        self.get()
