"""Cohorts (courses and research-training groups) and the GPUs their sessions reserve. Pure.

A cohort is a JupyterHub group with dates, weekly session times, the stacks,
sizes and starter kit it uses, and optionally a reservation: N GPUs of one model that,
during its sessions, nobody outside the cohort can take. A reservation may be in
shares ("48 quarter-T4s": ``reserved_gpus`` 48, ``reserved_share`` 4); it keeps
whole GPUs free, as many as its shares fill (48 quarters: 12 GPUs), and a member's
share counts 1/n of a GPU toward what the cohort holds.

What a reservation does to GPUs already held when a session starts: nothing.
Nobody is evicted. From the session's start, people outside the cohort may take
a reserved model's GPUs only while more than the reservation's unused part stays
free (the part not already held by members during the session), so as
outsiders' servers stop, their GPUs go to the cohort. The portal shows how many
of a reservation are free, held by members, and still held by others.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from composespawner.domain.quotas import MOST_COUNTED, InvalidQuota

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_SESSION = re.compile(r"^\s*(\w{3})\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
MOST_SESSIONS = 50
MOST_SHARE = 16  # the largest share size a catalog may offer
END_OF_DAY = time.max


class InvalidCohort(InvalidQuota):
    """A cohort that cannot be stored; the message says what to change."""


@dataclass(frozen=True, order=True)
class Session:
    """One weekly session, in the site's time zone: ``Mon 09:00-11:00``."""

    weekday: int  # 0 is Monday
    start: time
    end: time

    def __post_init__(self) -> None:
        if not 0 <= self.weekday <= 6:
            raise InvalidCohort(f"weekday must be 0 (Monday) to 6, not {self.weekday}")
        if self.end <= self.start:
            raise InvalidCohort(f"a session ends after it starts: {self}")

    @classmethod
    def parse(cls, text: str) -> Session:
        match = _SESSION.match(text)
        if match is None or match.group(1).title() not in WEEKDAYS:
            raise InvalidCohort(f"write a session as 'Mon 09:00-11:00', not {text!r}")
        day, h1, m1, h2, m2 = match.groups()
        try:
            start = time(int(h1), int(m1))
            # "24:00" ends a session at midnight: a whole day is 00:00-24:00.
            end = END_OF_DAY if (h2, m2) == ("24", "00") else time(int(h2), int(m2))
        except ValueError:
            raise InvalidCohort(f"{text!r} is not a time of day") from None
        return cls(WEEKDAYS.index(day.title()), start, end)

    def __str__(self) -> str:
        end = "24:00" if self.end == END_OF_DAY else f"{self.end:%H:%M}"
        return f"{WEEKDAYS[self.weekday]} {self.start:%H:%M}-{end}"

    def covers(self, at: datetime) -> bool:
        return at.weekday() == self.weekday and self.start <= at.time() < self.end


@dataclass(frozen=True)
class Cohort:
    name: str  # the JupyterHub group
    title: str = ""
    starts_on: date | None = None
    ends_on: date | None = None
    sessions: tuple[Session, ...] = ()
    stacks: frozenset[str] | None = None  # stack ids its members may use (None: any)
    sizes: frozenset[str] | None = None  # catalog size ids its members may use (None: any)
    starter_kit: str | None = None  # the kit a member's form starts with
    reserved_model: str | None = None  # catalog GPU model id
    reserved_gpus: int = 0  # in shares of reserved_share (whole GPUs when it is 1)
    reserved_share: int = 1  # 4: the reservation is of quarters of a GPU

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 255 or not self.name.isprintable():
            raise InvalidCohort("name the cohort's hub group: 1 to 255 printable characters")
        if self.starts_on and self.ends_on and self.ends_on < self.starts_on:
            raise InvalidCohort("the cohort ends before it starts")
        if len(self.sessions) > MOST_SESSIONS:
            raise InvalidCohort(f"at most {MOST_SESSIONS} weekly sessions")
        gpus = self.reserved_gpus
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MOST_COUNTED:
            raise InvalidCohort(f"reserved_gpus must be a whole number from 0 to {MOST_COUNTED}")
        if (self.reserved_model is None) != (gpus == 0):
            raise InvalidCohort("a reservation names both a GPU model and a number of GPUs")
        share = self.reserved_share
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= MOST_SHARE:
            raise InvalidCohort(
                f"reserved_share must be a whole number from 1 (whole GPUs) to {MOST_SHARE}"
                " (a 1/16 share), such as 4 for quarters"
            )
        if share > 1 and gpus == 0:
            raise InvalidCohort("reserved_share is for a reservation: leave it out, or send 1")

    @property
    def reserved_whole(self) -> int:
        """The whole GPUs the reservation keeps free: as many as its shares fill."""
        return math.ceil(self.reserved_gpus / self.reserved_share)

    def runs_on(self, day: date) -> bool:
        return (self.starts_on is None or self.starts_on <= day) and (
            self.ends_on is None or day <= self.ends_on
        )

    def session_at(self, at: datetime) -> Session | None:
        """The session under way at ``at`` (site-local time), if the cohort runs that day."""
        if not self.runs_on(at.date()):
            return None
        return next((s for s in self.sessions if s.covers(at)), None)


