"""JupyterHub's REST API as composespawner's services call it: one client for all of them.

The reconciler reads every active server and stops those whose machine has
ended; the portal reads users and groups and starts and stops servers for
people. Both go through :class:`HubClient`, so they read the API one way:

- **One error**, :class:`HubUnavailable`: a transport error, a timeout, a 5xx, or
  an answer the API does not document. The hub's state is then unknown, and
  unknown is not dead: callers leave things as they are and try again later.
- **Already gone is done**: stopping a server or user the hub does not have (404)
  is not an error; reading one answers None.
- **One quoting rule**: user and server names are single path segments, url-quoted
  with nothing left safe (a ``/`` in a name must not become a path).
- **One paging rule**: collections are asked for with JupyterHub's pagination
  media type (``Accept: application/jupyterhub-pagination+json``, JupyterHub 2.0
  and later) and read page by page, following ``_pagination.next`` until it is
  null. A bare list means the hub ignored the header; as it is cut at the hub's
  page limit, reading it as the whole would take users beyond it for users
  without servers, so it is an error, not a short answer.
- **Every call its own timeout**, a page of a collection included.

aiohttp rather than tornado's ``AsyncHTTPClient``: it is a core dependency the
fabric's client already uses; a session is this client's own, closed with it
(``AsyncHTTPClient()`` is one shared instance per event loop, and its queue of
ten connections counts against each request's timeout); a timeout bounds each
whole call, reading the body included; and statuses are read, not raised, so
each call says which ones are answers.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

HUB_TIMEOUT = 10.0  # seconds for one call to the hub's API (one page of a collection)
PAGE = 200  # JupyterHub's largest page (api_page_max_limit's default)
PAGINATED = "application/jupyterhub-pagination+json"  # items with a "next" link
# Rosters change by the term, and the usage page reads every group on each load:
# 500 cohorts are several hub calls, a third of a second.
MEMBERS_MAX_AGE = 60.0

Model = dict[str, Any]


class HubUnavailable(Exception):
    """The hub's API did not answer as it documents; the message is for logs."""


class Stop(enum.Enum):
    """What the hub answered a stop: each caller decides what is done and what is not."""

    STOPPING = "stopping"  # 202 or 204: stopping, or stopped
    GONE = "gone"  # 404: no such user or server (already gone)
    REFUSED = "refused"  # 400: not now (named servers off, a rename in progress)


def server_path(user: str, server: str) -> str:
    """The API path of ``user``'s server ``server`` ('' for the default server)."""
    if not server:
        return f"/users/{quote(user, safe='')}/server"
    return f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"


class HubClient:
    """The hub's REST API, with a service's token (its scopes say what it may do)."""

    def __init__(
        self,
        api_url: str,
        token: str,
        timeout: float = HUB_TIMEOUT,
        members_max_age: float = MEMBERS_MAX_AGE,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.members_max_age = members_max_age
        self._headers = {"Authorization": f"token {token}"}
        self._session: aiohttp.ClientSession | None = None
        self._members: tuple[float, dict[str, list[str]]] | None = None

    @classmethod
    def from_environment(cls) -> HubClient:
        """The hub's API as a hub-managed service finds it in its environment."""
        return cls(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])

    # -- users and groups ---------------------------------------------------------

    async def users(self, *, state: str | None = None) -> list[Model]:
        """Every user's model; ``state='active'``: only users with a server running or pending.

        With ``admin:server_state``, each server's model carries its spawner's state.
        """
        return await self._collection("/users", {"state": state} if state else {})

    async def user_groups(self, name: str) -> list[str] | None:
        """The user's groups; None if the hub has no such user."""
        model = await self._get(f"/users/{quote(name, safe='')}")
        return None if model is None else list(model.get("groups", []))

    async def group_exists(self, name: str) -> bool:
        return await self._get(f"/groups/{quote(name, safe='')}") is not None

    async def group_members(self) -> dict[str, list[str]]:
        """Every group and its users, as read at most ``members_max_age`` seconds ago."""
        if self._members and time.monotonic() - self._members[0] < self.members_max_age:
            return self._members[1]
        read_at = time.monotonic()
        groups = await self._collection("/groups")
        members = {group["name"]: list(group.get("users", [])) for group in groups}
        self._members = (read_at, members)
        return members

    # -- servers ------------------------------------------------------------------

    async def stop_server(self, user: str, server: str) -> Stop:
        """Ask the hub to stop a server (its spawner gives the devices back).

        A stop asked again later is safe whatever the answer.
        """
        path = server_path(user, server)
        try:
            async with self._session_().delete(self._url(path), timeout=self._timeout()) as answer:
                if answer.status in (202, 204):
                    return Stop.STOPPING
                if answer.status in (400, 404):
                    return Stop.REFUSED if answer.status == 400 else Stop.GONE
                raise HubUnavailable(f"DELETE {path}: {answer.status} {await answer.text()}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HubUnavailable(f"DELETE {path}: {_said(e)}") from e

    async def start_server(self, user: str, server: str, user_options: Model) -> tuple[int, str]:
        """Ask the hub to start a server with these options: its status and message.

        201 or 202: started or starting. Anything else is the hub's (or the
        spawner's) refusal, whose message says why (quota, capacity, running): a
        5xx included, as a spawner refuses with 503 while the fabric is down and
        its message is the one to show. Only no answer is HubUnavailable.
        """
        path = server_path(user, server)
        body = {"user_options": user_options}
        try:
            async with self._session_().post(
                self._url(path), json=body, timeout=self._timeout()
            ) as answer:
                if answer.status in (201, 202):
                    return answer.status, ""
                text = await answer.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HubUnavailable(f"POST {path}: {_said(e)}") from e
        return answer.status, _message(text)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the wire -----------------------------------------------------------------

    async def _collection(self, path: str, query: Mapping[str, str] | None = None) -> list[Model]:
        """Every item of a paginated collection, one page (one call, one timeout) at a time."""
        items: list[Model] = []
        offset, limit = 0, PAGE
        while True:
            where = f"{path}?{urlencode({**(query or {}), 'offset': offset, 'limit': limit})}"
            page = await self._get(where, PAGINATED)
            if page is None:
                raise HubUnavailable(f"GET {where}: 404")
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise HubUnavailable(f"GET {where}: not a page of {PAGINATED}")
            items += page["items"]
            following = (page.get("_pagination") or {}).get("next")
            if not following:
                return items
            if int(following["offset"]) <= offset:
                raise HubUnavailable(f"GET {where}: the next page goes back to {following}")
            offset, limit = int(following["offset"]), int(following.get("limit", limit))

    async def _get(self, path: str, accept: str = "application/json") -> Any:
        """The answer's JSON; None for a 404."""
        try:
            async with self._session_().get(
                self._url(path), headers={"Accept": accept}, timeout=self._timeout()
            ) as answer:
                if answer.status == 404:
                    return None
                if answer.status != 200:
                    raise HubUnavailable(f"GET {path}: {answer.status} {await answer.text()}")
                return await answer.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise HubUnavailable(f"GET {path}: {_said(e)}") from e

    def _url(self, path: str) -> str:
        return self.api_url + path

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.timeout)

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session


def _message(text: str) -> str:
    """The message of one of JupyterHub's error bodies (``{"status", "message"}``), or the text."""
    try:
        return str(json.loads(text).get("message") or text)
    except (ValueError, AttributeError):
        return text


def _said(error: BaseException) -> str:
    """An error for the log, its kind named (a timeout's own text is empty)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
