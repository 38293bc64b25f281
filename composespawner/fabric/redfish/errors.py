"""Redfish error bodies and statuses, mapped onto the fabric error tree (pure).

A Redfish error answer looks like::

    {"error": {"code": "Base.1.22.1.GeneralError", "message": "...",
               "@Message.ExtendedInfo": [{"MessageId": "Composition.1.1.3.IncompatibleZone",
                                          "Message": "..."}]}}

We match on the part of a MessageId after its registry prefix and version
(``IncompatibleZone``), because registries get new versions and vendors copy
them under their own prefixes. Looser services (and the web servers and
proxies in front of them) answer errors with plain text, an HTML page or JSON
of their own: then the body itself, cut short, is the only detail there is.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from composespawner.fabric.base import (
    DeviceInUse,
    DeviceNotFound,
    FabricAuthError,
    FabricRefused,
    IncompatibleZone,
    NoResourceMatch,
    StaleETag,
)

# Short MessageIds (without registry prefix and version) and what they mean to us.
_REFUSAL_BY_MESSAGE: Mapping[str, type[FabricRefused]] = {
    "ResourceBlockInUse": DeviceInUse,
    "SpecifiedResourceAlreadyReserved": DeviceInUse,
    "ConstrainedResourceAlreadyReserved": DeviceInUse,
    "ResourceBlockNotFound": DeviceNotFound,
    "ResourceNotFound": DeviceNotFound,
    "ResourceMissingAtURI": DeviceNotFound,
    "IncompatibleZone": IncompatibleZone,
    "NoResourceMatch": NoResourceMatch,
    "PreconditionFailed": StaleETag,
    "PreconditionRequired": StaleETag,
    "NoValidSession": FabricAuthError,
    "InsufficientPrivilege": FabricAuthError,
}

_REFUSAL_BY_STATUS: Mapping[int, type[FabricRefused]] = {
    401: FabricAuthError,
    403: FabricAuthError,
    404: DeviceNotFound,
    412: StaleETag,
    428: StaleETag,
}

# How much of an error body that is no Redfish error goes into a message: enough
# for a proxy's or framework's one-line reason, never a whole page in a log line.
BODY_EXCERPT_CHARS = 240
_HTML_HIDDEN = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_HTML_TAG = re.compile(r"<[^>]*>")

# Message ids that say "this block is not attached here" when detaching.
NOT_ATTACHED_IDS = frozenset({"ResourceBlockNotFound", "ResourceNotFound", "ResourceBlockInvalid"})


def short_message_id(message_id: str) -> str:
    """``Composition.1.1.3.IncompatibleZone`` → ``IncompatibleZone``."""
    return message_id.rsplit(".", 1)[-1]


def parse_body(body: bytes) -> Any:
    """The JSON of an answer, or None when it has none or it is not JSON."""
    if not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def error_messages(document: Any) -> tuple[list[str], list[str]]:
    """(MessageIds, human messages) of a Redfish error body or a Task's Messages."""
    if not isinstance(document, Mapping):
        return [], []
    error = document.get("error")
    infos: Any = []
    ids: list[str] = []
    texts: list[str] = []
    if isinstance(error, Mapping):
        infos = error.get("@Message.ExtendedInfo") or []
    elif isinstance(document.get("Messages"), list):  # a Task resource
        infos = document["Messages"]
    for info in infos if isinstance(infos, list) else []:
        if isinstance(info, Mapping):
            _append_message(info.get("MessageId"), info.get("Message"), ids, texts)
    if not ids and isinstance(error, Mapping):
        # "code" is usually Base.GeneralError ("see ExtendedInfo"): only a fallback.
        _append_message(error.get("code"), error.get("message"), ids, texts)
    return ids, texts


def _append_message(message_id: Any, text: Any, ids: list[str], texts: list[str]) -> None:
    if isinstance(message_id, str) and message_id:
        ids.append(message_id)
    if isinstance(text, str) and text:
        texts.append(text)


def refusal(status: int, document: Any, what: str, body: bytes = b"") -> FabricRefused:
    """The typed exception for an error answer ``status`` with body ``document``.

    ``document`` is the body's JSON (None when it is none), ``body`` the body
    as sent: where it holds no Redfish messages the message shows the body,
    cut short. The most specific MessageId wins over the status: a 400 carrying
    ``IncompatibleZone`` is an :class:`IncompatibleZone`. 5xx answers map to a
    plain :class:`FabricRefused`: the fabric answered, so it is not
    unreachable; whether to try again later is the caller's decision (this
    client already retried idempotent calls a few times).
    """
    ids, texts = error_messages(document)
    kind = refusal_class(status, ids)
    detail = "; ".join(texts) or body_excerpt(body) or "no details"
    return kind(f"{what}: HTTP {status}: {detail}", status=status, message_ids=ids)


def body_excerpt(body: bytes, limit: int = BODY_EXCERPT_CHARS) -> str:
    """An answer's body as one line of text, cut short ("" when it has none).

    An HTML page is reduced to its text (a web server's error page says its
    reason in the title and a paragraph, under a head of styles).
    """
    text = body.decode("utf-8", errors="replace")
    if _looks_like_html(text):
        text = html.unescape(_HTML_TAG.sub(" ", _HTML_HIDDEN.sub(" ", text)))
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _looks_like_html(text: str) -> bool:
    start = text.lstrip()[:100].lower()
    return start.startswith(("<!doctype html", "<html")) or "<body" in start


def refusal_class(status: int, message_ids: Sequence[str]) -> type[FabricRefused]:
    for message_id in message_ids:
        kind = _REFUSAL_BY_MESSAGE.get(short_message_id(message_id))
        if kind is not None:
            return kind
    return _REFUSAL_BY_STATUS.get(status, FabricRefused)


def has_message(message_ids: Sequence[str], wanted: frozenset[str] | str) -> bool:
    """Whether any of ``message_ids`` is (one of) ``wanted`` by its short name."""
    names = frozenset({wanted}) if isinstance(wanted, str) else wanted
    return any(short_message_id(m) in names for m in message_ids)
