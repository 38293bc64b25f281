"""Quota rules in the ledger, their audit trail, and the limits the claim checks under its lock."""

from __future__ import annotations

import pytest

from composespawner.domain.quotas import QuotaRule, effective_quota
from composespawner.ledger import Actor, Ledger, QuotaExceeded
from tests.ledger.support import Clock
from tests.ledger.test_ledger_claim import assert_unchanged_after_refusal

ADMIN = Actor("admin", "203.0.113.9")


def test_rules_are_stored_replaced_and_deleted_with_an_audit_entry_each(ledger: Ledger) -> None:
    policy = ledger.policy
    policy.set_quota_rule(QuotaRule("cohort", "cs-101", gpus_held=1), ADMIN)
    policy.set_quota_rule(QuotaRule("cohort", "cs-101", models=frozenset({"t4", "v100"})), ADMIN)
    policy.set_quota_rule(QuotaRule("user", "alice", servers=1), ADMIN)
    assert policy.quota_rules() == [
        QuotaRule("cohort", "cs-101", models=frozenset({"t4", "v100"})),  # replaced, not merged
        QuotaRule("user", "alice", servers=1),
    ]
    assert policy.delete_quota_rule("user", "alice", ADMIN)
    assert not policy.delete_quota_rule("user", "alice", ADMIN)  # nothing left to delete
    entries = policy.audit_log()
    assert [(e.action, e.target) for e in entries] == [
        ("quota.delete", "quota user alice"),
        ("quota.set", "quota user alice"),
        ("quota.set", "quota cohort cs-101"),
        ("quota.set", "quota cohort cs-101"),
    ]
    assert {(e.actor, e.origin) for e in entries} == {("admin", "203.0.113.9")}
    assert entries[2].detail["models"] == ["t4", "v100"]
    assert [e.id for e in policy.audit_log(None, oldest_first=True)] == [
        e.id for e in reversed(entries)
    ]
    assert policy.audit_log(2) == entries[:2]


def test_a_user_reads_only_the_rules_that_apply_to_them(ledger: Ledger) -> None:
    for rule in (
        QuotaRule("site", gpus_held=2),
        QuotaRule("cohort", "cs-101", gpus_held=1),
        QuotaRule("cohort", "physics", gpus_held=6),
        QuotaRule("user", "alice", servers=1),
        QuotaRule("user", "bob", servers=9),
    ):
        ledger.policy.set_quota_rule(rule, ADMIN)
    mine = ledger.policy.quota_rules("alice", ["cs-101"])
    assert [(r.level, r.subject) for r in mine] == [
        ("cohort", "cs-101"),
        ("site", ""),
        ("user", "alice"),
    ]


def test_markup_in_a_subject_is_stored_as_text(ledger: Ledger) -> None:
    name = "<script>alert(1)</script>"
    ledger.policy.set_quota_rule(QuotaRule("cohort", name, gpus_held=1), ADMIN)
    assert ledger.policy.quota_rules()[0].subject == name


def test_servers_at_once_is_checked_in_the_claim(ledger: Ledger, gpus: list[str]) -> None:
    quota = effective_quota([QuotaRule("user", "alice", servers=2)], "alice", ())
    for server in ("a", "b"):
        machine_id = ledger.request_machine("alice", server, {})
        ledger.claim(machine_id, host_id="h", zone="rack-1", block_ids=[], quota=quota)
    third = ledger.request_machine("alice", "c", {})
    with pytest.raises(QuotaExceeded) as refused:
        ledger.claim(third, host_id="h", zone="rack-1", block_ids=gpus[:1], quota=quota)
    assert refused.value.limit == "servers"
    assert_unchanged_after_refusal(ledger, third, gpus[:1])


def test_gpu_hours_count_ended_and_running_machines_of_the_last_week(
    ledger: Ledger, gpus: list[str], clock: Clock
) -> None:
    quota = effective_quota([QuotaRule("site", gpu_hours_week=5.0)], "alice", ())
    ended = ledger.request_machine("alice", "old", {})
    ledger.claim(ended, host_id="h", zone="rack-1", block_ids=gpus[:2], quota=quota)
    clock.advance(hours=2)  # 2 GPUs for 2 hours: 4 GPU-hours
    ledger.transition(ended, "stopping", "stop")
    ledger.release(ended)
    running = ledger.request_machine("alice", "now", {})
    ledger.claim(running, host_id="h", zone="rack-1", block_ids=gpus[2:3], quota=quota)
    clock.advance(hours=1)  # 1 more GPU-hour, still running: 5 in all
    third = ledger.request_machine("alice", "more", {})
    with pytest.raises(QuotaExceeded) as refused:
        ledger.claim(third, host_id="h", zone="rack-1", block_ids=gpus[3:4], quota=quota)
    assert refused.value.user_message.startswith("You have used 5.0 GPU-hours in the last 7 days")
    assert_unchanged_after_refusal(ledger, third, gpus[3:4])

    ledger.transition(running, "stopping", "stop")
    ledger.release(running)
    clock.advance(days=7, hours=-1)  # the first machine's hours have left the window; 1 is left
    ledger.claim(third, host_id="h", zone="rack-1", block_ids=gpus[3:4], quota=quota)
