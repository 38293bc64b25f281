"""GPU-hours (admins): held by day and model, user and cohort, used and given back by day
and cohort, and what runs now; CSV export."""

from __future__ import annotations

import plotly
from tornado.web import authenticated

from composespawner.portal import usage_views
from composespawner.portal.errors import InvalidInput
from composespawner.portal.handlers.base import ApiHandler, PageHandler


class UsageApi(ApiHandler):
    """GPU-hours over ``?since=&until=`` (days, both included; the last 30 by default);
    ``?format=csv`` exports one row per day, user and model, with its hours held, used and
    given back."""

    async def get(self) -> None:
        self.require_admin()
        period = self.portal.period(
            self.get_argument("since", None), self.get_argument("until", None)
        )
        if self.get_argument("format", "json") == "csv":
            uses = await self.portal.day_uses(period)
            name = f"gpu-usage-{period.first}-{period.last}.csv"
            self.write_csv(name, usage_views.usage_rows(uses), usage_views.USAGE_COLUMNS)
            return
        self.write_json(await self.portal.usage(period))


class UsagePage(PageHandler):
    @authenticated
    async def get(self) -> None:
        self.require_admin()
        since, until = self.get_argument("since", None), self.get_argument("until", None)
        error = None
        try:
            period = self.portal.period(since or None, until or None)
        except InvalidInput as e:  # the page shows the default range, and what to fix
            self.set_status(400)
            period, error = self.portal.period(None, None), e.message
        usage = await self.portal.usage(period)
        self.render_page(
            "usage.html",
            usage=usage,
            cohorts=usage_views.cohort_rows(usage),
            running=usage_views.running_rows(usage["running"]),
            error=error,
            plotly_version=plotly.__version__,
        )
