"""The test-only ``/sim`` endpoints (``--faults-api``): fault switches and state."""

from __future__ import annotations

import json
from typing import Any

import tornado.web

from ..errors import SimulatorError
from ..faults import FaultSettings, FaultSettingsError
from ..simulator import Simulator, log


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
        """Detach everything, clear tags, faults and GPU activity (tests share one simulator)."""
        self.sim.state.reset()
        self.sim.faults.replace(FaultSettings())
        self.sim.activity.reset()
        await self.sim.saved()
        self.set_status(204)
        self.finish()
