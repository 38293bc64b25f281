"""Co-located devices: hardware a group put into the shared expansion chassis. Pure.

A device is its owner group's by the catalog (a whole chassis, ``colocated`` in
catalog.toml) or by a registration an admin made in the portal, which wins. Only
the owner group's members ever see or get it (invariant 2), and whoever it is
lent to, until the loan's end: owners lend it to a user or a group and take it
back.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

from composespawner.domain.cohorts import InvalidCohort


class InvalidRegistration(InvalidCohort):
    """A registration or loan that cannot be stored; the message says what to change."""


@dataclass(frozen=True)
class Registration:
    block_id: str
    owner_group: str
    lent_to_user: str | None = None
    lent_to_group: str | None = None
    lent_until: datetime | None = None

    def __post_init__(self) -> None:
        if not self.owner_group:
            raise InvalidRegistration("name the owner group")
        lent = (self.lent_to_user, self.lent_to_group)
        if self.lent_to_user and self.lent_to_group:
            raise InvalidRegistration("lend a device to a user or to a group, not both")
        if any(lent) != (self.lent_until is not None):
            raise InvalidRegistration("a loan names who borrows and until when")

    def lent_to(self, user: str, groups: Collection[str], now: datetime) -> bool:
        if self.lent_until is None or now >= self.lent_until:
            return False
        return self.lent_to_user == user or (
            self.lent_to_group is not None and self.lent_to_group in groups
        )

    def usable_by(self, user: str, groups: Collection[str], now: datetime) -> bool:
        return self.owner_group in groups or self.lent_to(user, groups, now)


def owners(
    catalog_owners: Mapping[str, str], registrations: Mapping[str, Registration]
) -> dict[str, str]:
    """block → owner group: the catalog's chassis owners, then each registration."""
    merged = dict(catalog_owners)
    merged.update({block: r.owner_group for block, r in registrations.items()})
    return merged


def owners_for(
    owners: Mapping[str, str],
    registrations: Mapping[str, Registration],
    user: str,
    groups: Collection[str],
    now: datetime,
) -> Mapping[str, str]:
    """``owners`` as placement must see them for ``user``: less what is lent to them now."""
    lent = [b for b, r in registrations.items() if r.lent_to(user, groups, now)]
    if not lent:
        return owners
    return {block: group for block, group in owners.items() if block not in lent}
