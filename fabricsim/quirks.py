"""Switches that make the simulator an older or looser Redfish service (pure).

By default the simulator answers the way DMTF's current mockups do. Services
built on older schema bundles or looser web stacks (DMTF's own Redfish
Interface Emulator among them) differ in ways a client meets in the field;
each switch is a command-line option of ``fabricsim``:

``--zone-capabilities`` (with ``--composition specific``)
    POST of composed systems is advertised on each ResourceZone, by
    ``Links.CapabilitiesObjects`` naming the Systems collection's
    Capabilities object, and not by ``@Redfish.CollectionCapabilities`` on
    the Systems collection;
``--not-expandable HOST`` (with ``--composition expandable``; repeatable)
    that host's system is no expandable system: no ``ExpandableSystem`` use
    case and no Add/RemoveResourceBlock actions (refused as
    ``ActionNotSupported``), while a PATCH of its ``Oem`` still succeeds, as
    on any server (the state model keeps this one: it refuses the actions);
``--composed-blocks-read-only`` (with ``--composition specific`` or ``action``)
    a composed system's ``Links.ResourceBlocks`` cannot be PATCHed (400
    ``PropertyNotWritable``; its ``Oem`` still can), as on services whose
    composed systems keep the blocks they were made of until DELETE; each
    system says so, by ``Links`` carrying ``@Redfish.WriteableProperties``
    without ``ResourceBlocks``;
``--stale-block-status``
    a block keeps reading ``CompositionState`` Unused, with no
    ``Links.ComputerSystems``, while it is composed: only the system's
    ``Links.ResourceBlocks`` says it is taken (a second claim is still
    refused);
``--error-bodies text|html|json``
    error answers carry plain text, a web server's HTML page, or JSON that
    is no Redfish error object, instead of ``{"error": {...}}``.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal

ErrorBodies = Literal["redfish", "text", "html", "json"]
ERROR_BODIES: tuple[ErrorBodies, ...] = ("redfish", "text", "html", "json")


@dataclass(frozen=True, slots=True)
class ServiceQuirks:
    """How the service's answers depart from DMTF's current mockups (all off by default)."""

    zone_capabilities: bool = False
    composed_blocks_read_only: bool = False
    stale_block_status: bool = False
    error_bodies: ErrorBodies = "redfish"


NO_QUIRKS = ServiceQuirks()


def loose_error_answer(shape: ErrorBodies, status: int, message: str) -> tuple[str, bytes]:
    """Content-Type and body of an error answer that is no Redfish error object."""
    reason = HTTPStatus(status).phrase
    if shape == "text":
        return "text/plain; charset=utf-8", f"{status} {reason}: {message}\n".encode()
    if shape == "json":
        # RFC 9457 problem details: what many web frameworks answer.
        problem = {"type": "about:blank", "title": reason, "status": status, "detail": message}
        return "application/problem+json", json.dumps(problem).encode()
    return "text/html; charset=utf-8", _error_page(status, reason, message).encode()


def _error_page(status: int, reason: str, message: str) -> str:
    """An error page the way a web server in front of a service writes one."""
    title = f"{status} {reason}"
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        f"<title>{title}</title>\n"
        "<style>\nbody { font-family: sans-serif; margin: 2em auto; max-width: 40em; }\n"
        "h1 { font-size: 1.5em; border-bottom: 1px solid #ccc; }\n</style>\n"
        "</head>\n<body>\n"
        f"<h1>{title}</h1>\n<p>{html.escape(message, quote=False)}</p>\n"
        "<hr><address>fabricsim</address>\n</body>\n</html>\n"
    )
