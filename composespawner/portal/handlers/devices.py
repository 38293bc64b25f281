"""Devices: the inventory and force-release (admins); co-located GPUs registered (admins)
and lent (admins and their owner group's members)."""

from __future__ import annotations

from datetime import date
from typing import Any
from urllib.parse import unquote

from composespawner.domain.colocation import Registration
from composespawner.portal import views
from composespawner.portal.errors import InvalidInput, NotFound
from composespawner.portal.handlers.base import ApiHandler, FormPage, PortalHandler

MOST_REASON = 500


class InventoryApi(ApiHandler):
    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.portal.inventory())


class ReleaseMachineApi(ApiHandler):
    """``POST api/machines/ID/release`` with ``{"reason": "..."}``: stop its server."""

    async def post(self, machine_id: str) -> None:
        self.require_admin()
        body = self.json_body()
        reason = body.get("reason") if isinstance(body, dict) else None
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MOST_REASON:
            raise InvalidInput(f"Say why, for the user: a reason of 1 to {MOST_REASON} characters.")
        result = await self.portal.force_release(unquote(machine_id), reason.strip(), self.actor)
        self.write_json(result, status=202)


class InventoryPage(FormPage):
    path = "inventory"

    async def act(self, form: dict[str, str]) -> None:
        reason = form.get("reason", "").strip()
        if not reason or len(reason) > MOST_REASON:
            raise InvalidInput(f"Say why, for the user: 1 to {MOST_REASON} characters.")
        await self.portal.force_release(form.get("machine", ""), reason, self.actor)

    async def render_form(self, **context: Any) -> None:
        view = await self.portal.inventory()
        view["devices"], paging = views.page_of(view["devices"], self.get_argument("page", None))
        self.render_page("inventory.html", inventory=view, paging=paging, **context)


class ColocatedMixin(PortalHandler):
    """Registering co-located GPUs (admins), and lending them (admins and their owners)."""

    def lenders_groups(self) -> list[str] | None:
        """Whose devices the caller may lend: the groups they are in; None, any (admins)."""
        return None if self.is_admin else list(self.user.get("groups", []))

    async def colocated_view(self) -> list[dict[str, Any]]:
        return await self.portal.colocated(self.lenders_groups())

    async def register(self, block: str, owner_group: str) -> Registration:
        self.require_admin()
        return await self.portal.register_device(block, owner_group, self.actor)

    async def unregister(self, block: str) -> bool:
        """Give a registered device back to its catalog owner, or to the pool."""
        self.require_admin()
        return await self.portal.unregister_device(block, self.actor)

    async def lend(self, block: str, body: object) -> Registration:
        """Lend (or, with body None, take back) a device the caller's group owns."""
        return await self.portal.lend(block, body, self.actor, self.lenders_groups())


class ColocatedApi(ApiHandler, ColocatedMixin):
    async def get(self) -> None:
        self.user  # noqa: B018 (403 for anonymous)
        self.write_json({"devices": await self.colocated_view()})


class DeviceOwnerApi(ApiHandler, ColocatedMixin):
    """``api/devices/BLOCK/owner``: PUT ``{"owner_group": NAME}`` registers, DELETE gives back."""

    async def put(self, block: str) -> None:
        self.require_admin()
        body = self.json_body()
        group = body.get("owner_group") if isinstance(body, dict) else None
        if not isinstance(group, str) or not group:
            raise InvalidInput('Name the owner: {"owner_group": "vision-lab"}.')
        registration = await self.register(unquote(block), group)
        self.write_json({"id": registration.block_id, "owner_group": registration.owner_group})

    async def delete(self, block: str) -> None:
        self.require_admin()
        block = unquote(block)
        if not await self.unregister(block):
            raise NotFound(f"{block!r} is not a registered co-located device.")
        self.no_content()


class DeviceLoanApi(ApiHandler, ColocatedMixin):
    """``api/devices/BLOCK/loan``: PUT lends (``{"user"|"group": NAME, "until": DATE}``), DELETE
    takes back. For admins and the owner group's members."""

    async def put(self, block: str) -> None:
        lent = await self.lend(unquote(block), self.json_body())
        self.write_json({"id": lent.block_id, "loan": views.loan_json(lent)})

    async def delete(self, block: str) -> None:
        await self.lend(unquote(block), None)
        self.no_content()


class ColocatedPage(FormPage, ColocatedMixin):
    path = "colocated"
    admins_only = False  # owners lend their own; each action checks who may

    async def act(self, form: dict[str, str]) -> None:
        action, block = form.get("action", ""), form.get("block", "")
        if action == "register":
            await self.register(block, form.get("owner_group", "").strip())
        elif action == "unregister":
            await self.unregister(block)
        elif action == "lend":
            kind = "group" if form.get("to_kind") == "group" else "user"
            await self.lend(block, {kind: form.get("to", "").strip(), "until": form.get("until")})
        elif action == "take_back":
            await self.lend(block, None)
        else:
            raise InvalidInput("Choose register, unregister, lend or take back.")

    async def render_form(self, **context: Any) -> None:
        devices = await self.colocated_view()
        self.render_page("colocated.html", devices=devices, today=date.today(), **context)
