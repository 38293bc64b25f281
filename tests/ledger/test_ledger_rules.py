"""The pure rules: the lifecycle table and the quota decision (no database)."""

from __future__ import annotations

import itertools

import pytest

from composespawner.domain.quotas import Quota
from composespawner.ledger import (
    STATES,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    QuotaExceeded,
    ServerUse,
    can_transition,
    check_transition,
)
from composespawner.ledger.limits import Use, check_use

# The lifecycle as agreed (docs/architecture.md invariant 7), written out independently
# of the code so a change to the table has to change this test too.
EXPECTED = {
    "requested": {"claimed", "failed"},
    "claimed": {"composed", "stopping"},
    "composed": {"launching", "stopping"},
    "launching": {"running", "stopping"},
    "running": {"stopping"},
    "stopping": {"released", "failed"},
    "released": set(),
    "failed": set(),
}
LEGAL = sorted((a, b) for a, targets in EXPECTED.items() for b in targets)
ILLEGAL = sorted(set(itertools.product(EXPECTED, EXPECTED)) - set(LEGAL))


def test_table_is_the_agreed_lifecycle() -> None:
    assert {state: set(targets) for state, targets in TRANSITIONS.items()} == EXPECTED
    assert set(STATES) == set(EXPECTED)


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_legal_transition_passes(from_state: str, to_state: str) -> None:
    check_transition(from_state, to_state)
    assert can_transition(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_illegal_transition_is_refused(from_state: str, to_state: str) -> None:
    with pytest.raises(IllegalTransition) as refused:
        check_transition(from_state, to_state)
    assert (refused.value.from_state, refused.value.to_state) == (from_state, to_state)
    assert not can_transition(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), [("bogus", "claimed"), ("claimed", "bogus")])
def test_unknown_states_are_refused(from_state: str, to_state: str) -> None:
    with pytest.raises(IllegalTransition, match="unknown state 'bogus'"):
        check_transition(from_state, to_state)


def test_the_lifecycle_is_one_way_and_always_ends() -> None:
    def reachable(state: str) -> set[str]:
        seen: set[str] = set()
        todo = [state]
        while todo:
            for nxt in TRANSITIONS[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    for state in STATES:
        assert state not in reachable(state), f"{state} can come back to itself"
        assert state in TERMINAL or reachable(state) & TERMINAL, f"{state} can never end"


def test_a_holding_machine_ends_only_through_stopping() -> None:
    # Devices are decomposed in 'stopping'; skipping it would free attached hardware.
    for state in ("claimed", "composed", "launching", "running"):
        assert not TRANSITIONS[state] & TERMINAL
        assert "stopping" in TRANSITIONS[state]


def test_quota_message_names_servers_counts_and_source() -> None:
    in_use = Use([ServerUse("thesis", 2), ServerUse("", 1), ServerUse("idle", 0)])
    with pytest.raises(QuotaExceeded) as refused:
        check_use("alice", Quota.site_default(4), 2, in_use)
    assert refused.value.user_message == (
        "You asked for 2 GPUs but your limit is 4 GPUs at once (from the site default) and 3"
        " are in use (server 'thesis': 2, default server: 1). Stop a server or ask for fewer."
    )
    assert (refused.value.limit, refused.value.source) == ("gpus_held", "the site default")


@pytest.mark.parametrize(
    ("limit", "asked", "in_use", "message"),
    [
        (1, 1, [ServerUse("", 1)], "You asked for 1 GPU but your limit is 1 GPU at once (from"),
        (
            4,
            5,
            [],
            "You asked for 5 GPUs but your limit is 4 GPUs at once (from the site default).",
        ),
        (0, 1, [], "You asked for 1 GPU but you may not use GPUs (the site default allows 0)."),
    ],
)
def test_quota_message_reads_well_at_the_edges(
    limit: int, asked: int, in_use: list[ServerUse], message: str
) -> None:
    with pytest.raises(QuotaExceeded) as refused:
        check_use("bob", Quota.site_default(limit), asked, Use(in_use))
    assert refused.value.user_message.startswith(message)


@pytest.mark.parametrize(
    ("limit", "asked", "used"),
    [(None, 100, 100), (4, 2, 2), (4, 0, 9), (0, 0, 0), (1, 1, 0)],
)
def test_within_quota_passes(limit: int | None, asked: int, used: int) -> None:
    check_use("carol", Quota.site_default(limit), asked, Use([ServerUse("x", used)]))
    assert limit is None or asked == 0 or used + asked <= limit
