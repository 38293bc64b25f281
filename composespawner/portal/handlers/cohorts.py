"""Cohorts: admins manage all of them; course staff their own, but not its reservation."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from composespawner.domain.cohorts import Cohort
from composespawner.portal import reclaim_views, views
from composespawner.portal.errors import InvalidInput, NotFound
from composespawner.portal.handlers.base import ApiHandler, FormPage, PortalHandler


class CohortsMixin(PortalHandler):
    """What the cohort calls and page share."""

    async def my_cohorts(self) -> list[dict[str, Any]]:
        return [c for c in await self.portal.cohorts() if self.staffs(c["name"])]

    async def set_cohort(self, name: str, body: object) -> Cohort:
        self.require_staff(name)
        return await self.portal.set_cohort(name, body, self.actor, admin=self.is_admin)


class CohortsApi(ApiHandler, CohortsMixin):
    async def get(self) -> None:
        self.require_staff()
        self.write_json({"cohorts": await self.my_cohorts()})


class CohortApi(ApiHandler, CohortsMixin):
    """One cohort: ``api/cohorts/NAME``, NAME its hub group."""

    async def get(self, name: str) -> None:
        name = unquote(name)
        self.require_staff(name)
        self.write_json(await self.portal.cohort(name))

    async def put(self, name: str) -> None:
        cohort = await self.set_cohort(unquote(name), self.json_body())
        self.write_json(views.cohort_json(cohort, self.portal.catalog))

    async def delete(self, name: str) -> None:
        self.require_admin()
        name = unquote(name)
        if not await self.portal.delete_cohort(name, self.actor):
            raise NotFound(f"No cohort {name!r} to delete.")
        self.no_content()


class CohortReclaimPolicyApi(ApiHandler):
    """``api/cohorts/NAME/reclaim-policy``: when the cohort's idle GPUs go back. Its staff
    read it; admins set it (PUT the fields that differ from the site's, in seconds) or
    give it back to the site's (DELETE): it decides how long others wait for GPUs."""

    async def get(self, name: str) -> None:
        name = unquote(name)
        self.require_staff(name)
        self.write_json(await self.portal.reclaims.cohort_policy(name))

    async def put(self, name: str) -> None:
        self.require_admin()
        changed = await self.portal.reclaims.set_cohort_policy(
            unquote(name), self.json_body(), self.actor
        )
        self.write_json(changed)

    async def delete(self, name: str) -> None:
        self.require_admin()
        await self.portal.reclaims.set_cohort_policy(unquote(name), {}, self.actor)
        self.no_content()


class CohortsPage(FormPage, CohortsMixin):
    path = "cohorts"
    admins_only = False  # course staff manage their own; each action checks who may

    async def render_form(self, **context: Any) -> None:
        self.require_staff()
        cohorts = await self.my_cohorts()
        reclaims = self.portal.reclaims
        self.render_page(
            "cohorts.html",
            cohorts=cohorts,
            reclaim_policies=await reclaims.cohort_policies(c["name"] for c in cohorts),
            form_value=reclaim_views.form_value,
            site_reclaim_policy=reclaim_views.policy_text(reclaims.site.as_dict()),
            models=self.portal.model_ids,
            share_sizes=sorted({n for m in self.portal.catalog.gpu_models for n in m.shares}),
            sizes=[s.id for s in self.portal.catalog.sizes],
            timezone=str(self.portal.timezone),
            **context,
        )

    async def act(self, form: dict[str, str]) -> None:
        name = form.get("name", "").strip()
        if form.get("action") == "delete":
            self.require_admin()
            await self.portal.delete_cohort(name, self.actor)
            return
        if form.get("action") == "reclaim-policy":
            self.require_admin()
            stored = (await self.portal.reclaims.cohort_policy(name))["overrides"]
            try:
                overrides = reclaim_views.policy_from_form(form, stored)
            except ValueError as e:
                raise InvalidInput(str(e)) from None
            await self.portal.reclaims.set_cohort_policy(name, overrides, self.actor)
            return
        await self.set_cohort(name, views.cohort_body_from_form(form))