@dataclass(frozen=True)
class Reservation:
    """GPUs of one model a cohort's session keeps for its members, now."""

    cohort: str
    model: str  # catalog GPU model id
    gpus: int  # whole GPUs kept free (a reservation of 48 quarters keeps 12)
    until: datetime  # the session's end, site-local
    shares: int = 0  # what the cohort reserved, in shares of ``share`` (0: ``gpus`` whole)
    share: int = 1


def active_reservations(cohorts: Iterable[Cohort], at: datetime) -> list[Reservation]:
    """The reservations in force at ``at`` (site-local time)."""
    active = []
    for cohort in cohorts:
        session = cohort.session_at(at) if cohort.reserved_model else None
        if session is not None and cohort.reserved_model is not None:
            until = datetime.combine(at.date(), session.end, at.tzinfo)
            active.append(
                Reservation(
                    cohort.name,
                    cohort.reserved_model,
                    cohort.reserved_whole,
                    until,
                    cohort.reserved_gpus if cohort.reserved_share > 1 else 0,
                    cohort.reserved_share,
                )
            )
    return active


def holdback(
    reservations: Iterable[Reservation],
    groups: Iterable[str],
    held_by_cohort: Mapping[tuple[str, str], float],
) -> dict[str, int]:
    """GPUs per catalog model that this user (in ``groups``) must leave free right now.

    ``held_by_cohort``: (cohort, model) → GPUs its members hold under the reservation,
    a share of 1/n counting 1/n. Members of a cohort are not held back by its own
    reservation. What is left unused is kept in whole GPUs (2.25 left: 3 GPUs).
    """
    mine = set(groups)
    kept: dict[str, int] = {}
    for r in reservations:
        if r.cohort in mine:
            continue
        unused = max(r.gpus - held_by_cohort.get((r.cohort, r.model), 0), 0)
        kept[r.model] = kept.get(r.model, 0) + math.ceil(unused)
    return {model: n for model, n in kept.items() if n}


@dataclass(frozen=True)
class StackChoice:
    """The stacks and starter kit a user's cohorts give them today."""

    stacks: frozenset[str] | None = None  # the stack ids they may use (None: any)
    starter_kit: str | None = None  # what their form starts with
    restricted_by: tuple[str, ...] = ()  # the cohorts that restrict the stacks


def stack_choice(cohorts: Iterable[Cohort], day: date) -> StackChoice:
    """What the user's cohorts that run on ``day`` allow: the most generous of them.

    A cohort that names no stacks allows any, so a member of a course that uses
    one stack and of a research group that uses any may use any. The starter kit
    is that of the first such cohort (by name) that has one.
    """
    running = sorted((c for c in cohorts if c.runs_on(day)), key=lambda c: c.name)
    kit = next((c.starter_kit for c in running if c.starter_kit), None)
    restricting = [c for c in running if c.stacks is not None]
    if not running or len(restricting) < len(running):
        return StackChoice(None, kit)
    allowed = frozenset().union(*(c.stacks or () for c in restricting))
    return StackChoice(allowed, kit, tuple(c.name for c in restricting))


@dataclass(frozen=True)
class SizeChoice:
    """The sizes (cores and memory of a host) a user's cohorts give them today."""

    sizes: frozenset[str] | None = None  # the size ids they may use (None: any)
    restricted_by: tuple[str, ...] = ()  # the cohorts that restrict them

    def allows(self, size_id: str) -> bool:
        return self.sizes is None or size_id in self.sizes


def size_choice(cohorts: Iterable[Cohort], day: date) -> SizeChoice:
    """What the user's cohorts that run on ``day`` allow: the most generous of them,
    as for stacks (a cohort that names no sizes allows any)."""
    running = sorted((c for c in cohorts if c.runs_on(day)), key=lambda c: c.name)
    restricting = [c for c in running if c.sizes is not None]
    if not running or len(restricting) < len(running):
        return SizeChoice()
    allowed = frozenset[str]().union(*(c.sizes or () for c in restricting))
    return SizeChoice(allowed, tuple(c.name for c in restricting))


def next_session_start(cohort: Cohort, after: datetime) -> datetime | None:
    """When the cohort's next session starts after ``after`` (site-local), within a week."""
    for days in range(8):
        day = (after + timedelta(days=days)).date()
        if not cohort.runs_on(day):
            continue
        starts = sorted(
            datetime.combine(day, s.start, after.tzinfo)
            for s in cohort.sessions
            if s.weekday == day.weekday()
        )
        upcoming = [start for start in starts if start > after]
        if upcoming:
            return upcoming[0]
    return None
