"""Co-located devices registered in the ledger, lent and taken back; the claim obeys them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from composespawner.domain.colocation import Registration
from composespawner.ledger import Actor, Ledger, NotOwner, UnknownDevices
from tests.ledger.support import Clock
from tests.ledger.test_ledger_claim import assert_unchanged_after_refusal

ADMIN = Actor("admin", "192.0.2.1")


def claim(
    ledger: Ledger, user: str, blocks: list[str], groups: frozenset[str] = frozenset()
) -> str:
    machine_id = ledger.request_machine(user, "", {})
    ledger.claim(machine_id, host_id="h", zone="rack-1", block_ids=blocks, groups=groups)
    return machine_id


def test_a_registration_gives_the_device_to_its_new_owners_alone(
    ledger: Ledger, colocated: list[str]
) -> None:
    # colo-01 is 'physics' by the catalog; the admin gives it to 'chem'.
    ledger.policy.register_device(colocated[0], "chem", ADMIN)
    assert ledger.policy.registrations() == {colocated[0]: Registration(colocated[0], "chem")}
    physicist = ledger.request_machine("phil", "", {})
    with pytest.raises(NotOwner):
        ledger.claim(
            physicist,
            host_id="h",
            zone="rack-1",
            block_ids=colocated[:1],
            groups=frozenset({"physics"}),
        )
    assert_unchanged_after_refusal(ledger, physicist, colocated[:1])
    claim(ledger, "chris", colocated[:1], frozenset({"chem"}))


def test_a_loan_lets_the_borrower_claim_until_it_ends_or_is_taken_back(
    ledger: Ledger, colocated: list[str], clock: Clock
) -> None:
    registration = ledger.policy.register_device(colocated[0], "physics", ADMIN)
    lent = Registration(
        colocated[0], "physics", lent_to_user="amy", lent_until=clock.now + timedelta(days=1)
    )
    ledger.policy.lend(lent, Actor("phil"))
    first = claim(ledger, "amy", colocated[:1])
    ledger.transition(first, "stopping", "stop")
    ledger.release(first)

    clock.advance(days=1)  # the loan is over
    late = ledger.request_machine("amy", "late", {})
    with pytest.raises(NotOwner):
        ledger.claim(late, host_id="h", zone="rack-1", block_ids=colocated[:1])

    ledger.policy.lend(lent, Actor("phil"))  # lent again, then taken back at once
    ledger.policy.lend(registration, Actor("phil"))
    with pytest.raises(NotOwner):
        ledger.claim(late, host_id="h", zone="rack-1", block_ids=colocated[:1])
    actions = [e.action for e in ledger.policy.audit_log()]
    assert actions == ["device.take_back", "device.lend", "device.lend", "device.register"]


def test_registering_an_unknown_device_or_lending_an_unregistered_one_is_refused(
    ledger: Ledger, colocated: list[str]
) -> None:
    with pytest.raises(UnknownDevices):
        ledger.policy.register_device("no-such-block", "chem", ADMIN)
    with pytest.raises(UnknownDevices):
        ledger.policy.lend(Registration(colocated[1], "physics"), ADMIN)
    assert ledger.policy.registrations() == {}
    assert ledger.policy.audit_log() == []
