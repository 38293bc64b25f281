"""What the portal's service refuses, and with which status: the portal's error tree.

The service (``portal/service.py``) raises these, never tornado's ``HTTPError``;
the handlers' one ``write_error`` (``portal/handlers/base.py``) turns them, and the
hub client's ``HubUnavailable``, into a status and the message a person reads.

::

    PortalError          (status: its own, e.g. a spawner's or a scorer's refusal)
    ├── InvalidInput     400: what was sent cannot be used; the message says what to send
    ├── Forbidden        403: the caller may not do this
    ├── NotFound         404: no such thing, or none the caller may see
    ├── Conflict         409: not now, as things stand (a server running, a run not relaunchable)
    ├── NotOffered       501: this portal was started without the part that does it
    └── Unavailable      503: a part it needs cannot serve now; trying again later may work
"""

from __future__ import annotations


class PortalError(Exception):
    """A request the portal refuses; the message is for the person who asked."""

    status = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def message(self) -> str:
        return str(self)


class InvalidInput(PortalError):
    status = 400


class Forbidden(PortalError):
    status = 403


class NotFound(PortalError):
    status = 404


class Conflict(PortalError):
    status = 409


class NotOffered(PortalError):
    status = 501


class Unavailable(PortalError):
    status = 503
