"""Cohorts, pure: sessions, which reservations are in force, and what outsiders leave."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

import pytest

from composespawner.domain.cohorts import (
    Cohort,
    InvalidCohort,
    Reservation,
    Session,
    SizeChoice,
    StackChoice,
    active_reservations,
    holdback,
    next_session_start,
    size_choice,
    stack_choice,
)

MON_0930 = datetime(2026, 11, 23, 9, 30, tzinfo=UTC)  # a Monday
COURSE = Cohort(
    "cs-101",
    starts_on=date(2026, 9, 1),
    ends_on=date(2026, 12, 20),
    sessions=(Session.parse("Mon 09:00-11:00"), Session.parse("thu 14:00 - 16:00")),
    reserved_model="t4",
    reserved_gpus=4,
)


def test_sessions_read_and_print_as_people_write_them() -> None:
    assert COURSE.sessions == (Session(0, time(9), time(11)), Session(3, time(14), time(16)))
    assert [str(s) for s in COURSE.sessions] == ["Mon 09:00-11:00", "Thu 14:00-16:00"]
    whole_day = Session.parse("Sun 00:00-24:00")
    assert str(whole_day) == "Sun 00:00-24:00"
    assert whole_day.covers(datetime(2026, 11, 29, 23, 59, 59, tzinfo=UTC))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Monday 9-11", "write a session as 'Mon 09:00-11:00'"),
        ("Mon 11:00-09:00", "a session ends after it starts"),
        ("Mon 25:00-26:00", "is not a time of day"),
        ("Xyz 09:00-10:00", "write a session as"),
    ],
)
def test_a_bad_session_says_how_to_write_one(text: str, message: str) -> None:
    with pytest.raises(InvalidCohort, match=message):
        Session.parse(text)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": ""}, "name the cohort's hub group"),
        ({"name": "a\tb"}, "name the cohort's hub group"),
        ({"starts_on": date(2027, 1, 1)}, "the cohort ends before it starts"),
        ({"reserved_gpus": -1}, "reserved_gpus must be a whole number from 0"),
        ({"reserved_gpus": True}, "reserved_gpus must be a whole number"),
        ({"reserved_model": None}, "a reservation names both a GPU model and a number"),
        ({"reserved_gpus": 0}, "a reservation names both"),
        ({"reserved_share": 0}, "reserved_share must be a whole number from 1"),
        ({"reserved_share": 17}, "reserved_share must be a whole number from 1"),
        ({"reserved_share": 4.0}, "reserved_share must be a whole number from 1"),
        ({"reserved_share": 4, "reserved_model": None, "reserved_gpus": 0}, "is for a reservation"),
    ],
)
def test_a_cohort_that_cannot_be_stored_says_why(changes: dict[str, Any], message: str) -> None:
    fields = {**COURSE.__dict__, **changes}
    with pytest.raises(InvalidCohort, match=message):
        Cohort(**fields)


def test_a_reservation_is_in_force_during_a_session_of_a_running_cohort_only() -> None:
    [now] = active_reservations([COURSE], MON_0930)
    assert now == Reservation("cs-101", "t4", 4, datetime(2026, 11, 23, 11, 0, tzinfo=UTC))
    assert active_reservations([COURSE], MON_0930.replace(hour=11)) == []  # ended at 11:00
    assert active_reservations([COURSE], MON_0930.replace(day=24)) == []  # a Tuesday
    after_term = datetime(2027, 1, 4, 9, 30, tzinfo=UTC)  # a Monday after ends_on
    assert active_reservations([COURSE], after_term) == []
    no_reservation = Cohort("lab", sessions=COURSE.sessions)
    assert active_reservations([no_reservation], MON_0930) == []


def test_outsiders_leave_what_members_do_not_yet_hold() -> None:
    [r] = active_reservations([COURSE], MON_0930)
    assert holdback([r], ["vision-lab"], {}) == {"t4": 4}
    assert holdback([r], ["vision-lab"], {("cs-101", "t4"): 3}) == {"t4": 1}
    assert holdback([r], ["vision-lab"], {("cs-101", "t4"): 9}) == {}
    assert holdback([r], ["cs-101"], {}) == {}  # members are not held back


def test_the_next_session_start_is_found_within_the_week() -> None:
    assert next_session_start(COURSE, MON_0930) == datetime(2026, 11, 26, 14, 0, tzinfo=UTC)
    assert next_session_start(COURSE, MON_0930.replace(hour=8)) == MON_0930.replace(
        hour=9, minute=0
    )
    assert next_session_start(Cohort("none"), MON_0930) is None


def test_the_most_generous_of_a_users_running_cohorts_decides_their_stacks() -> None:
    day = date(2026, 11, 24)
    course = Cohort("cs-101", stacks=frozenset({"pytorch"}), starter_kit="digits")
    lab = Cohort("eeg-lab", stacks=frozenset({"tensorflow"}), starter_kit="eeg-seizures")
    anything = Cohort("research", stacks=None)
    finished = Cohort("old-course", stacks=frozenset({"jax"}), ends_on=date(2026, 6, 30))
    assert stack_choice([], day) == StackChoice()
    assert stack_choice([course], day) == StackChoice(frozenset({"pytorch"}), "digits", ("cs-101",))
    both = stack_choice([lab, course], day)
    assert both.stacks == {"pytorch", "tensorflow"}
    assert both.starter_kit == "digits"  # the first cohort by name that has one
    assert stack_choice([course, anything], day).stacks is None
    assert stack_choice([finished], day) == StackChoice()
    assert stack_choice([finished, course], day).stacks == {"pytorch"}


def test_the_most_generous_of_a_users_running_cohorts_decides_their_sizes() -> None:
    day = date(2026, 11, 24)
    course = Cohort("cs-101", sizes=frozenset({"small", "medium"}))
    lab = Cohort("eeg-lab", sizes=frozenset({"large"}))
    anything = Cohort("research")
    finished = Cohort("old-course", sizes=frozenset({"small"}), ends_on=date(2026, 6, 30))
    assert size_choice([], day) == SizeChoice()
    assert size_choice([course], day) == SizeChoice(frozenset({"small", "medium"}), ("cs-101",))
    assert size_choice([lab, course], day) == SizeChoice(
        frozenset({"small", "medium", "large"}), ("cs-101", "eeg-lab")
    )
    assert size_choice([course, anything], day).sizes is None  # one that allows any wins
    assert size_choice([finished], day) == SizeChoice()
    assert size_choice([finished, lab], day).sizes == {"large"}
    assert size_choice([course], day).allows("small")
    assert not size_choice([course], day).allows("whole")
    assert SizeChoice().allows("whole")


def test_a_reservation_in_quarters_keeps_whole_gpus_and_counts_members_shares() -> None:
    quarters = Cohort(**{**COURSE.__dict__, "reserved_gpus": 48, "reserved_share": 4})
    [r] = active_reservations([quarters], MON_0930)
    assert (r.gpus, r.shares, r.share) == (12, 48, 4)  # 48 quarters fill 12 T4s
    assert holdback([r], ["vision-lab"], {}) == {"t4": 12}
    # Five members each hold a quarter: 1.25 GPUs; 43 quarters to come still need 11 GPUs.
    assert holdback([r], ["vision-lab"], {("cs-101", "t4"): 1.25}) == {"t4": 11}
    assert holdback([r], ["vision-lab"], {("cs-101", "t4"): 12.0}) == {}
    odd = Cohort(**{**COURSE.__dict__, "reserved_gpus": 5, "reserved_share": 2})
    assert odd.reserved_whole == 3  # five halves need three GPUs
