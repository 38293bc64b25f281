"""HTTP to one Redfish service: sessions, timeouts, retries, deadlines.

Every request here has its own connect and request timeout, both capped by
the :class:`Deadline` of the protocol method it serves. Transport failures
(refused, reset, dropped, timed out) and 5xx answers are retried with jittered
exponential backoff inside that deadline; 401 logs in again once. What comes
out is either a :class:`Response` (any HTTP status: the caller decides what an
error status means) or a fabric error from ``base.py``: no aiohttp or socket
exception escapes.

The password and the session token are never logged and never put into an
exception message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import yarl

from composespawner.fabric.base import (
    FabricAuthError,
    FabricCertificateError,
    FabricDeadlineExceeded,
    FabricRefused,
    FabricUnreachable,
)
from composespawner.fabric.redfish.errors import error_messages, parse_body, refusal
from composespawner.fabric.redfish.mapping import dig

Clock = Callable[[], float]

SERVICE_ROOT = "/redfish/v1/"
DEFAULT_SESSIONS = "/redfish/v1/SessionService/Sessions"
# Default bound on requests in flight to one service. Discovery fans out one
# request per member and a spawn storm sends several per spawn: too low a bound
# queues every spawn behind it; BMC-class services want it lower (8-16).
MAX_IN_FLIGHT = 64
# Answers to POST Sessions that mean "this service has no sessions": fall back
# to HTTP Basic, which every Redfish service must accept (DSP0266 §13.3).
_NO_SESSIONS = frozenset({404, 405, 501})
_RETRIED_STATUSES = frozenset({500, 502, 503, 504})
_CLOSE_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class RedfishTimeouts:
    """Seconds, like httpx's ``Timeout``.

    ``connect`` and ``request`` bound each HTTP request; ``operation`` bounds
    one protocol method (``inventory()``, ``attach()``, ...) with all its
    retries, re-logins and task polling; ``task_poll_max`` caps how long we
    honour a task monitor's ``Retry-After`` between polls.
    """

    connect: float = 5.0
    request: float = 10.0
    operation: float = 60.0
    task_poll_max: float = 5.0

    def __post_init__(self) -> None:
        for name in ("connect", "request", "operation", "task_poll_max"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RedfishTimeouts.{name} must be positive")


@dataclass(frozen=True, slots=True)
class RedfishRetry:
    """How often to try again, and how long to wait in between.

    ``attempts`` bounds tries of one request on transport failures and 5xx
    answers; ``etag_attempts`` bounds re-reads of a resource whose ETag went
    stale under us (412) before giving up with ``StaleETag``.
    """

    attempts: int = 4
    backoff_first: float = 0.2
    backoff_max: float = 2.0
    # Several machines joining one shared host rewrite its mark in turn: each loses
    # to the others at most once per write they make.
    etag_attempts: int = 12

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.etag_attempts < 1:
            raise ValueError("RedfishRetry attempts must be at least 1")


class Deadline:
    """The end of one protocol method's time budget."""

    def __init__(self, seconds: float, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return self._end - self._clock()


@dataclass(frozen=True, slots=True)
class Response:
    """One HTTP answer of the service, any status."""

    method: str
    path: str
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"

    def document(self) -> dict[str, Any]:
        """The JSON object of the body ({} for an empty body)."""
        if not self.body:
            return {}
        document = parse_body(self.body)
        if not isinstance(document, dict):
            # The service answered but we cannot read it: what it did is unknown.
            raise FabricUnreachable(f"{self.what}: answer is not a JSON object")
        return document

    def etag(self) -> str | None:
        tag = self.headers.get("ETag")
        if tag:
            return tag
        tag = parse_body(self.body)
        tag = tag.get("@odata.etag") if isinstance(tag, dict) else None
        return tag if isinstance(tag, str) else None

    def refusal(self) -> FabricRefused:
        return refusal(self.status, parse_body(self.body), self.what, self.body)


@dataclass(frozen=True, slots=True)
class _Session:
    mode: Literal["none", "token", "basic"] = "none"
    token: str = field(default="", repr=False)
    location: str | None = None


class _NoAnswer(Exception):
    """One request got no HTTP answer (refused, reset, dropped, timed out)."""


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds, or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def backoff_delay(attempt: int, retry: RedfishRetry, rng: random.Random | None = None) -> float:
    """Seconds to wait before try ``attempt + 1``: exponential, half of it jittered."""
    ceiling = min(retry.backoff_max, retry.backoff_first * 2 ** (attempt - 1))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def origin_of(base_url: str) -> str:
    """``scheme://host:port`` of the service; refuses anything else."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"Redfish base URL must be http(s)://host[:port], got {base_url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """Certificate verification for https services: always on.

    ``ca_bundle`` (a PEM file of CA certificates) replaces the system's CAs,
    for fabric managers whose certificate comes from a site CA; None or empty
    trusts the system's CAs. A missing or unreadable bundle is a ValueError
    now, not a refused connection at the first request.
    """
    if not ca_bundle:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot use {ca_bundle!r} as a CA bundle (PEM): {exc}") from exc


def local_path(uri: str) -> str:
    """The path (and query) of ``uri``, dropping any scheme and host.

    Links and ``Location`` headers may be absolute; we only ever follow them on
    the configured service, so our credentials never go to another host.
    """
    parts = urlsplit(uri)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class RedfishTransport:
    """Authenticated, retried, deadline-bound HTTP requests to one service."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str,
        password: str,
        timeouts: RedfishTimeouts,
        retry: RedfishRetry,
        ca_bundle: str | None,
        log: logging.Logger,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._origin = origin_of(base_url)
        self._username = username
        self._password = password
        self.timeouts = timeouts
        self._retry = retry
        self._ca_bundle = ca_bundle
        self._tls = tls_context(ca_bundle)
        self._log = log
        self._session = _Session()
        self._login_lock = asyncio.Lock()
        self._max_in_flight = max_in_flight
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._client: aiohttp.ClientSession | None = None
        self._basic_auth = aiohttp.encode_basic_auth(username, password)
        self.answered_at = -math.inf  # time.monotonic() of the last answer, any status

    # -- requests ---------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        deadline: Deadline,
        *,
        payload: Any = None,
        headers: Mapping[str, str] | None = None,
        authenticated: bool = True,
    ) -> Response:
        """Send one request, retrying what is safe to retry; any status comes back."""
        path = local_path(path)
        relogged = False
        attempt = 0
        while True:
            attempt += 1
            session = await self._current_session(deadline) if authenticated else None
            try:
                response = await self._send(method, path, deadline, payload, headers, session)
            except _NoAnswer as exc:
                await self._pause_after_no_answer(attempt, deadline, f"{method} {path}: {exc}", exc)
                continue
            if session is not None and response.status in (401, 403) and not relogged:
                relogged = True
                await self._login_again(deadline, session)
                continue
            if response.status in _RETRIED_STATUSES and await self._paused_after_5xx(
                attempt, deadline, response
            ):
                continue
            return response

    async def _send(
        self,
        method: str,
        path: str,
        deadline: Deadline,
        payload: Any,
        headers: Mapping[str, str] | None,
        session: _Session | None,
    ) -> Response:
        async with self._in_flight:
            remaining = deadline.remaining()
            if remaining <= 0:
                raise FabricDeadlineExceeded(f"{method} {path}: deadline passed before sending")
            all_headers, body = self._message(payload, headers, session)
            timeout = aiohttp.ClientTimeout(
                total=min(self.timeouts.request, remaining),
                sock_connect=min(self.timeouts.connect, remaining),
            )
            started = time.monotonic()
            try:
                async with self._http().request(
                    method,
                    # As given: our paths are already quoted, and Redfish queries
                    # ($expand=.($levels=1)) must reach the service unchanged.
                    yarl.URL(self._origin + path, encoded=True),
                    headers=all_headers,
                    data=body,
                    timeout=timeout,
                    allow_redirects=False,
                    ssl=self._tls,
                ) as answer:
                    content = await answer.read()
            except aiohttp.ClientConnectorCertificateError as exc:
                raise self._untrusted(exc) from exc
            except Exception as exc:
                # aiohttp raises whatever broke the exchange: ClientConnectorError
                # (refused, TLS), ServerDisconnectedError (dropped), TimeoutError,
                # ClientResponseError (a malformed answer)... none of them is an answer.
                self._log.debug("%s %s: no answer (%s)", method, path, _describe(exc))
                if deadline.remaining() <= 0:
                    raise FabricDeadlineExceeded(f"{method} {path}: deadline passed") from exc
                raise _NoAnswer(_describe(exc)) from exc
        self.answered_at = time.monotonic()
        elapsed_ms = (self.answered_at - started) * 1000
        self._log.debug("%s %s -> %d in %.0f ms", method, path, answer.status, elapsed_ms)
        # answer.headers is case-insensitive, like HTTP: "ETag" finds "Etag".
        return Response(method, path, answer.status, answer.headers, content)

    def _untrusted(self, exc: aiohttp.ClientConnectorCertificateError) -> FabricCertificateError:
        trusted = f"the CA bundle {self._ca_bundle}" if self._ca_bundle else "the system's CAs"
        self._log.error("%s: TLS certificate not trusted: %s", self._origin, exc.certificate_error)
        return FabricCertificateError(
            f"{self._origin}: its TLS certificate is not trusted by {trusted}"
            f" ({exc.certificate_error}). If the fabric's certificate comes from a site CA,"
            " configure that CA's bundle (PEM) as the fabric CA bundle."
        )

    def _message(
        self, payload: Any, headers: Mapping[str, str] | None, session: _Session | None
    ) -> tuple[dict[str, str], bytes | None]:
        """A request's headers (with its credentials) and JSON body."""
        all_headers = {"Accept": "application/json", "OData-Version": "4.0", **(headers or {})}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            all_headers["Content-Type"] = "application/json"
        if session is not None and session.mode == "basic":
            all_headers["Authorization"] = self._basic_auth
        if session is not None and session.mode == "token":
            all_headers["X-Auth-Token"] = session.token
        return all_headers, body

    def _http(self) -> aiohttp.ClientSession:
        # Made lazily: a session belongs to the event loop running when it is
        # made, and a fabric object is usually configured before any loop runs.
        # One session keeps connections alive between requests: a spawn sends
        # several, and a new TCP connection for each cost the hub (and a BMC) more
        # than the request.
        if self._client is None:
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_in_flight),
                cookie_jar=aiohttp.DummyCookieJar(),  # Redfish sessions use X-Auth-Token
            )
        return self._client

    # -- retries ----------------------------------------------------------------

    async def _pause_after_no_answer(
        self, attempt: int, deadline: Deadline, reason: str, cause: Exception
    ) -> None:
        if attempt >= self._retry.attempts:
            raise FabricUnreachable(f"{reason} (tried {attempt} times)") from cause
        delay = backoff_delay(attempt, self._retry)
        if delay >= deadline.remaining():
            raise FabricDeadlineExceeded(f"{reason}; no time left to try again") from cause
        self._log.warning("%s; trying again in %.2f s", reason, delay)
        await asyncio.sleep(delay)

    async def _paused_after_5xx(self, attempt: int, deadline: Deadline, response: Response) -> bool:
        """Wait before trying a 5xx request again; False when we should not."""
        if attempt >= self._retry.attempts:
            return False
        asked = retry_after_seconds(response.headers.get("Retry-After"))
        delay = min(asked, self._retry.backoff_max) if asked is not None else None
        delay = backoff_delay(attempt, self._retry) if delay is None else delay
        if delay >= deadline.remaining():
            return False
        self._log.warning(
            "%s answered %d; trying again in %.2f s", response.what, response.status, delay
        )
        await asyncio.sleep(delay)
        return True

    # -- sessions ---------------------------------------------------------------

    async def _current_session(self, deadline: Deadline) -> _Session:
        if self._session.mode == "none":
            async with self._login_lock:
                if self._session.mode == "none":
                    await self._login(deadline)
        return self._session

    async def _login_again(self, deadline: Deadline, refused: _Session) -> None:
        async with self._login_lock:
            # Concurrent requests refused with the same session log in once.
            if self._session is refused:
                self._log.info("Redfish session at %s refused; logging in again", self._origin)
                await self._login(deadline)

    async def _login(self, deadline: Deadline) -> None:
        sessions = await self._sessions_path(deadline)
        credentials = {"UserName": self._username, "Password": self._password}
        response = await self.request(
            "POST", sessions, deadline, payload=credentials, authenticated=False
        )
        if response.status in _NO_SESSIONS:
            self._use_basic_auth(response.status)
        elif response.ok and response.headers.get("X-Auth-Token"):
            location = response.headers.get("Location") or response.document().get("@odata.id")
            self._session = _Session(
                "token",
                response.headers["X-Auth-Token"],
                local_path(location) if isinstance(location, str) else None,
            )
            self._log.debug("Redfish session opened at %s", self._session.location)
        elif response.ok or response.status in (400, 401, 403):
            ids, _ = error_messages(parse_body(response.body))
            raise FabricAuthError(
                f"login to {self._origin} as {self._username!r} refused: HTTP {response.status}",
                status=response.status,
                message_ids=ids,
            )
        else:
            raise response.refusal()

    def _use_basic_auth(self, status: int) -> None:
        self._session = _Session("basic")
        insecure = " over plain http" if self._origin.startswith("http:") else ""
        self._log.info(
            "%s offers no Redfish sessions (HTTP %d); using HTTP Basic auth%s",
            self._origin,
            status,
            insecure,
        )

    async def _sessions_path(self, deadline: Deadline) -> str:
        # The service root answers without authentication (DSP0266) and names
        # the sessions collection; older services only have the default path.
        root = await self.request("GET", SERVICE_ROOT, deadline, authenticated=False)
        if not root.ok:
            return DEFAULT_SESSIONS
        link = dig(root.document(), "Links", "Sessions", "@odata.id")
        return link if isinstance(link, str) else DEFAULT_SESSIONS

    # -- shutdown ---------------------------------------------------------------

    async def close(self) -> None:
        """Log out (best effort, briefly) and close connections."""
        session, self._session = self._session, _Session()
        if session.mode == "token" and session.location and self._client is not None:
            deadline = Deadline(min(_CLOSE_TIMEOUT, self.timeouts.request))
            try:
                await self._send("DELETE", session.location, deadline, None, None, session)
            except (FabricUnreachable, _NoAnswer) as exc:
                self._log.warning("could not log out of %s: %s", self._origin, exc)
        if self._client is not None:
            await self._client.close()
            self._client = None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
