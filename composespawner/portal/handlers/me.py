"""Everyone's own: my servers, quota and cohorts; a running server's GPUs; my runs."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from tornado.web import authenticated

from composespawner.portal import machine_views, views
from composespawner.portal.errors import InvalidInput
from composespawner.portal.handlers.base import REFUSALS, ApiHandler, PageHandler, refusal


class MyMachinePage(PageHandler):
    """My servers, quota and cohorts; a running server's GPUs added or given back in place."""

    @authenticated
    async def get(self) -> None:
        await self._show()

    @authenticated
    async def post(self) -> None:
        form = self.form()
        name, groups = self.user["name"], frozenset(await self.groups())
        try:
            change = await self._change(name, groups, form)
        except views.InvalidGrow as e:
            self.set_status(400)
            await self._show(error=str(e))
        except REFUSALS as e:
            refused = refusal(e)
            # A refusal, or a part that cannot serve now, is shown on the page; other
            # failures (a portal that cannot resize, a hub's odd answer) on an error page.
            if refused is None or (refused.status >= 500 and refused.status != 503):
                raise
            self.set_status(refused.status)
            await self._show(error=refused.message)
        else:
            await self._show(changed=change.get("next_step") or change["message"])

    async def _change(
        self, name: str, groups: frozenset[str], form: dict[str, str]
    ) -> dict[str, Any]:
        server = form.get("server", "")
        action = form.get("action")
        if action == "grow":
            text = form.get("count", "1").strip()
            count = views.grow_count(
                {"count": int(text) if text.isascii() and text.isdigit() else text}
            )
            return await self.portal.resize(lambda r: r.grow(name, groups, server, count))
        if action == "shrink":
            gpu = form.get("gpu", "")
            return await self.portal.resize(lambda r: r.shrink(name, server, [gpu]))
        if action == "keep":
            return await self.portal.reclaims.keep(name, server, form.get("gpu", ""))
        if action == "launch-again":
            machine, new = form.get("machine", ""), form.get("name", "").strip()
            started = await self.portal.launch_again(name, machine, new or None)
            server = started["server"]
            shown = f"Server {server!r}" if server else "Your default server"
            return {"next_step": f"{shown} is starting as that run did."}
        raise InvalidInput("Choose to add a GPU, give one back, keep one or launch a run again.")

    async def _show(self, **context: Any) -> None:
        mine = await self.portal.my_machine(self.user["name"], await self.groups())
        self.render_page("my_machine.html", mine=mine, **context)


class MeApi(ApiHandler):
    async def get(self) -> None:
        self.write_json(await self.portal.my_machine(self.user["name"], await self.groups()))


class MyGpusApi(ApiHandler):
    """A running server's GPUs, changed in place: ``api/me/server/gpus`` for the default
    server, ``api/me/servers/NAME/gpus`` for a named one. POST ``{"count": N}`` adds N
    GPUs of the server's model; GET reads them."""

    async def get(self, server: str) -> None:
        """The server's machine and its kernels' environment, as they are now."""
        name, server = self.user["name"], unquote(server)
        self.write_json(await self.portal.resize(lambda r: r.running_machine(name, server)))

    async def post(self, server: str) -> None:
        try:
            count = views.grow_count(self.json_body())
        except views.InvalidGrow as e:
            raise InvalidInput(str(e)) from None
        name, groups = self.user["name"], frozenset(await self.groups())
        server = unquote(server)
        self.write_json(
            await self.portal.resize(lambda composer: composer.grow(name, groups, server, count))
        )


class MyGpuApi(ApiHandler):
    """One GPU of a running server: DELETE ``api/me/server/gpus/ID`` gives it back."""

    async def delete(self, server: str, gpu: str) -> None:
        name, server, gpu = self.user["name"], unquote(server), unquote(gpu)
        self.write_json(
            await self.portal.resize(lambda composer: composer.shrink(name, server, [gpu]))
        )


class KeepGpuApi(ApiHandler):
    """``POST api/me/server/gpus/ID/keep`` (``{}`` or no body): *Keep*, so an idle GPU the
    reclaimer warned about is not taken for the policy's ``keep_for``. 404 for a GPU the
    server does not hold (another user's included), 409 when the policy allows no more."""

    async def post(self, server: str, gpu: str) -> None:
        if self.json_body() not in (None, {}):
            raise InvalidInput("Keep takes no fields: send {} or no body.")
        name, server, gpu = self.user["name"], unquote(server), unquote(gpu)
        self.write_json(await self.portal.reclaims.keep(name, server, gpu))


class RunManifestApi(ApiHandler):
    """``GET api/runs/MACHINE``: what that machine's server ran on. Its user's and the
    admins' alone: anyone else gets the 404 a machine that never was gets."""

    async def get(self, machine_id: str) -> None:
        run = await self.portal.run_of(
            self.user["name"], unquote(machine_id), sees_all=self.is_admin
        )
        self.write_json(machine_views.run_json(run))


class RunPage(PageHandler):
    """``runs/MACHINE``: a run's manifest, for its user and the admins (404 to others)."""

    @authenticated
    async def get(self, machine_id: str) -> None:
        run = await self.portal.run_of(
            self.user["name"], unquote(machine_id), sees_all=self.is_admin
        )
        self.render_page("run.html", run=machine_views.run_json(run))


class LaunchAgainApi(ApiHandler):
    """``POST api/runs/MACHINE/launch`` with ``{"name": "server"}`` (optional: the run's
    own server): a new server on the run's stack lock and GPU model and count."""

    async def post(self, machine_id: str) -> None:
        body = self.json_body()
        if body is None:
            body = {}
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(body, dict) or (name is not None and not isinstance(name, str)):
            raise InvalidInput('Send {"name": "a server name"}, or nothing for the run\'s own.')
        result = await self.portal.launch_again(self.user["name"], unquote(machine_id), name)
        self.write_json(result, status=202)
