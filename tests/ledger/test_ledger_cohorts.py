"""Cohorts in the ledger, and session reservations checked in the claim's transaction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import date, time

import pytest

from composespawner.domain.cohorts import Cohort, Session
from composespawner.domain.quotas import QuotaRule
from composespawner.ledger import (
    Actor,
    KeepFree,
    Ledger,
    Machine,
    ReservedForCohort,
    ShareClaim,
)
from tests.ledger.test_ledger_claim import assert_unchanged_after_refusal
from tests.ledger.test_ledger_races import race, racers

ADMIN = Actor("admin", "192.0.2.1")
A100 = frozenset({"A100-80GB"})
COURSE = Cohort(
    "cs-101",
    title="Intro to deep learning",
    starts_on=date(2026, 9, 1),
    ends_on=date(2026, 12, 20),
    sessions=(Session(0, time(9), time(11)), Session(3, time(14), time(16))),
    stacks=frozenset({"pytorch"}),
    starter_kit="mnist",
    reserved_model="a100",
    reserved_gpus=4,
)


def keep(gpus: int = 4) -> KeepFree:
    return KeepFree("cs-101", A100, gpus, "NVIDIA A100", "11:00")


def claim(ledger: Ledger, user: str, blocks: list[str], **kwargs: object) -> Machine:
    machine_id = ledger.request_machine(user, f"s-{blocks[0]}", {})
    return ledger.claim(machine_id, host_id="h", zone="rack-1", block_ids=blocks, **kwargs)  # type: ignore[arg-type]


def test_a_cohort_is_stored_replaced_and_deleted_with_audit_entries(ledger: Ledger) -> None:
    ledger.policy.set_cohort(COURSE, ADMIN)
    assert ledger.policy.cohorts() == [COURSE]
    shorter = Cohort("cs-101", sessions=(Session(4, time(8), time(9)),))
    ledger.policy.set_cohort(shorter, ADMIN)
    assert ledger.policy.cohorts() == [shorter]
    assert ledger.policy.delete_cohort("cs-101", ADMIN)
    assert not ledger.policy.delete_cohort("cs-101", ADMIN)
    actions = [(e.action, e.target) for e in ledger.policy.audit_log()]
    assert actions == [
        ("cohort.delete", "cohort cs-101"),
        ("cohort.set", "cohort cs-101"),
        ("cohort.set", "cohort cs-101"),
    ]
    assert ledger.policy.audit_log()[2].detail["sessions"] == ["Mon 09:00-11:00", "Thu 14:00-16:00"]


def test_an_outsider_may_take_only_what_the_reservation_leaves(
    ledger: Ledger, gpus: list[str]
) -> None:
    ledger.policy.set_cohort(COURSE, ADMIN)
    # 8 free, 4 kept for the cohort: an outsider may take 4, not a fifth.
    claim(ledger, "zoe", gpus[:4], keep_free=[keep()])
    fifth = ledger.request_machine("zoe", "fifth", {})
    with pytest.raises(ReservedForCohort) as refused:
        ledger.claim(fifth, host_id="h", zone="rack-1", block_ids=gpus[4:5], keep_free=[keep()])
    assert refused.value.user_message == (
        "The free NVIDIA A100 GPUs are reserved for cohort cs-101's session until 11:00."
        " Choose another model, or start your server after the session."
    )
    assert_unchanged_after_refusal(ledger, fifth, gpus[4:5])
    # A member takes 2 under the reservation: 2 stay kept, and the 2 more free are fair game.
    member = claim(ledger, "amy", gpus[4:6], cohort="cs-101")
    assert member.cohort == "cs-101"
    assert ledger.machine(member.id).cohort == "cs-101"  # type: ignore[union-attr]
    with pytest.raises(ReservedForCohort):
        ledger.claim(fifth, host_id="h", zone="rack-1", block_ids=gpus[6:7], keep_free=[keep()])
    ledger.claim(fifth, host_id="h", zone="rack-1", block_ids=[], keep_free=[keep()])  # no GPUs


def test_co_located_gpus_do_not_count_as_free_for_a_reservation(
    ledger: Ledger, gpus: list[str], colocated: list[str]
) -> None:
    both = KeepFree("cs-101", A100 | {"H100"}, 8, "GPU", "11:00")
    ledger.policy.set_cohort(COURSE, ADMIN)
    with pytest.raises(ReservedForCohort) as refused:
        claim(ledger, "pia", colocated[:1], groups=frozenset({"physics"}), keep_free=[both])
    assert refused.value.free == 8  # the pool's A100s; the co-located H100s are physics'


def test_racing_outsiders_never_take_reserved_gpus(
    ledger: Ledger, gpus: list[str], open_ledger: Callable[[], Ledger]
) -> None:
    ledger.policy.set_cohort(COURSE, ADMIN)
    ledgers = racers(open_ledger, len(gpus))
    machines = [ledger.request_machine(f"u{i}", "", {}) for i in range(len(gpus))]

    def claimer(i: int) -> Callable[[], Machine]:
        return lambda: ledgers[i].claim(
            machines[i], host_id="h", zone="rack-1", block_ids=gpus[i : i + 1], keep_free=[keep()]
        )

    outcomes = race([claimer(i) for i in range(len(gpus))])
    assert Counter(type(o).__name__ for o in outcomes) == {"Machine": 4, "ReservedForCohort": 4}
    assert len(ledger.free_blocks() & set(gpus)) == 4


def test_members_shares_count_a_fraction_of_a_gpu_toward_the_reservation(
    ledger: Ledger, gpus: list[str]
) -> None:
    quarters = Cohort("cs-101", sessions=COURSE.sessions, reserved_model="a100", reserved_gpus=8)
    ledger.policy.set_cohort(Cohort(**{**quarters.__dict__, "reserved_share": 4}), ADMIN)
    assert ledger.policy.cohorts()[0].reserved_share == 4
    # Eight quarters keep 2 GPUs; five members hold a quarter each (1.25 GPUs, on 2 GPUs).
    for n, gpu in enumerate([gpus[0]] * 4 + [gpus[1]]):
        member = ledger.request_machine(f"m{n}", "", {})
        share = ShareClaim(gpu, 4, "h")
        ledger.claim(member, host_id="h", zone="rack-1", block_ids=[], share=share, cohort="cs-101")
    policy = ledger.policy.spawn_policy("zoe", [], QuotaRule("site", ""))
    assert policy.held == {("cs-101", "A100-80GB"): 1.25}
    # 6 free; the members' 3 quarters to come need 0.75 of a GPU: an outsider may take 5.
    claim(ledger, "zoe", gpus[2:7], keep_free=[keep(2)])
    last = ledger.request_machine("zoe", "last", {})
    with pytest.raises(ReservedForCohort):
        ledger.claim(last, host_id="h", zone="rack-1", block_ids=gpus[7:8], keep_free=[keep(2)])
