"""Machines along the lifecycle: requested, moved step by step, ended.

One-way lifecycle (invariant 7): every move is a compare-and-set on the state
plus an event in the same transaction (:func:`composespawner.ledger.steps.move_through`);
an ending frees the machine's devices and writes their usage records in that
transaction too (:func:`composespawner.ledger.steps.end_machine`), so terminal always
means holds nothing. Taking devices is :mod:`composespawner.ledger.claims`' work:
only a claim enters ``claimed``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from composespawner.ledger.database import ZonedLedgerPart
from composespawner.ledger.errors import IllegalTransition, ServerBusy
from composespawner.ledger.lifecycle import CLAIMED, REQUESTED, TERMINAL
from composespawner.ledger.records import Machine
from composespawner.ledger.shares import shares_held
from composespawner.ledger.statements import INSERT_EVENT, MACHINES, RUN_MANIFESTS
from composespawner.ledger.steps import (
    end_machine,
    event,
    failure_values,
    held_by,
    machine_record,
    machine_row,
    move_through,
    moved,
    new_machine,
    read_live_machine,
    read_machine,
    with_shares,
)

_INSERT_MACHINE = insert(MACHINES)
_INSERT_RUN_MANIFEST = insert(RUN_MANIFESTS)


class Machines(ZonedLedgerPart):
    """A machine's way from request to its end (``Ledger.request_machine`` and the rest)."""

    def request_machine(self, user: str, server: str, request: dict[str, Any]) -> str:
        """Record a new machine for ``user``'s ``server`` in state ``requested``; its id.

        Raises :class:`ServerBusy` if that server already has a live machine.
        """
        json.dumps(request)  # refuse what cannot be stored before touching the database
        now = self._now()
        machine_id = uuid.uuid4().hex
        try:
            with self._write() as connection:
                connection.execute(
                    _INSERT_MACHINE, new_machine(machine_id, user, server, request, now)
                )
                connection.execute(
                    INSERT_EVENT, event(machine_id, now, None, REQUESTED, "requested")
                )
        except IntegrityError as err:
            # The unique index on live (user, server): that server has a live machine
            # (ours from an earlier start, or a concurrent request's).
            with self._engine.begin() as connection:
                live_machine = read_live_machine(connection, user, server)
            if live_machine is None:
                raise
            raise ServerBusy(user, server, live_machine.id, live_machine.state) from err
        return machine_id

    def end(self, machine_id: str, to: str, message: str, failure: str | None) -> Machine:
        """End a machine now (``to`` is ``released`` or ``failed``), from whatever live
        state it is in that may end so (``Ledger.transition`` into a terminal state)."""
        now = self._now()
        with self._write() as connection:
            machine = machine_row(connection, machine_id)
            return end_machine(connection, machine, to, now, message, failure, self._usage_zone)

    def advance(
        self,
        machine_id: str,
        *steps: tuple[str, str],
        failure: str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Machine:
        """Take several non-terminal steps (state, message) in one transaction.

        Each step is checked as ``Ledger.transition`` checks it and gets its own
        event; either all are taken or none. For steps that follow each other
        with nothing in between (``composed``, then ``launching``), this is one
        commit (and one update of the machine's row) instead of one per step.
        """
        if not steps:
            raise ValueError("advance needs at least one step")
        bad = [to for to, _ in steps if to == CLAIMED or to in TERMINAL]
        if bad:
            raise ValueError(f"advance takes non-terminal steps other than 'claimed', not {bad}")
        now = self._now()
        with self._write() as connection:
            machine = machine_row(connection, machine_id)
            at = move_through(connection, machine, steps, now, **failure_values(failure))
            if manifest is not None:
                connection.execute(
                    _INSERT_RUN_MANIFEST,
                    {
                        "machine_id": machine_id,
                        "user_name": machine.user_name,
                        "server_name": machine.server_name,
                        "started_at": now,
                        "manifest": manifest,
                    },
                )
            held = held_by(connection, machine_id)
            record = moved(machine, at, now, held, **failure_values(failure))
            if not machine.gpu_share:
                return record
            return with_shares(record, shares_held(connection, [machine_id]).get(machine_id, ()))

    def release(
        self,
        machine_id: str,
        *,
        to: str = "released",
        message: str = "",
        failure: str | None = None,
    ) -> Machine:
        """End a ``stopping`` machine (or fail a ``requested`` one): free its devices.

        Writes one usage record per device held. Idempotent: a machine already
        released or failed is returned unchanged, whatever ``to`` says.
        """
        if to not in TERMINAL:
            raise ValueError(f"release ends a machine: to must be one of {sorted(TERMINAL)}")
        try:
            return self._release(machine_id, to, message, failure)
        except IllegalTransition:
            with self._engine.begin() as connection:
                current = read_machine(connection, machine_id)
            if current is not None and current.state in TERMINAL:
                return current  # a concurrent release got there first
            raise

    def _release(self, machine_id: str, to: str, message: str, failure: str | None) -> Machine:
        now = self._now()
        with self._write() as connection:
            machine = machine_row(connection, machine_id)
            if machine.state in TERMINAL:
                return machine_record(machine, ())
            return end_machine(connection, machine, to, now, message, failure, self._usage_zone)
