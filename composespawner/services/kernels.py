"""The kernels of a user's notebook server, through the hub's proxy: listed and shut down.

The reclaimer shuts down the kernels that hold a GPU before it takes the GPU back
(``services/reclaimer.py``). It reaches each server as a browser does, at
``{hub_url}/user/{name}/{server}/api/kernels``, with its own service token: the
single-user server asks the hub whether that token may ``access:servers``.

Every call has its own timeout, and every answer that is not the API's documented
one (a redirect to the hub's login, a 503 from the proxy for a server that is not
up, an HTML page) is :class:`KernelsUnavailable`: the kernels are then unknown, and
the caller leaves the GPU alone until a later pass. A kernel already gone (404 on
its shutdown) is shut down.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

KERNELS_TIMEOUT = 10.0  # seconds for one call; a shutdown waits for the kernel to exit


class KernelsUnavailable(Exception):
    """A server's kernels API did not answer as documented; the message is for logs."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """One running kernel as Jupyter Server's ``/api/kernels`` lists it."""

    id: str
    name: str
    execution_state: str  # 'idle', 'busy', 'starting', ...
    last_activity: str | None  # ISO 8601, as the server gives it


def server_prefix(user: str, server: str) -> str:
    """Where the proxy serves a user's server: as JupyterHub escapes names in URLs."""
    prefix = f"/user/{quote(user, safe='@~')}/"
    return f"{prefix}{quote(server, safe='@~')}/" if server else prefix


class NotebookKernels:
    """The kernels API of every user's server, reached through the hub's public URL."""

    def __init__(
        self, hub_url: str, token: str, timeout: float = KERNELS_TIMEOUT, ca_bundle: str = ""
    ) -> None:
        self.hub_url = hub_url.rstrip("/")
        self.timeout = timeout
        # "": the system's CAs. Read now: a bundle that cannot be read fails at start.
        self._tls = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else True
        self._headers = {"Authorization": f"token {token}"}
        self._session: aiohttp.ClientSession | None = None

    def url(self, user: str, server: str, kernel_id: str | None = None) -> str:
        path = f"{self.hub_url}{server_prefix(user, server)}api/kernels"
        return f"{path}/{quote(kernel_id, safe='')}" if kernel_id else path

    async def kernels(self, user: str, server: str) -> list[Kernel]:
        """The server's running kernels; :class:`KernelsUnavailable` when that is unknown."""
        url = self.url(user, server)
        body = await self._call("GET", url, expect=(200,))
        if not isinstance(body, list) or not all(_is_kernel(k) for k in body):
            raise KernelsUnavailable(f"GET {url}: not a list of kernels")
        return [
            Kernel(
                id=k["id"],
                name=str(k.get("name", "")),
                execution_state=str(k.get("execution_state", "unknown")),
                last_activity=k.get("last_activity"),
            )
            for k in body
        ]

    async def shut_down(self, user: str, server: str, kernel_id: str) -> None:
        """Shut one kernel down (its process ends); one already gone is shut down."""
        await self._call("DELETE", self.url(user, server, kernel_id), expect=(204, 404))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, url: str, *, expect: tuple[int, ...]) -> Any:
        """The JSON of an expected answer (None when it has no body)."""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            # No redirects: the hub sends a token it does not accept to its login page,
            # whose 200 must not pass for an answer of the server's.
            async with self._session_().request(
                method, url, timeout=timeout, allow_redirects=False
            ) as answer:
                if answer.status not in expect:
                    raise KernelsUnavailable(
                        f"{method} {url}: {answer.status} {(await answer.text())[:200]}"
                    )
                if answer.status != 200:
                    return None
                return await answer.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise KernelsUnavailable(f"{method} {url}: {_said(e)}") from e

    def _session_(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Made on first use, on the loop that uses it (as aiohttp wants).
            self._session = aiohttp.ClientSession(
                headers=self._headers, connector=aiohttp.TCPConnector(ssl=self._tls)
            )
        return self._session


def _is_kernel(item: object) -> bool:
    return isinstance(item, dict) and isinstance(item.get("id"), str) and bool(item["id"])


def _said(error: BaseException) -> str:
    """An error for the log, its kind named (a timeout's own text is empty)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
