"""Starter kits: submissions scored on blind data, and each kit's leaderboards."""

from __future__ import annotations

from urllib.parse import unquote

from tornado.web import authenticated

from composespawner.domain.catalog import Kit
from composespawner.domain.cohorts import InvalidCohort
from composespawner.ledger import Standing
from composespawner.portal import kit_views
from composespawner.portal.errors import Forbidden, InvalidInput, NotFound
from composespawner.portal.handlers.base import ApiHandler, PageHandler, PortalHandler


class KitsMixin(PortalHandler):
    """What the submission and leaderboard calls and page share."""

    def kit(self, kit_id: str) -> Kit:
        return self.portal.kits.kit(unquote(kit_id))

    async def standings(self, kit: Kit, cohort: str | None, by: str) -> list[Standing]:
        """The kit's board for ``cohort`` (None: the open one): a cohort's is its members',
        its staff's and the admins' to see; the open board everyone's."""
        self.portal.kits.check_order(by)
        if cohort is not None and cohort not in await self.groups() and not self.staffs(cohort):
            raise Forbidden(f"Only cohort {cohort}'s members and staff see its leaderboard.")
        return await self.portal.kits.standings(kit, cohort, by)


class KitSubmissionsApi(ApiHandler, KitsMixin):
    """``POST api/kits/KIT/submissions``: score a model on the kit's blind data, and put
    it on the leaderboard of the submitter's cohort."""

    async def post(self, kit_id: str) -> None:
        kit = self.kit(kit_id)
        try:
            ask = kit_views.submission_from_json(self.json_body())
        except InvalidCohort as e:
            raise InvalidInput(str(e)) from None
        groups = await self.groups()
        result = await self.portal.kits.submit(self.user["name"], groups, kit, ask)
        self.write_json(result, status=201)


class LeaderboardApi(ApiHandler, KitsMixin):
    """``GET api/kits/KIT/leaderboard?cohort=NAME&by=user|team``: each one's best score."""

    async def get(self, kit_id: str) -> None:
        kit = self.kit(kit_id)
        cohort = self.get_argument("cohort", None) or None
        by = self.get_argument("by", "user")
        ranked = await self.standings(kit, cohort, by)
        self.write_json(
            {
                "kit": kit.id,
                "cohort": cohort,
                "by": by,
                "standings": [kit_views.standing_json(s) for s in ranked],
            }
        )


class LeaderboardsPage(PageHandler, KitsMixin):
    """``leaderboards?kit=KIT&cohort=NAME&by=user|team``: a kit's board, for people."""

    @authenticated
    async def get(self) -> None:
        kits = self.portal.catalog.kits
        if not kits:
            raise NotFound("This hub offers no starter kits, so it has no leaderboards.")
        kit = self.kit(self.get_argument("kit", kits[0].id))
        groups = await self.groups()
        cohorts = await self.portal.cohort_names()
        boards = [c for c in cohorts if c in groups or self.staffs(c)]
        cohort = self.get_argument("cohort", boards[0] if boards else "") or None
        by = self.get_argument("by", "user")
        ranked = await self.standings(kit, cohort, by)
        self.render_page(
            "leaderboards.html",
            kits=kits,
            kit=kit,
            boards=boards,
            cohort=cohort,
            by=by,
            standings=[kit_views.standing_json(s) for s in ranked],
        )
