"""The lifecycle in the database: compare-and-set transitions and an append-only event log."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from composespawner.ledger import (
    STATES,
    TRANSITIONS,
    AppendOnlyViolation,
    IllegalTransition,
    Ledger,
    UnknownMachine,
)
from composespawner.ledger.models import MachineEventRow

from .support import PATHS, Clock, MachineMaker

LEGAL = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)


@pytest.mark.parametrize(("from_state", "to_state"), LEGAL)
def test_every_legal_transition_is_taken(
    ledger: Ledger, machine_in: MachineMaker, gpus: list[str], from_state: str, to_state: str
) -> None:
    machine_id = machine_in(from_state, blocks=gpus[:1])
    if to_state == "claimed":
        moved = ledger.claim(machine_id, host_id="host-1", zone="rack-1", block_ids=gpus[:1])
    else:
        moved = ledger.transition(machine_id, to_state, "next")
    assert moved.state == to_state
    assert ledger.machine(machine_id) == moved
    assert ledger.events(machine_id)[-1].to_state == to_state


@pytest.mark.parametrize("from_state", STATES)
def test_every_illegal_transition_is_refused_and_changes_nothing(
    ledger: Ledger, machine_in: MachineMaker, gpus: list[str], from_state: str
) -> None:
    machine_id = machine_in(from_state, blocks=gpus[:1])
    before = ledger.machine(machine_id)
    events = ledger.events(machine_id)
    for to_state in sorted(set(STATES) - TRANSITIONS[from_state] - {"claimed"}):
        with pytest.raises(IllegalTransition):
            ledger.transition(machine_id, to_state, "not allowed")
    if "claimed" not in TRANSITIONS[from_state]:
        with pytest.raises(IllegalTransition):
            ledger.claim(machine_id, host_id="h", zone="z", block_ids=[])
    assert ledger.machine(machine_id) == before
    assert ledger.events(machine_id) == events


def test_events_record_every_step_in_order(
    ledger: Ledger, clock: Clock, gpus: list[str], machine_in: MachineMaker
) -> None:
    machine_id = machine_in("running", blocks=gpus[:2])
    clock.advance(minutes=5)
    ledger.transition(machine_id, "stopping", "user stopped the server")
    ledger.release(machine_id)
    events = ledger.events(machine_id)
    steps = [(e.from_state, e.to_state) for e in events]
    path = ["requested", *PATHS["running"], "stopping", "released"]
    assert steps == list(zip([None, *path[:-1]], path, strict=True))
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert events[-2].message == "user stopped the server"
    assert events[-1].at == clock.now
    assert all(e.at.tzinfo is not None for e in events)


def test_failure_reason_is_kept_on_the_machine(ledger: Ledger, machine_in: MachineMaker) -> None:
    machine_id = machine_in("requested")
    failed = ledger.transition(machine_id, "failed", "no fit", failure="No host has 4 free GPUs.")
    assert failed.state == "failed"
    assert failed.failure == "No host has 4 free GPUs."
    assert failed.ended_at is not None


def test_advance_takes_several_steps_in_one_transaction(
    ledger: Ledger, gpus: list[str], machine_in: MachineMaker
) -> None:
    machine_id = machine_in("claimed", blocks=gpus[:2])
    moved = ledger.advance(
        machine_id, ("composed", "all devices attached"), ("launching", "starting notebook")
    )
    assert moved.state == "launching"
    assert moved.block_ids == tuple(sorted(gpus[:2]))
    assert ledger.machine(machine_id) == moved
    last_two = [(e.from_state, e.to_state, e.message) for e in ledger.events(machine_id)[-2:]]
    assert last_two == [
        ("claimed", "composed", "all devices attached"),
        ("composed", "launching", "starting notebook"),
    ]


def test_advance_is_all_or_nothing(ledger: Ledger, machine_in: MachineMaker) -> None:
    machine_id = machine_in("claimed")
    before, events = ledger.machine(machine_id), ledger.events(machine_id)
    with pytest.raises(IllegalTransition, match="composed may go to"):
        ledger.advance(machine_id, ("composed", "attached"), ("running", "skips launching"))
    assert ledger.machine(machine_id) == before
    assert ledger.events(machine_id) == events


@pytest.mark.parametrize("step", ["claimed", "released", "failed"])
def test_advance_refuses_claims_and_endings(
    ledger: Ledger, machine_in: MachineMaker, step: str
) -> None:
    machine_id = machine_in("requested")
    with pytest.raises(ValueError, match="non-terminal"):
        ledger.advance(machine_id, (step, "not through advance"))
    assert ledger.machine(machine_id).state == "requested"  # type: ignore[union-attr]


def test_only_claim_enters_claimed(ledger: Ledger, machine_in: MachineMaker) -> None:
    machine_id = machine_in("requested")
    with pytest.raises(ValueError, match="claim"):
        ledger.transition(machine_id, "claimed")
    assert ledger.machine(machine_id).state == "requested"  # type: ignore[union-attr]


def test_unknown_machine_is_refused(ledger: Ledger) -> None:
    with pytest.raises(UnknownMachine):
        ledger.transition("nope", "composed")
    assert ledger.machine("nope") is None


def test_a_stale_transition_loses_the_compare_and_set(
    ledger: Ledger, machine_in: MachineMaker
) -> None:
    machine_id = machine_in("running")
    ledger.transition(machine_id, "stopping")
    with pytest.raises(IllegalTransition):
        ledger.transition(machine_id, "stopping")  # someone else already moved it
    assert [e.to_state for e in ledger.events(machine_id)].count("stopping") == 1


def test_events_cannot_be_changed_through_the_orm(ledger: Ledger, machine_in: MachineMaker) -> None:
    machine_in("claimed")
    with Session(ledger.engine) as session:
        event = session.scalars(sa.select(MachineEventRow).limit(1)).one()
        event.message = "rewritten"
        with pytest.raises(AppendOnlyViolation):
            session.flush()
        session.rollback()
        session.delete(session.scalars(sa.select(MachineEventRow).limit(1)).one())
        with pytest.raises(AppendOnlyViolation):
            session.flush()
    assert "rewritten" not in {e.message for e in _all_events(ledger)}


@pytest.mark.parametrize(
    "statement",
    [
        sa.update(MachineEventRow).values(message="rewritten"),
        sa.delete(MachineEventRow),
        sa.update(MachineEventRow.__table__).values(message="rewritten"),  # type: ignore[arg-type]
    ],
)
def test_events_cannot_be_changed_by_bulk_statements(
    ledger: Ledger, machine_in: MachineMaker, statement: sa.Executable
) -> None:
    machine_in("claimed")
    count = len(_all_events(ledger))
    with pytest.raises(AppendOnlyViolation), Session(ledger.engine) as session:
        session.execute(statement)
    assert len(_all_events(ledger)) == count


@pytest.mark.parametrize(
    "sql", ["UPDATE machine_events SET message = 'rewritten'", "DELETE FROM machine_events"]
)
def test_events_cannot_be_changed_even_by_raw_sql(
    ledger: Ledger, machine_in: MachineMaker, sql: str
) -> None:
    machine_in("claimed")
    count = len(_all_events(ledger))
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), ledger.engine.begin() as c:
        c.exec_driver_sql(sql)
    assert len(_all_events(ledger)) == count
    assert "rewritten" not in {e.message for e in _all_events(ledger)}


def _all_events(ledger: Ledger) -> list[MachineEventRow]:
    with Session(ledger.engine) as session:
        return list(session.scalars(sa.select(MachineEventRow)))


def test_the_run_manifest_is_kept_with_the_step_into_running(
    ledger: Ledger, machine_in: MachineMaker
) -> None:
    machine_id = machine_in("launching")
    manifest = {"version": 1, "stack": {"id": "pytorch"}, "environment": {"A": "1"}}
    assert ledger.run_manifest(machine_id) is None
    ledger.transition(machine_id, "running", "notebook started", manifest=manifest)
    run = ledger.run_manifest(machine_id)
    assert run is not None
    assert (run.machine_id, run.manifest) == (machine_id, manifest)
    assert ledger.run_manifests(run.user_name) == [run]
    # It outlives the machine, and goes nowhere with a step that ends one.
    ledger.transition(machine_id, "stopping", "server stopped")
    with pytest.raises(ValueError, match="goes with a step into a live state"):
        ledger.transition(machine_id, "released", "released", manifest=manifest)
    ledger.transition(machine_id, "released", "released")
    assert ledger.run_manifest(machine_id) == run


def test_a_step_that_is_refused_keeps_no_manifest(ledger: Ledger, machine_in: MachineMaker) -> None:
    machine_id = machine_in("requested")
    with pytest.raises(IllegalTransition):
        ledger.transition(machine_id, "running", "skipping ahead", manifest={"version": 1})
    assert ledger.run_manifest(machine_id) is None
