"""What every page and JSON call shares: who is asking, may they, and how a refusal reads.

HubOAuth says who; ``custom:compose:*`` scopes say what. Cookie-authenticated
changes need the XSRF token (HubOAuth checks it); API tokens need the scope.
Handlers parse, authorise and call one use case of the portal's service
(``portal/service.py``); the one ``write_error`` here turns what it refuses,
and the hub client's ``HubUnavailable``, into a status and a message.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Any

from jupyterhub.services.auth import HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado.log import gen_log
from tornado.web import HTTPError, RequestHandler, authenticated

from composespawner.domain.quotas import InvalidQuota
from composespawner.ledger import Actor
from composespawner.portal import views
from composespawner.portal.errors import Forbidden, InvalidInput, PortalError
from composespawner.portal.service import Portal
from composespawner.services.hub_api import HubUnavailable

ADMIN_SCOPE = "custom:compose:admin"
# Course staff: ``custom:compose:staff!group=<cohort>`` manages that cohort alone.
STAFF_SCOPE = "custom:compose:staff"
HUB_UNAVAILABLE = "The hub did not answer; try again."
FAILED = "The portal failed; the admins will find why in its log."


# What a refusal may be raised as: the service's errors, a hub that did not answer,
# and tornado's own (HubOAuth's 403 for a change without its XSRF token, among others).
REFUSALS = (PortalError, HubUnavailable, HTTPError)


@dataclass(frozen=True)
class Refusal:
    """A request refused: the status it gets and the message a person reads."""

    status: int
    message: str


def refusal(error: BaseException | None) -> Refusal | None:
    """The status and message of an error the portal refuses with; None for a failure
    (a bug, a broken part), which the log explains and the person reads as a 500."""
    if isinstance(error, PortalError):
        return Refusal(error.status, error.message)
    if isinstance(error, HubUnavailable):
        return Refusal(503, HUB_UNAVAILABLE)
    if isinstance(error, HTTPError):
        return Refusal(error.status_code, error.log_message or "")
    return None


class PortalHandler(HubOAuthenticated, RequestHandler):
    """Base of every page and call: who is asking, and may they."""

    @property
    def portal(self) -> Portal:
        portal: Portal = self.settings["portal"]
        return portal

    @property
    def user(self) -> dict[str, Any]:
        """The logged-in user's model; 403 for a request that is not authenticated."""
        model: dict[str, Any] | None = self.current_user
        if model is None:
            raise Forbidden("Log in to the hub first.")
        return model

    @property
    def is_admin(self) -> bool:
        model = self.current_user
        return bool(model and self.hub_auth.check_scopes([ADMIN_SCOPE], model))

    def require_admin(self) -> None:
        self.user  # noqa: B018 (403 before anything else for an anonymous request)
        if not self.is_admin:
            raise Forbidden("Only the GPU pool's admins may do this.")

    def staffs(self, cohort: str) -> bool:
        """Whether the caller manages ``cohort``: its staff, or an admin."""
        model = self.current_user
        required = [f"{STAFF_SCOPE}!group={cohort}"]
        return bool(model and (self.is_admin or self.hub_auth.check_scopes(required, model)))

    @property
    def is_staff(self) -> bool:
        """Whether the caller manages some cohort."""
        model = self.current_user
        held = model.get("scopes", []) if model else []
        return self.is_admin or any(s.partition("!")[0] == STAFF_SCOPE for s in held)

    def require_staff(self, cohort: str | None = None) -> None:
        """403 unless the caller manages ``cohort`` (with None: some cohort)."""
        self.user  # noqa: B018
        if not (self.is_staff if cohort is None else self.staffs(cohort)):
            whose = "a cohort's" if cohort is None else f"{cohort}'s"
            raise Forbidden(f"Only the GPU pool's admins and {whose} staff may do this.")

    async def groups(self) -> list[str]:
        """The caller's hub groups: from their model, or (for a token that may not read
        them, such as a notebook's) from the hub, so their cohorts' quotas always apply."""
        user = self.user
        if "groups" in user:
            return list(user["groups"])
        return await self.portal.hub.user_groups(user["name"]) or []

    @property
    def actor(self) -> Actor:
        return Actor(self.user["name"], self.request.remote_ip or "")

    def form(self) -> dict[str, str]:
        """A posted form's fields, the first value of each."""
        return {name: values[0].decode() for name, values in self.request.body_arguments.items()}

    def log_exception(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """A refusal is logged as tornado logs an HTTPError (a line, no traceback); a
        hub that did not answer with what it said instead."""
        refused = refusal(value)
        if refused is None or isinstance(value, HTTPError):
            super().log_exception(typ, value, tb)
            return
        detail = f" ({value})" if isinstance(value, HubUnavailable) else ""
        summary = self._request_summary()
        gen_log.warning("%d %s: %s%s", refused.status, summary, refused.message, detail)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """The one place a refusal becomes a status: ours as raised; a 5xx's details stay
        in the log."""
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        refused = refusal(error)
        if refused is not None and not isinstance(error, HTTPError):
            status_code = refused.status
            self.set_status(status_code)
        if refused is not None and refused.message:
            message = refused.message
        elif status_code >= 500:
            message = FAILED
        else:
            message = self._reason
        self.write_refusal(status_code, message)

    def write_refusal(self, status: int, message: str) -> None:
        raise NotImplementedError


class ApiHandler(PortalHandler):
    """JSON in and out; errors as ``{"status": ..., "message": ...}``."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def write_refusal(self, status: int, message: str) -> None:
        self.finish({"status": status, "message": message})

    def json_body(self) -> object:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError:
            raise InvalidInput("The body is not JSON.") from None

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value))

    def write_csv(self, name: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
        """Rows as a CSV file to save as ``name``."""
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(_csv(rows, columns))

    def no_content(self) -> None:
        self.set_status(204)
        self.finish()


class PageHandler(PortalHandler):
    """Pages in the look of the hub's own (they extend JupyterHub's page.html)."""

    def render_page(self, template: str, **context: Any) -> None:
        user = self.user
        env = self.settings["jinja"]
        html = env.get_template(template).render(
            **self._page_context(user),
            **context,
        )
        self.finish(html)

    def _page_context(self, user: dict[str, Any]) -> dict[str, Any]:
        return {
            "base_url": "/hub/",
            "prefix": "/",
            "static_url": _hub_static_url,
            "user": _PageUser(user["name"]),
            "no_spawner_check": True,
            "services": [],
            "parsed_scopes": {},
            "admin_access": False,
            "xsrf_token": self.xsrf_token.decode(),
            "xsrf_form_html": self.xsrf_form_html,
            "login_url": "/hub/login",
            "logout_url": "/hub/logout",
            "portal_url": self.portal.prefix,
            "per_page": views.PAGE_ROWS,
            "is_admin": self.is_admin,
            "is_staff": self.is_staff,
            "announcement": None,
            "version_hash": "",
        }

    def write_refusal(self, status: int, message: str) -> None:
        env = self.settings["jinja"]
        self.finish(
            env.get_template("portal_error.html").render(
                status=status,
                phrase=HTTPStatus(status).phrase,
                message=message,
                portal_url=self.portal.prefix,
            )
        )


@dataclass(frozen=True)
class _PageUser:
    """What JupyterHub's page.html reads of a user."""

    name: str

    @property
    def json_escaped_name(self) -> str:
        # page.html puts it between quotes of its own, as JupyterHub's User does.
        return json.dumps(self.name)[1:-1]


