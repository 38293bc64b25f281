"""Quotas on cores and memory held at once, and cohorts' sizes, in the ledger; on SQLite
and PostgreSQL. The share limits are checked in the claim's transaction, under the
user's lock, like GPUs held (invariant 3)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from composespawner.domain.cohorts import Cohort
from composespawner.domain.quotas import Quota, QuotaRule, effective_quota
from composespawner.domain.rooms import Room
from composespawner.ledger import Actor, HostRecord, Ledger, Machine, QuotaExceeded, RoomClaim
from composespawner.ledger.records import ServerUse
from tests.ledger.test_ledger_claim import assert_unchanged_after_refusal
from tests.ledger.test_ledger_races import RACERS, race, racers

ADMIN = Actor("admin", "198.51.100.7")
BIG = Room(cores=64, memory_gib=512, slots=16)
COURSE = QuotaRule("cohort", "cs-101", cores_held=16, memory_gib_held=64)


def room(cores: int, memory: int, host: str = "host-1") -> RoomClaim:
    return RoomClaim(HostRecord(host, f"{host}-block", BIG), cores, memory)


def quota_of(ledger: Ledger, user: str = "bob") -> Quota:
    return effective_quota(ledger.policy.quota_rules(user, {"cs-101"}), user, {"cs-101"})


def claim(
    ledger: Ledger,
    server: str,
    share: RoomClaim | None,
    blocks: Sequence[str] = (),
) -> Machine:
    machine_id = ledger.request_machine("bob", server, {})
    return ledger.claim(
        machine_id,
        host_id=share.host.host_id if share else "host-9",
        zone="rack-1",
        block_ids=blocks,
        quota=quota_of(ledger),
        room=share,
    )


def test_share_limits_and_cohort_sizes_are_stored_and_read_back(ledger: Ledger) -> None:
    ledger.policy.set_quota_rule(COURSE, ADMIN)
    ledger.policy.set_quota_rule(QuotaRule("user", "bob", memory_gib_held=128), ADMIN)
    assert ledger.policy.quota_rules() == [COURSE, QuotaRule("user", "bob", memory_gib_held=128)]
    assert ledger.policy.audit_log()[1].detail["cores_held"] == 16
    quota = quota_of(ledger)
    assert (quota.cores_held.value, quota.cores_held.source) == (16, "cohort cs-101")
    assert (quota.memory_gib_held.value, quota.memory_gib_held.source) == (128, "bob's own quota")

    course = Cohort("cs-101", sizes=frozenset({"small", "medium"}))
    ledger.policy.set_cohort(course, ADMIN)
    ledger.policy.set_cohort(Cohort("research"), ADMIN)
    assert ledger.policy.cohorts() == [course, Cohort("research", sizes=None)]
    assert ledger.policy.audit_log()[0].detail["sizes"] is None
    assert ledger.policy.audit_log()[1].detail["sizes"] == ["medium", "small"]
    assert ledger.policy.spawn_policy("bob", {"cs-101"}, QuotaRule("site")).cohorts == [course]


def test_a_claim_past_cores_held_is_refused_saying_what_to_change(
    ledger: Ledger, gpus: list[str]
) -> None:
    ledger.policy.set_quota_rule(COURSE, ADMIN)
    claim(ledger, "a", room(8, 32), [gpus[0]])
    claim(ledger, "b", room(4, 16, host="host-2"))
    assert ledger.gpu_use("bob") == [ServerUse("a", 1, 8, 32), ServerUse("b", 0, 4, 16)]
    machine_id = ledger.request_machine("bob", "c", {})
    with pytest.raises(QuotaExceeded) as refused:
        ledger.claim(
            machine_id,
            host_id="host-1",
            zone="rack-1",
            block_ids=[gpus[1]],
            quota=quota_of(ledger),
            room=room(8, 8),
        )
    assert refused.value.limit == "cores_held"
    assert refused.value.user_message == (
        "You hold 12 cores of 16 that cohort cs-101 allows; the 8 cores, 8 GiB size needs 8:"
        " choose a smaller size or stop a server."
    )
    assert_unchanged_after_refusal(ledger, machine_id, [gpus[1]])
    assert ledger.holds()[1]["host-1"].cores == 8  # the refused claim took no room either
    fits = room(4, 16)  # what is left: 16 cores, 64 GiB exactly
    ledger.claim(
        machine_id, host_id="host-1", zone="rack-1", block_ids=[], quota=quota_of(ledger), room=fits
    )


def test_memory_held_counts_and_ended_machines_give_their_share_back(ledger: Ledger) -> None:
    ledger.policy.set_quota_rule(COURSE, ADMIN)
    first = claim(ledger, "a", room(2, 48))
    machine_id = ledger.request_machine("bob", "b", {})
    again = {"host_id": "host-1", "zone": "rack-1", "block_ids": [], "room": room(2, 32)}
    with pytest.raises(QuotaExceeded, match="You hold 48 GiB of 64 GiB that cohort cs-101"):
        ledger.claim(machine_id, quota=quota_of(ledger), **again)  # type: ignore[arg-type]
    ledger.transition(first.id, "stopping", "server stopped")
    ledger.release(first.id)
    # The ended machine's memory no longer counts.
    ledger.claim(machine_id, quota=quota_of(ledger), **again)  # type: ignore[arg-type]


def test_a_machine_holding_a_whole_unshared_host_counts_no_share(
    ledger: Ledger, gpus: list[str]
) -> None:
    # It records no cores or memory (None), and holds its host's block instead.
    ledger.policy.set_quota_rule(QuotaRule("user", "bob", cores_held=4), ADMIN)
    whole = claim(ledger, "a", None, [gpus[0]])
    assert whole.cores is None
    assert ledger.gpu_use("bob") == [ServerUse("a", 1, 0, 0)]
    claim(ledger, "b", room(4, 8))


def test_one_user_racing_sized_servers_stays_within_cores_held(
    ledger: Ledger, open_ledger: Callable[[], Ledger]
) -> None:
    ledger.policy.set_quota_rule(COURSE, ADMIN)
    quota = quota_of(ledger)
    ledgers = racers(open_ledger)
    machines = [ledger.request_machine("bob", f"server{i}", {}) for i in range(RACERS)]

    def claimer(i: int) -> Callable[[], Machine]:
        def _claim() -> Machine:
            return ledgers[i].claim(
                machines[i],
                host_id="host-1",
                zone="rack-1",
                block_ids=[],
                quota=quota,
                room=room(6, 8),
            )

        return _claim

    outcomes = race([claimer(i) for i in range(RACERS)])
    # 16 cores allow two servers of 6 at once, never three.
    assert Counter(type(o).__name__ for o in outcomes) == {
        "Machine": 2,
        "QuotaExceeded": RACERS - 2,
    }
    assert sum(use.cores for use in ledger.gpu_use("bob")) == 12
    assert ledger.holds()[1]["host-1"].cores == 12
