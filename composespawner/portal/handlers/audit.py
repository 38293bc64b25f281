"""The audit log (admins): every change to quotas, cohorts, devices and machines, and who."""

from __future__ import annotations

from tornado.web import authenticated

from composespawner.portal import views
from composespawner.portal.handlers.base import ApiHandler, PageHandler


class AuditApi(ApiHandler):
    """The audit log, newest first; ``?format=csv`` exports all of it, oldest first."""

    async def get(self) -> None:
        self.require_admin()
        if self.get_argument("format", "json") == "csv":
            entries = await self.portal.audit_log(None)
            rows = [views.audit_json(e) for e in entries]
            self.write_csv("audit-log.csv", rows, views.AUDIT_COLUMNS)
            return
        entries = await self.portal.audit_log()
        self.write_json({"entries": [views.audit_json(e) for e in entries]})


class AuditPage(PageHandler):
    @authenticated
    async def get(self) -> None:
        self.require_admin()
        entries = await self.portal.audit_log()
        self.render_page("audit.html", entries=[views.audit_json(e) for e in entries])
