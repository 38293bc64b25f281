"""Fault switches for tests: make the simulated fabric slow, flaky or gone (pure).

Switched through ``/sim/faults`` when the simulator runs with ``--faults-api``
(a PUT replaces all settings, DELETE resets them). Each setting mimics a
failure a real fabric manager shows:

``latency_s``
    seconds added to every ``/redfish`` request;
``error_rate`` (with ``seed``)
    that share of writes (POST, PATCH, PUT, DELETE) answer 503, drawn from
    ``random.Random(seed)`` so a test run is repeatable;
``fail_after_attachments``
    *k*: the (k+1)-th and later AddResourceBlock calls since the PUT answer
    500 and change nothing (``null``: off);
``task_failure``
    asynchronous tasks end in ``Exception`` and change nothing;
``drop_connections``
    every ``/redfish`` request has its connection closed unanswered;
``unreachable_for_s``
    the same, for that many seconds after the PUT;
``stale_etags``
    every ETag or If-Match given is refused (412), as if someone else wrote;
``disabled_blocks``
    these resource blocks report ``Status.State`` Disabled and cannot be added.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


class FaultSettingsError(ValueError):
    """A fault document that does not fit :class:`FaultSettings`."""


@dataclass(frozen=True, slots=True)
class FaultSettings:
    latency_s: float = 0.0
    error_rate: float = 0.0
    seed: int = 0
    fail_after_attachments: int | None = None
    task_failure: bool = False
    drop_connections: bool = False
    unreachable_for_s: float = 0.0
    stale_etags: bool = False
    disabled_blocks: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, document: Any) -> FaultSettings:
        """Parse a ``PUT /sim/faults`` body; omitted settings are off."""
        if not isinstance(document, Mapping):
            raise FaultSettingsError("the fault settings must be a JSON object")
        unknown = sorted(set(document) - {f.name for f in fields(cls)})
        if unknown:
            raise FaultSettingsError(f"unknown fault settings: {unknown}")
        settings = cls(**{key: _checked(key, value) for key, value in document.items()})
        if not 0.0 <= settings.error_rate <= 1.0:
            raise FaultSettingsError("error_rate must be between 0 and 1")
        return settings

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["disabled_blocks"] = list(self.disabled_blocks)
        return document


def _checked(key: str, value: Any) -> Any:
    if key in ("task_failure", "drop_connections", "stale_etags"):
        if not isinstance(value, bool):
            raise FaultSettingsError(f"{key} must be true or false")
        return value
    if key == "disabled_blocks":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise FaultSettingsError("disabled_blocks must be a list of block ids")
        return tuple(value)
    if key == "fail_after_attachments" and value is None:
        return None
    number = _non_negative(key, value)
    if key in ("seed", "fail_after_attachments"):
        if not isinstance(number, int):
            raise FaultSettingsError(f"{key} must be an integer")
        return number
    return float(number)


def _non_negative(key: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise FaultSettingsError(f"{key} must be a non-negative number")
    return value


class FaultSwitch:
    """The faults in force now, with the counters and dice they need."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.replace(FaultSettings())

    def replace(self, settings: FaultSettings) -> None:
        """Switch to ``settings``; counters, dice and the unreachable window restart."""
        self.settings = settings
        self._since = self._clock()
        self._dice = random.Random(settings.seed)
        self._attachments = 0

    def drops_request(self) -> bool:
        """Close this request's connection without an answer?"""
        unreachable = self._clock() - self._since < self.settings.unreachable_for_s
        return self.settings.drop_connections or unreachable

    def write_fails(self) -> bool:
        """Answer this write with 503?"""
        rate = self.settings.error_rate
        return rate > 0 and self._dice.random() < rate

    def attachment_fails(self) -> bool:
        """Count one AddResourceBlock call; answer it with 500?"""
        self._attachments += 1
        limit = self.settings.fail_after_attachments
        return limit is not None and self._attachments > limit