def _hub_static_url(path: str, include_version: bool = True) -> str:
    del include_version
    return url_path_join("/hub/static/", path)


class FormPage(PageHandler):
    """A page with forms: GET shows it; POST acts, then shows it again, or shows why not
    (a 400 with the person's input kept). Admins only unless ``admins_only`` is False."""

    path = ""  # below the portal's prefix, where the page is
    admins_only = True

    async def act(self, form: dict[str, str]) -> None:
        raise NotImplementedError

    async def render_form(self, **context: Any) -> None:
        raise NotImplementedError

    @authenticated
    async def get(self) -> None:
        if self.admins_only:
            self.require_admin()
        await self.render_form()

    @authenticated
    async def post(self) -> None:
        if self.admins_only:
            self.require_admin()
        form = self.form()
        try:
            await self.act(form)
        except InvalidQuota as e:
            await self._refused(str(e), form)
            return
        except REFUSALS as e:
            refused = refusal(e)
            if refused is None or refused.status != 400:
                raise
            await self._refused(refused.message, form)
            return
        self.redirect(url_path_join(self.portal.prefix, self.path))

    async def _refused(self, why: str, form: dict[str, str]) -> None:
        self.set_status(400)
        await self.render_form(error=why, form=form)


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return out.getvalue()


def _cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: no stored name turns into a formula."""
    text = json.dumps(value) if isinstance(value, dict) else value
    if isinstance(text, str) and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text
