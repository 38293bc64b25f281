"""Quota rules (admins): the site default, each cohort's and each user's; anyone's quota."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from composespawner.domain.quotas import InvalidQuota, Level
from composespawner.portal import views
from composespawner.portal.errors import InvalidInput, NotFound
from composespawner.portal.handlers.base import ApiHandler, FormPage


class QuotasApi(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        rules = await self.portal.quota_rules()
        self.write_json({"rules": [views.rule_json(rule) for rule in rules]})


class QuotaRuleApi(ApiHandler):
    """One level's rule: ``api/quotas/site``, ``.../cohort/NAME``, ``.../user/NAME``."""

    async def get(self, level: Level, subject: str) -> None:
        self.require_admin()
        self.write_json(views.rule_json(await self.portal.quota_rule(level, unquote(subject))))

    async def put(self, level: Level, subject: str) -> None:
        self.require_admin()
        subject = unquote(subject)
        try:
            rule = views.rule_from_json(level, subject, self.json_body(), self.portal.model_ids)
        except InvalidQuota as e:
            raise InvalidInput(str(e)) from None
        await self.portal.set_quota_rule(rule, self.actor)
        self.write_json(views.rule_json(rule))

    async def delete(self, level: Level, subject: str) -> None:
        self.require_admin()
        subject = unquote(subject)
        if not await self.portal.delete_quota_rule(level, subject, self.actor):
            raise NotFound(f"No {level} quota for {subject!r} to delete.")
        self.no_content()


class UserQuotaApi(ApiHandler):
    """Any user's effective quota, each limit with where it comes from."""

    async def get(self, name: str) -> None:
        self.require_admin()
        self.write_json(await self.portal.user_quota(unquote(name)))


class QuotasPage(FormPage):
    path = "quotas"

    async def act(self, form: dict[str, str]) -> None:
        if form.get("action") == "delete":  # the row's button: "level:subject"
            level, _, subject = form.get("rule", "").partition(":")
            views.check_subject(level, subject)
            await self.portal.delete_quota_rule(level, subject, self.actor)
            return
        level, subject = form.get("level", ""), form.get("subject", "")
        rule = views.rule_from_form(level, subject, form, self.portal.model_ids)
        await self.portal.set_quota_rule(rule, self.actor)

    async def render_form(self, **context: Any) -> None:
        rules = await self.portal.quota_rules()
        shown, paging = views.page_of(rules, self.get_argument("page", None))
        self.render_page(
            "quotas.html",
            rules=[views.rule_json(rule) for rule in shown],
            paging=paging,
            models=self.portal.model_ids,
            limits=views.LIMITS,
            **context,
        )
