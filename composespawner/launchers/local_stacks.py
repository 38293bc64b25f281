"""The local launcher's stack environments: named in the hub, built by the builder child.

The hub never builds in its own process: a build runs the stack's code (its lock's
wheels, ``stack_manifest.py``). A hub run as root has the child build as the system
account ``stack_build_account`` in a cgroup killed whole, and the environment made
root's after (:func:`~.stack_builds.build_settled`), as a host's agent does; a hub
run as its own account has the child build as that account (its notebooks' own).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import sys
from pathlib import Path

from composespawner.domain.catalog import Stack
from composespawner.launchers.accounts import AccountError, account_reaching
from composespawner.launchers.cgroups import host_share
from composespawner.launchers.environments import (
    StackBuildError,
    StackEnvironment,
    StackEnvironments,
)
from composespawner.launchers.stack_builds import BuildPlace, build_own, build_settled, settled
from composespawner.launchers.stack_sources import stack_source

PACKAGE = Path(__file__).resolve().parents[1]  # composespawner/, which the builder runs from
LOCKS = ".locks"  # in the environments' folder


class LocalStackBuilds(StackEnvironments):
    """:class:`StackEnvironments` whose builds run in the builder child."""

    def __init__(
        self,
        root: Path,
        common: Path,
        *,
        build_timeout: float,
        account: str,
        cgroup_parent: tuple[str, ...],
        pids_per_gib: int,
        log: logging.Logger | None = None,
    ) -> None:
        super().__init__(root, common, build_timeout=build_timeout, log=log)
        # As root: the build account's, made root's after; otherwise this account's own.
        self.as_root = os.geteuid() == 0
        self.place = BuildPlace(
            stacks=root,
            locks=root / LOCKS,  # root's alone, among what the build account adds
            account=account,
            cgroup_parent=cgroup_parent,
            share=host_share(),
            pids_per_gib=pids_per_gib,
            timeout=build_timeout,
        )

    def built(self, environment: StackEnvironment) -> bool:
        # As root, built and made root's: never one the build account may still change.
        return settled(environment) if self.as_root else super().built(environment)

    async def _build(self, stack: Stack, environment: StackEnvironment) -> StackEnvironment:
        try:
            source = await asyncio.to_thread(stack_source, stack)
        except (OSError, ValueError) as e:
            raise StackBuildError(
                f"The {stack.label} stack's files cannot be read ({e}). An administrator"
                " checks the catalog's folder."
            ) from e
        loop = asyncio.get_running_loop()

        def progress(message: str, percent: int) -> None:  # in the build's thread
            loop.call_soon_threadsafe(self._tell, environment, percent, message)

        started = loop.time()
        try:
            if self.as_root:
                await asyncio.to_thread(
                    build_settled, environment, source, self.place, self._account, progress
                )
            else:
                await asyncio.to_thread(
                    build_own, environment, source, self.build_timeout, progress
                )
        except StackBuildError as e:
            self.log.error("Building %s failed: %s", environment.path, e)
            raise StackBuildError(
                f"The {stack.label} stack could not be built. Try again; if it keeps"
                " failing, an administrator finds the cause in the hub's log."
            ) from e
        seconds = loop.time() - started
        self.log.info("Built the %s stack in %s (%.0f s)", stack.id, environment.path, seconds)
        return environment

    def _account(self) -> pwd.struct_passwd:
        """The build account, made if missing, able to reach this Python and package
        (a checkout under root's closed home included: entry only, by ACL)."""
        try:
            return account_reaching(self.place.account, [Path(sys.executable), PACKAGE])
        except AccountError as e:
            raise StackBuildError(str(e)) from e
