"""``/compose/*`` on the notebook server: JSON, authenticated and XSRF-checked as the
server's own APIs are (``APIHandler``), each a thin call to :mod:`composespawner_lab.portal`.

The portal's refusals come back with its status and message (the user acts on them);
a portal that cannot be reached is a 502 with the client's words.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from composespawner import client
from composespawner_lab import portal

POLL_SECONDS_ENV = "COMPOSE_LAB_POLL_SECONDS"  # the panel's poll interval (default 30)


class ComposeHandler(APIHandler):
    async def answer(self, call: Callable[..., dict[str, Any]], *args: object) -> None:
        try:
            found = await asyncio.to_thread(call, *args)
        except client.PortalError as e:
            self.log.warning("composespawner-lab: the portal refused or failed: %s", e)
            self.set_status(e.status if e.status and 400 <= e.status < 600 else 502)
            found = {"message": str(e)}
        self.finish(json.dumps(found))

    def json_body(self) -> object:
        try:
            return json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "The request's body is not JSON.") from None

    def refuse(self, problem: ValueError) -> None:
        self.set_status(400)
        self.finish(json.dumps({"message": str(problem)}))


class MachineHandler(ComposeHandler):
    @web.authenticated
    async def get(self) -> None:
        await self.answer(portal.machine)


class PortalPostHandler(ComposeHandler):
    """A POST whose JSON body names the one argument of one portal call."""

    read: Callable[[object], object]  # the body -> the argument; ValueError: a 400
    call: Callable[[Any], dict[str, Any]]

    @web.authenticated
    async def post(self) -> None:
        try:
            argument = type(self).read(self.json_body())
        except ValueError as e:
            return self.refuse(e)
        await self.answer(type(self).call, argument)


class GrowHandler(PortalPostHandler):
    read = staticmethod(portal.grow_count)
    call = staticmethod(portal.grow)


class GiveBackHandler(PortalPostHandler):
    read = staticmethod(portal.gpu_named)
    call = staticmethod(portal.give_back)


class KeepHandler(PortalPostHandler):
    read = staticmethod(portal.gpu_named)
    call = staticmethod(portal.keep)


def poll_seconds(value: str | None) -> float | None:
    """``$COMPOSE_LAB_POLL_SECONDS`` when it is a number of seconds >= 1; None else."""
    try:
        seconds = float(value or "")
    except ValueError:
        return None
    return seconds if seconds >= 1 else None


def setup_handlers(web_app: Any) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "compose", path), handler)
            for path, handler in (
                ("machine", MachineHandler),
                ("grow", GrowHandler),
                ("give-back", GiveBackHandler),
                ("keep", KeepHandler),
            )
        ],
    )
    seconds = poll_seconds(os.environ.get(POLL_SECONDS_ENV))
    if seconds is not None:
        # JupyterLab's page handler hands page_config_data to the frontend's PageConfig.
        web_app.settings.setdefault("page_config_data", {})["composespawnerPollSeconds"] = seconds
