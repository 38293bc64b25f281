"""What one user asked for, checked against what they may ask for now.

The spawner's form and its start both check a request the same way: against
the catalog, the GPU models this user may see, and (at start) their admission.
:class:`UserRequests` does that for one user; the spawner makes one from its
composer as it needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from composespawner.domain.catalog import Catalog, Stack
from composespawner.domain.colocation import Registration
from composespawner.domain.request import (
    MachineRequest,
    check_server_name,
    check_size,
    parse_form,
    parse_options,
    settle_size,
    settle_stack,
)
from composespawner.fabric.base import FabricError
from composespawner.services.admission import Admission
from composespawner.services.composer import Composer
from composespawner.spawners.refusals import fabric_unreadable, refused_options


@dataclass(frozen=True, slots=True)
class UserRequests:
    """One user's requests, checked with the shared composer."""

    composer: Composer
    user: str
    groups: frozenset[str]
    log: logging.Logger | logging.LoggerAdapter[Any]
    server: str  # the server as the hub's log names it

    async def from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """A form's (or a spawn link's) fields as the options they ask for, checked."""
        visible = await self.visible_models()
        with refused_options():
            return parse_form(formdata, self.composer.catalog, visible).to_options()

    async def for_start(self, options: dict[str, Any], admitted: Admission) -> MachineRequest:
        """The request a start's options make, its stack and size settled by the user's
        cohorts."""
        # The admission read brought the portal's registrations: not read again.
        visible = await self.visible_models(admitted.registrations)
        catalog = self.composer.catalog
        with refused_options():
            request = parse_options(options, catalog, visible)
            named = options.get("size") not in (None, "")
            request = settle_size(request, catalog, admitted.sizes, named=named)
            return settle_stack(request, catalog, admitted.stacks)

    async def visible_models(
        self, registrations: Mapping[str, Registration] | None = None
    ) -> frozenset[str]:
        try:
            return await self.composer.pool.visible_models(self.user, self.groups, registrations)
        except FabricError as e:
            # Nothing is claimed before this read, so there is nothing to undo.
            self.log.warning("Fabric unreadable for %s's spawn: %s", self.server, e)
            raise fabric_unreadable() from e


def options_to_start(
    user_options: dict[str, Any], accepted: dict[str, Any], server: str
) -> dict[str, Any]:
    """A start's options, their size and the server's name checked before anything is
    read for them. Without options of its own a start reuses the last ``accepted`` ones."""
    options = user_options or accepted
    with refused_options():
        check_server_name(server)
        check_size(options)
    return options


def stack_asked_for(catalog: Catalog, options: dict[str, Any]) -> Stack | None:
    """The stack ``options`` run on: the one asked for, else the kit's, else the default.

    The options are not checked yet: one that names nothing known is None.
    """
    wanted = options.get("stack")
    kit = catalog.kit(options["kit"]) if isinstance(options.get("kit"), str) else None
    if not wanted and kit is not None:
        wanted = kit.stack
    if not wanted:
        return catalog.default_stack
    return catalog.stack(wanted) if isinstance(wanted, str) else None


class LinkChoices:
    """Choices a spawn link asked for, checked, kept for the form that answers that
    same request (JupyterHub sets the spawner's ``handler`` for each form request)."""

    def __init__(self) -> None:
        self._kept: tuple[Any, dict[str, Any]] | None = None

    def keep(self, handler: Any, choices: dict[str, Any]) -> None:
        self._kept = (handler, choices)

    def take(self, handler: Any) -> dict[str, Any] | None:
        """The choices kept for ``handler``'s form, once; None for any other."""
        kept, self._kept = self._kept, None
        if kept is None or kept[0] is not handler:
            return None  # none, or a link's whose form was never shown
        return kept[1]
