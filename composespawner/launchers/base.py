"""What the composing spawner and a launcher say to each other.

A launcher runs the notebook: JupyterHub's own ``start``/``stop``/``poll`` of
some spawner class (the local process one, KubeSpawner). :class:`ComposeMixin
<composespawner.spawners.spawner.ComposeMixin>` composes the machine around it. Both
derive from :class:`Launcher`, so each side's hooks have a default and the
other side's implementation wins: the mixin implements the first two (it is
first in a concrete spawner's bases), a launcher the rest.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.spawner import SpawnException

from composespawner.domain.catalog import Kit, Stack
from composespawner.domain.hardware import Share


class SpawnRefused(SpawnException):
    """The spawn refused, shown to the user as-is: on the form, the progress page and in the API.

    (The composer's own :class:`~composespawner.services.failures.ComposeRefused` becomes
    one of these in the spawner.)
    """

    def __init__(self, message: str, *, reason: str, status_code: int) -> None:
        super().__init__(message, reason=reason, status_code=status_code)
        # The spawn form shows ``jupyterhub_message`` verbatim (str() adds a prefix).
        self.jupyterhub_message = message


class KitNotDelivered(Exception):
    """A starter kit could not be merged into the home; the message says why."""


class Launcher:
    """The hooks between composing a machine and running a notebook on it.

    A base of both sides, before their JupyterHub spawner class: ``class
    ComposeMixin(ComposeSettings, Launcher, Spawner)``, ``class
    LocalLauncher(Launcher, LocalProcessSpawner)``.
    """

    # Set by the mixin before start: the stack the notebook runs on (None: as configured).
    stack: Stack | None = None
    # Set by the mixin before start: the machine's share of its host's cores and memory,
    # which the launcher enforces on the notebook (None: no share was composed).
    share: Share | None = None
    # Which of a stack's builds this launcher runs: its GPU image, or its CPU lock.
    stack_variant: str = "gpu"
    # Set by a launcher that runs an image, before the run manifest is written: which,
    # by digest (repository@sha256:…). None: the catalog's, or none.
    run_image: str | None = None

    # -- the launcher calls these; the mixin implements them -------------------

    async def notebook_exited(self, status: int | None) -> None:
        """The launcher saw its notebook exit (the mixin gives the machine back)."""

    def launch_progress(self, message: str, percent: int) -> None:
        """What the launch is doing, for the user (the mixin shows it)."""

    # -- the mixin calls these; a launcher implements them ---------------------

    def check_stack(self, stack: Stack) -> None:
        """Refuse, before anything is claimed, a stack this launcher cannot run.

        Raises :class:`~composespawner.launchers.refusal.SpawnRefused` with what to do.
        """

    def check_without_stack(self) -> None:
        """Refuse, before anything is claimed, a start that chose no stack, where this
        launcher runs only stacks (their images).

        Raises :class:`~composespawner.launchers.refusal.SpawnRefused` with what to do.
        """

    def check_kit(self, kit: Kit) -> None:
        """Refuse, before anything is claimed, a starter kit this launcher cannot deliver.

        Raises :class:`~composespawner.launchers.refusal.SpawnRefused` with what to do.
        """

    def extra_start_time(self, stack: Stack | None) -> float:
        """Seconds a start on ``stack`` may take beyond ``start_timeout`` (a build)."""
        del stack
        return 0.0

    async def prepare_launch(self) -> None:
        """Have :attr:`stack` ready to run, before ``get_env`` and ``start`` (a build)."""

    async def deliver_kit(self, kit: Kit) -> None:
        """Merge ``kit`` into the user's home, never over their changes (:mod:`..kits`).

        Raises :class:`KitNotDelivered` with what went wrong; the start goes on.
        """
        del kit

    def launcher_env(self) -> dict[str, str]:
        """What the launcher adds to the notebook's environment (where its stack is)."""
        return {}

    async def deliver_run_manifest(self, manifest: dict[str, Any]) -> str | None:
        """Put the run manifest where the notebook reads it, read-only; where that is."""
        del manifest
        return None
