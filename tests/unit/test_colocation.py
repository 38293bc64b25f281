"""Co-located devices, pure: who owns a device, who may use it, and loans that end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from composespawner.domain.colocation import InvalidRegistration, Registration, owners, owners_for

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LENT = Registration("x1", "vision-lab", lent_to_user="amy", lent_until=NOW + timedelta(days=1))


def test_a_registration_wins_over_the_catalogs_chassis_owner() -> None:
    catalog = {"x1": "vision-lab", "x2": "vision-lab"}
    assert owners(catalog, {"x1": Registration("x1", "cs-101")}) == {
        "x1": "cs-101",
        "x2": "vision-lab",
    }


def test_owners_and_borrowers_may_use_it_until_the_loan_ends() -> None:
    assert LENT.usable_by("bob", ["vision-lab"], NOW)  # an owner
    assert LENT.usable_by("amy", [], NOW)  # the borrower
    assert not LENT.usable_by("amy", [], NOW + timedelta(days=1))  # the loan ended
    assert not LENT.usable_by("zed", ["cs-101"], NOW)
    to_group = Registration(
        "x1", "vision-lab", lent_to_group="cs-101", lent_until=NOW + timedelta(hours=1)
    )
    assert to_group.usable_by("zed", ["cs-101"], NOW)


def test_placement_sees_a_lent_device_as_the_borrowers() -> None:
    all_owners = {"x1": "vision-lab", "x2": "vision-lab"}
    assert owners_for(all_owners, {"x1": LENT}, "amy", [], NOW) == {"x2": "vision-lab"}
    assert owners_for(all_owners, {"x1": LENT}, "zed", [], NOW) == all_owners


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"owner_group": ""}, "name the owner group"),
        ({"lent_to_user": "a", "lent_to_group": "b", "lent_until": NOW}, "not both"),
        ({"lent_to_user": "a"}, "a loan names who borrows and until when"),
        ({"lent_until": NOW}, "a loan names who borrows and until when"),
    ],
)
def test_a_registration_that_cannot_be_stored_says_why(
    kwargs: dict[str, object], message: str
) -> None:
    fields = {"block_id": "x1", "owner_group": "g", **kwargs}
    with pytest.raises(InvalidRegistration, match=message):
        Registration(**fields)  # type: ignore[arg-type]
