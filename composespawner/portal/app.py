"""``composespawner portal``: the portal service, started by the hub with its own config."""

from __future__ import annotations

import asyncio
import gc
import os
import pwd
import signal
from datetime import tzinfo
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import jinja2
import plotly
from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado.httpserver import HTTPServer
from tornado.web import Application, StaticFileHandler
from traitlets import Integer, Unicode, default

from composespawner.domain.reclaim import SITE_DEFAULT, ReclaimPolicy
from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from composespawner.launchers.environments import default_root
from composespawner.launchers.jupyterhub_internals import hub_templates
from composespawner.portal import handlers
from composespawner.portal.scoring import Scorer, read_secret
from composespawner.portal.service import Portal
from composespawner.services.application import ComposeApplication
from composespawner.services.composer import Composer
from composespawner.services.hub_api import HubClient
from composespawner.services.reclaimer import INTERVAL
from composespawner.services.settings import build_composer

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
PLOTLY = Path(plotly.__file__).parent / "package_data"
# Seconds between full garbage collections, made on a timer instead of mid-request.
FULL_COLLECTION_EVERY = 30.0


class PortalApp(ComposeApplication):
    """Serve the portal on the address the hub gave this service."""

    name = "composespawner portal"
    description = """The GPU pool's portal, as a hub-managed service: quotas and the audit log
    for admins, each user's machine and quota. Run by the hub (see the demo's config)."""

    service_url = Unicode(
        config=True,
        help="Where to listen: the service's url in the hub's config ($JUPYTERHUB_SERVICE_URL).",
    )
    service_prefix = Unicode(
        config=True,
        help="The path the proxy sends here ($JUPYTERHUB_SERVICE_PREFIX).",
    )
    max_body_bytes = Integer(
        8 * 1024 * 1024,
        config=True,
        help="""Largest request body accepted. The portal's JSON calls are small but for a
        starter-kit submission, which carries its model (scoring takes up to 5 MB).""",
    )
    scoring_secret_file = Unicode(
        "compose_scoring_secret",
        config=True,
        help="""The secret the blind data of every starter kit is drawn from (made, 32
        random bytes and mode 0600, if missing; relative to where the portal runs). Keep
        it: a new one makes new blind data, and old scores no longer compare.""",
    )
    scoring_account = Unicode(
        DEFAULT_NOTEBOOK_ACCOUNT,
        config=True,
        help="""The unprivileged account submissions are scored as, when the portal runs as
        root (a submission is code). Empty scores them as the portal's own account.""",
    )
    stack_environments_dir = Unicode(
        config=True,
        help="""Where the stacks' environments are (ComposeSpawner.stack_environments_dir):
        a kit's submissions are scored in its stack's.""",
    )

    @default("stack_environments_dir")
    def _default_stack_environments_dir(self) -> str:
        return str(default_root())

    @default("service_url")
    def _default_service_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")

    @default("service_prefix")
    def _default_service_prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/compose/")

    def start(self) -> None:
        asyncio.run(self.serve())

    async def serve(self) -> None:
        settings = self.settings
        # The portal grows and shrinks running machines: it composes as the hub does,
        # through the same ledger transactions and fabric client.
        composer = build_composer(settings, self.log)
        hub = HubClient.from_environment()
        app = self.make_app(
            composer=composer,
            hub=hub,
            timezone=ZoneInfo(settings.site_timezone),
            reclaim_policy=settings.site_reclaim_policy(),
            # The reclaimer's passes, from its section of the same file: a cohort's
            # max_gap must be longer (ReclaimDesk refuses one that is not).
            reclaim_interval=float(self.config.ReclaimerApp.get("interval", INTERVAL)),
        )
        collecting = collect_on_a_timer(FULL_COLLECTION_EVERY)
        url = urlparse(self.service_url)
        server = HTTPServer(app, xheaders=True, max_body_size=self.max_body_bytes)
        server.listen(url.port or 80, url.hostname or "127.0.0.1")
        self.log.info("Portal at %s, serving %s", self.service_url, self.service_prefix)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            collecting.cancel()
            server.stop()
            await hub.close()
            await composer.close()

    def _scorer(self) -> Scorer | None:
        account = None
        if os.geteuid() == 0 and self.scoring_account:
            try:
                account = pwd.getpwnam(self.scoring_account)
            except KeyError:
                self.log.error(
                    "No account %r to score starter-kit submissions as: none are taken. "
                    "Create it (composespawner demo does) or set scoring_account.",
                    self.scoring_account,
                )
                return None
        return Scorer(read_secret(Path(self.scoring_secret_file)), account)

    def make_app(
        self,
        *,
        composer: Composer,
        hub: HubClient,
        timezone: tzinfo,
        reclaim_policy: ReclaimPolicy = SITE_DEFAULT,
        reclaim_interval: float = INTERVAL,
    ) -> Application:
        prefix = self.service_prefix
        routes: list[Any] = [
            (url_path_join(prefix, path), handler) for path, handler in handlers.ROUTES
        ]
        routes.append((url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler))
        # The pages' scripts, and the charting library's, from here: campus hubs often
        # sit behind firewalls that keep CDNs out.
        static = url_path_join(prefix, "static/")
        routes += [
            (static + r"(plotly\.min\.js)", StaticFileHandler, {"path": PLOTLY}),
            (static + r"(.+)", StaticFileHandler, {"path": STATIC}),
        ]
        # JupyterHub's own templates after ours: the pages extend its page.html.
        loader = jinja2.ChoiceLoader(
            [jinja2.FileSystemLoader(TEMPLATES), jinja2.FileSystemLoader(hub_templates())]
        )
        return Application(
            routes,
            cookie_secret=os.urandom(32),
            # No xsrf_cookies: HubOAuth accepts its cookie on a change only with the
            # XSRF token, and a token in the Authorization header needs none.
            portal=Portal(
                ledger=composer.ledger,
                hub=hub,
                catalog=composer.catalog,
                site_quota=composer.site_quota,
                prefix=prefix,
                timezone=timezone,
                composer=composer,
                scorer=self._scorer(),
                stack_environments=Path(self.stack_environments_dir),
                reclaim_policy=reclaim_policy,
                reclaim_interval=reclaim_interval,
            ),
            jinja=jinja2.Environment(loader=loader, autoescape=True),
        )


def collect_on_a_timer(every: float) -> asyncio.Task[None]:
    """Make full garbage collections every ``every`` seconds rather than when CPython would.

    The portal keeps large read caches (a period's per-user sums, rosters, the
    inventory), and each page leaves objects that live a while: CPython then runs a
    full collection every dozen pages, 45-50 ms over the caches, inside whichever
    request triggered it (most of the usage and inventory pages' p95 at 10,000
    users). Young collections stay automatic; the full ones come on this timer.
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 1_000_000)  # never reached: the timer collects

    async def collect() -> None:
        while True:
            await asyncio.sleep(every)
            gc.collect()

    return asyncio.ensure_future(collect())
