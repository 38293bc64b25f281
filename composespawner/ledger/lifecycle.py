"""The machine lifecycle: a one-way transition table (invariant 7). Pure.

    requested ─▶ claimed ─▶ composed ─▶ launching ─▶ running
        │           └───────────┴───────────┴───────────┴──▶ stopping ─▶ released
        └──────────────────────────────────────────────────▶ failed ◀──┘

A machine holds devices from ``claimed`` until it leaves ``stopping``; every
way out of a holding state goes through ``stopping``, where the fabric is
decomposed, so a machine can only end after its hardware was given back.
``requested`` holds nothing yet, so it may fail directly (no fit, quota,
cancelled). Both terminal states mean: holds nothing.
"""

from __future__ import annotations

from typing import Final, Literal

from composespawner.ledger.errors import IllegalTransition

MachineState = Literal[
    "requested", "claimed", "composed", "launching", "running", "stopping", "released", "failed"
]

REQUESTED: Final = "requested"
CLAIMED: Final = "claimed"
COMPOSED: Final = "composed"
LAUNCHING: Final = "launching"
RUNNING: Final = "running"
STOPPING: Final = "stopping"
RELEASED: Final = "released"
FAILED: Final = "failed"

TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    REQUESTED: frozenset({CLAIMED, FAILED}),
    CLAIMED: frozenset({COMPOSED, STOPPING}),
    COMPOSED: frozenset({LAUNCHING, STOPPING}),
    LAUNCHING: frozenset({RUNNING, STOPPING}),
    RUNNING: frozenset({STOPPING}),
    STOPPING: frozenset({RELEASED, FAILED}),
    RELEASED: frozenset(),
    FAILED: frozenset(),
}

STATES: Final[tuple[str, ...]] = tuple(TRANSITIONS)
TERMINAL: Final[frozenset[str]] = frozenset({RELEASED, FAILED})
LIVE: Final[frozenset[str]] = frozenset(STATES) - TERMINAL
# States in which a machine may hold devices.
HOLDING: Final[frozenset[str]] = frozenset({CLAIMED, COMPOSED, LAUNCHING, RUNNING, STOPPING})


def is_terminal(state: str) -> bool:
    return state in TERMINAL


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def check_transition(from_state: str, to_state: str) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``from_state -> to_state``."""
    if from_state not in TRANSITIONS:
        raise IllegalTransition(from_state, to_state, f"unknown state {from_state!r}")
    if to_state not in TRANSITIONS:
        raise IllegalTransition(from_state, to_state, f"unknown state {to_state!r}")
    if not can_transition(from_state, to_state):
        allowed = ", ".join(sorted(TRANSITIONS[from_state])) or "nothing (terminal)"
        raise IllegalTransition(from_state, to_state, f"{from_state} may go to {allowed}")
