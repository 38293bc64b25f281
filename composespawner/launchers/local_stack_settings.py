"""The local launcher's knobs for stack environments, and the builder they make.

A mixin of :class:`~composespawner.launchers.local.LocalLauncher`, before
:class:`~composespawner.launchers.base.Launcher`, whose stack hooks it answers (the
container launcher, which runs images, answers them in turn before it).
"""

from __future__ import annotations

from typing import Any

from traitlets import Float, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from composespawner.domain.catalog import Stack
from composespawner.launchers.accounts import BUILD_ACCOUNT, is_account_name
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.environments import (
    BUILD_TIMEOUT,
    StackBuildError,
    StackEnvironments,
    default_root,
)
from composespawner.launchers.local_files import stack_builder


class LocalStackSettings(LoggingConfigurable):
    """Where stack environments are kept, as whom and for how long they are built."""

    stack_environments_dir = Unicode(
        config=True,
        help="""Where stack environments are built and kept, one folder per stack lock
        (a few GB each). The account notebooks run as must be able to read it.""",
    )
    stack_build_account = Unicode(
        BUILD_ACCOUNT,
        config=True,
        help="""With a hub running as root: the system account stack environments are built
        as (made if missing), never root. A build runs the stack's code (its lock's wheels,
        stack_manifest.py); it runs in a cgroup killed whole once done, and the environment
        is made root's after, so no build can change what notebooks run. Must be no other
        account's: every process it has is ended after each build.""",
    )
    stack_build_timeout = Float(
        BUILD_TIMEOUT,
        config=True,
        help="""Seconds building a stack's environment may take, on top of start_timeout
        for the start that builds it (the first on that stack's lock).""",
    )

    @validate("stack_build_account")
    def _valid_build_account(self, proposal: dict[str, Any]) -> str:
        name = str(proposal["value"])
        if not is_account_name(name) or name == "root":
            raise TraitError(f"stack_build_account: {name!r} is not a system account's name")
        return name

    @default("stack_environments_dir")
    def _default_stack_environments_dir(self) -> str:
        return str(default_root())

    # The launcher's own (LocalLauncher, CgroupLimitedSpawner): a build must not be
    # able to end a notebook, and runs in the notebooks' cgroup parent.
    notebook_account: str
    cgroup_parent: str
    pids_per_gib: int

    def _builder(self, stack: Stack) -> StackEnvironments:
        if self.stack_build_account == self.notebook_account:
            # Every process of the build account is ended after each build.
            raise StackBuildError(
                "Stacks cannot be built here: the hub's stack_build_account is also its"
                " notebook_account. An administrator gives builds an account of their own."
            )
        return stack_builder(
            self.stack_environments_dir,
            stack,
            self.stack_build_timeout,
            self.log,
            account=self.stack_build_account,
            cgroup_parent=self.cgroup_parent,
            pids_per_gib=self.pids_per_gib,
        )

    def check_stack(self, stack: Stack) -> None:
        try:
            self._builder(stack).environment(stack)
        except StackBuildError as e:
            raise SpawnRefused(str(e), reason="stack", status_code=503) from e

    def extra_start_time(self, stack: Stack | None) -> float:
        if stack is None:
            return 0.0
        try:
            ready = self._builder(stack).ready(stack)
        except StackBuildError:
            return 0.0  # start() refuses it at once
        return 0.0 if ready is not None else self.stack_build_timeout
