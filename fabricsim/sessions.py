"""Redfish sessions: login tokens that expire when idle (pure; time is injected).

Sessions live only in memory, like a BMC's: a restarted service has logged
everyone out, and clients must log in again on 401.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(slots=True)
class Session:
    id: str
    token: str
    username: str
    created: datetime
    last_used: float  # clock() reading


class SessionStore:
    """Open sessions, by token and by Id."""

    def __init__(
        self, *, timeout_s: float = 1800.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    def create(self, username: str) -> Session:
        session = Session(
            id=secrets.token_hex(8),
            token=secrets.token_urlsafe(24),
            username=username,
            created=datetime.now(UTC),
            last_used=self._clock(),
        )
        self._by_id[session.id] = session
        return session

    def authenticate(self, token: str) -> Session | None:
        """The live session of ``token`` (and mark it used), or None."""
        self._expire()
        for session in self._by_id.values():
            if secrets.compare_digest(session.token, token):
                session.last_used = self._clock()
                return session
        return None

    def get(self, session_id: str) -> Session | None:
        self._expire()
        return self._by_id.get(session_id)

    def delete(self, session_id: str) -> bool:
        return self._by_id.pop(session_id, None) is not None

    def all(self) -> list[Session]:
        self._expire()
        return list(self._by_id.values())

    def _expire(self) -> None:
        deadline = self._clock() - self.timeout_s
        for session_id in [s.id for s in self._by_id.values() if s.last_used < deadline]:
            del self._by_id[session_id]
