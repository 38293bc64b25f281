"""Quotas as a hierarchy: the site default, then cohorts (JupyterHub groups), then the user.

Pure: rules in, the *effective* quota out, each limit with the rule it comes from,
so a refusal can say which limit stopped a spawn and whom to ask about it.

How levels combine, limit by limit:

* a user's own rule wins over everything else;
* otherwise the user's cohorts that set the limit decide, and the most generous
  of them wins (the larger number, the union of GPU models): joining a research
  group's cohort should never take away what a course already gave;
* otherwise the site default; a limit nobody sets is no limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, fields, replace
from typing import Generic, Literal, TypeVar

Level = Literal["site", "cohort", "user"]
LEVELS: tuple[Level, ...] = ("site", "cohort", "user")

T = TypeVar("T")

# Most GPUs or servers any limit may name: beyond this a number is a typing slip.
MOST_COUNTED = 10_000
MOST_GPU_HOURS = 1_000_000.0
# Most cores or GiB held at once any limit may name: about ten thousand large hosts.
MOST_CORES = 1_000_000
MOST_MEMORY_GIB = 10_000_000


class InvalidQuota(ValueError):
    """A quota rule that cannot be stored; the message says what to change."""


@dataclass(frozen=True)
class QuotaRule:
    """What one level says; ``None`` leaves a limit to the level below."""

    level: Level
    subject: str = ""  # '' for the site, the group's name for a cohort, the user's name
    gpus_held: int | None = None  # GPUs held at once, over all of the user's servers
    gpus_per_server: int | None = None
    models: frozenset[str] | None = None  # GPU models allowed (catalog names)
    gpu_hours_week: float | None = None  # GPU-hours over the last 7 days, running ones included
    servers: int | None = None  # servers running at once, with or without GPUs
    cores_held: int | None = None  # CPU cores of hosts held at once, over all servers
    memory_gib_held: int | None = None  # GiB of hosts' memory held at once, likewise

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise InvalidQuota(f"level must be one of {', '.join(LEVELS)}, not {self.level!r}")
        if (self.level == "site") != (not self.subject):
            raise InvalidQuota("the site default names no subject; a cohort or user rule must")
        for name in ("gpus_held", "gpus_per_server", "servers"):
            _check_number(name, getattr(self, name), MOST_COUNTED, integer=True)
        _check_number("gpu_hours_week", self.gpu_hours_week, MOST_GPU_HOURS, integer=False)
        _check_number("cores_held", self.cores_held, MOST_CORES, integer=True)
        _check_number("memory_gib_held", self.memory_gib_held, MOST_MEMORY_GIB, integer=True)

    @property
    def source(self) -> str:
        """Where a limit comes from, as a user reads it."""
        if self.level == "site":
            return "the site default"
        if self.level == "cohort":
            return f"cohort {self.subject}"
        return f"{self.subject}'s own quota"

    def applies_to(self, user: str, groups: Collection[str]) -> bool:
        if self.level == "site":
            return True
        return self.subject in groups if self.level == "cohort" else self.subject == user


@dataclass(frozen=True)
class Limit(Generic[T]):
    """One effective limit: its value (``None``: no limit) and the rule it comes from."""

    value: T | None = None
    source: str = "no rule"


@dataclass(frozen=True)
class Quota:
    """The limits that apply to one user, each with where it comes from."""

    gpus_held: Limit[int] = Limit()
    gpus_per_server: Limit[int] = Limit()
    models: Limit[frozenset[str]] = Limit()
    gpu_hours_week: Limit[float] = Limit()
    servers: Limit[int] = Limit()
    cores_held: Limit[int] = Limit()
    memory_gib_held: Limit[int] = Limit()

    @classmethod
    def site_default(cls, gpus_held: int | None) -> Quota:
        """Only a limit on GPUs held at once, from the site default (the config's knob)."""
        return effective_quota([QuotaRule("site", gpus_held=gpus_held)], "", ())

    def allows_model(self, model: str) -> bool:
        return self.models.value is None or model in self.models.value

    def as_dict(self) -> dict[str, dict[str, object]]:
        """For JSON: each limit's value (models sorted) and source."""
        return {
            name: {"value": _jsonable(limit.value), "source": limit.source}
            for name, limit in self.limits()
        }

    def limits(self) -> list[tuple[str, Limit[object]]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


NO_QUOTA = Quota()
LIMIT_NAMES = tuple(f.name for f in fields(Quota))


def effective_quota(rules: Iterable[QuotaRule], user: str, groups: Collection[str]) -> Quota:
    """The quota of ``user`` in ``groups`` under ``rules`` (see the module's docstring)."""
    applying = [rule for rule in rules if rule.applies_to(user, groups)]
    return Quota(
        gpus_held=_choose(applying, "gpus_held", max),
        gpus_per_server=_choose(applying, "gpus_per_server", max),
        models=_choose(applying, "models", _union),
        gpu_hours_week=_choose(applying, "gpu_hours_week", max),
        servers=_choose(applying, "servers", max),
        cores_held=_choose(applying, "cores_held", max),
        memory_gib_held=_choose(applying, "memory_gib_held", max),
    )


def under_site_default(rules: Iterable[QuotaRule], default: QuotaRule) -> list[QuotaRule]:
    """``rules`` with their site rule laid over ``default`` (the config's): its set limits win."""
    rules = list(rules)
    site = next((rule for rule in rules if rule.level == "site"), None)
    if site is not None:
        overrides = {
            name: getattr(site, name) for name in LIMIT_NAMES if getattr(site, name) is not None
        }
        default = replace(default, **overrides)
    return [default, *(rule for rule in rules if rule.level != "site")]


def _union(values: Iterable[frozenset[str]]) -> frozenset[str]:
    return frozenset[str]().union(*values)


def _choose(rules: list[QuotaRule], name: str, most_generous: Callable[[list[T]], T]) -> Limit[T]:
    """The limit ``name`` from the highest level that sets it (see the module's docstring)."""
    for level in ("user", "cohort", "site"):
        setting = sorted(
            (rule for rule in rules if rule.level == level and getattr(rule, name) is not None),
            key=lambda rule: rule.subject,
        )
        if setting:
            value = most_generous([getattr(rule, name) for rule in setting])
            # Every rule that set the limit gave it when none added to it: all
            # of them allowing no GPU model at all is a choice, and theirs.
            givers = [rule for rule in setting if _gives(getattr(rule, name), value)] or setting
            return Limit(value, _sources(givers))
    return Limit()


def _gives(value: object, chosen: object) -> bool:
    """Whether a rule's value is (part of) the chosen one, so its rule is named as a source."""
    if isinstance(value, frozenset) and isinstance(chosen, frozenset):
        return bool(value) and value <= chosen
    return value == chosen


def _sources(rules: list[QuotaRule]) -> str:
    if len(rules) > 1 and all(rule.level == "cohort" for rule in rules):
        return "cohorts " + ", ".join(rule.subject for rule in rules)
    return rules[0].source


def _check_number(name: str, value: float | None, most: float, *, integer: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidQuota(f"{name} must be a number, not {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise InvalidQuota(f"{name} must be a whole number, not {value}")
    if not math.isfinite(value) or not 0 <= value <= most:
        raise InvalidQuota(f"{name} must be from 0 to {most:g}, not {value}")


def _jsonable(value: object) -> object:
    return sorted(value) if isinstance(value, frozenset) else value


NO_SITE_QUOTA = QuotaRule("site")  # after _check_number, which it calls
