"""The little of JupyterHub's REST API the portal needs, with the service's own token."""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import quote

import aiohttp

HUB_TIMEOUT = 10.0  # seconds for one call to the hub's API
GROUPS_PAGE = 200  # the hub's largest page
PAGINATED = "application/jupyterhub-pagination+json"  # items with a "next" link
# Rosters change by the term, and the usage page reads every group on each load:
# 500 cohorts are several hub calls, a third of a second.
MEMBERS_MAX_AGE = 60.0


class HubUnavailable(Exception):
    """The hub's API did not answer as expected; the message is for logs."""


class HubClient:
    def __init__(
        self,
        api_url: str,
        token: str,
        timeout: float = HUB_TIMEOUT,
        members_max_age: float = MEMBERS_MAX_AGE,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.members_max_age = members_max_age
        self._headers = {"Authorization": f"token {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._members: tuple[float, dict[str, list[str]]] | None = None

    @classmethod
    def from_environment(cls) -> HubClient:
        """The hub's API as a hub-managed service finds it in its environment."""
        return cls(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])

    async def group_exists(self, name: str) -> bool:
        return await self._get(f"/groups/{quote(name, safe='')}") is not None

    async def user_groups(self, name: str) -> list[str] | None:
        """The user's groups; None if the hub has no such user."""
        model = await self._get(f"/users/{quote(name, safe='')}")
        return None if model is None else list(model.get("groups", []))

    async def group_members(self) -> dict[str, list[str]]:
        """Every group and its users, as read at most ``members_max_age`` seconds ago."""
        if self._members and time.monotonic() - self._members[0] < self.members_max_age:
            return self._members[1]
        read_at = time.monotonic()
        members = await self._read_group_members()
        self._members = (read_at, members)
        return members

    async def _read_group_members(self) -> dict[str, list[str]]:
        members: dict[str, list[str]] = {}
        offset = 0
        while True:
            page = await self._get(f"/groups?offset={offset}&limit={GROUPS_PAGE}", PAGINATED)
            if page is None:
                raise HubUnavailable("GET /groups: 404")
            for group in page["items"]:
                members[group["name"]] = list(group.get("users", []))
            following = page["_pagination"].get("next")
            if not following:
                return members
            offset = following["offset"]

    async def stop_server(self, user: str, server: str) -> bool:
        """Ask the hub to stop a server (its spawner gives the devices back).

        False if the hub has no such server running.
        """
        path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        try:
            async with self._session_().delete(self.api_url + path) as response:
                if response.status in (202, 204):
                    return True
                if response.status in (400, 404):
                    return False  # not running, or no such user or server
                raise HubUnavailable(f"DELETE {path}: {response.status} {await response.text()}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HubUnavailable(f"DELETE {path}: {e!r}") from e

    async def start_server(
        self, user: str, server: str, user_options: dict[str, Any]
    ) -> tuple[int, str]:
        """Ask the hub to start a server with these options: its status and message.

        201 or 202: started or starting. Anything else is the hub's (or the
        spawner's) refusal, whose message says why (quota, capacity, running).
        """
        path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        try:
            async with self._session_().post(
                self.api_url + path, json={"user_options": user_options}
            ) as response:
                if response.status in (201, 202):
                    return response.status, ""
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HubUnavailable(f"POST {path}: {e!r}") from e
        try:
            message = str(json.loads(text).get("message") or text)
        except (ValueError, AttributeError):
            message = text
        return response.status, message

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def _get(self, path: str, accept: str = "application/json") -> dict[str, Any] | None:
        try:
            async with self._session_().get(
                self.api_url + path, headers={"Accept": accept}
            ) as response:
                if response.status == 404:
                    return None
                if response.status != 200:
                    raise HubUnavailable(f"GET {path}: {response.status} {await response.text()}")
                model: dict[str, Any] = await response.json()
                return model
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HubUnavailable(f"GET {path}: {e!r}") from e
