"""A stack's environment on this host, built from the lock the hub sent, never as root.

The hub sends the stack's lock and common files (it has the catalog; the host
does not). The environment is built under ``stacks_dir`` by the builder child
(:mod:`composespawner.launchers.stack_builder`) as the system account
``build_account``, in a cgroup killed whole, then made root's
(:func:`~composespawner.launchers.stack_builds.build_settled` says why and how):
on first use, then found ready by every later start, by anyone.
"""

from __future__ import annotations

import pwd
import time
from collections.abc import Callable

from composespawner.domain.hardware import Share
from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.state import StateDir
from composespawner.launchers.agent_protocol import StackSource
from composespawner.launchers.environments import (
    BUILD_TIMEOUT,
    StackBuildError,
    StackEnvironment,
    StackEnvironments,
)
from composespawner.launchers.stack_builds import BuildPlace, build_settled
from composespawner.launchers.stack_sources import (
    KEEP_SOURCES,
    materialise,
    prune_sources,
    stack_of,
)

SOURCES_LOCK = ".sources.lock"  # in the state folder: materialised sources, and their pruning
Progress = Callable[[str, int], None]


def environment_for(
    source: StackSource, config: AgentConfig, progress: Progress
) -> StackEnvironment:
    """The stack's environment, built first (as the build account) if need be."""
    state = StateDir(config.state_dir)
    sources = config.state_dir / "stacks"
    # Under a lock: another agent's prune must not remove the files this one reads.
    with state.locked(SOURCES_LOCK):
        folder = materialise(source, sources)
        stack = stack_of(source, folder)
        assert stack.common is not None
        environment = StackEnvironments(config.stacks_dir, stack.common).environment(stack)
        prune_sources(sources, time.time() - KEEP_SOURCES, folder)
    place = BuildPlace(
        stacks=config.stacks_dir,
        locks=config.state_dir,
        account=config.build_account,
        cgroup_parent=config.cgroup_parent,
        share=Share(config.cores, config.memory_gib),
        pids_per_gib=config.pids_per_gib,
        timeout=BUILD_TIMEOUT,
    )
    return build_settled(environment, source, place, lambda: _build_account(config), progress)


def _build_account(config: AgentConfig) -> pwd.struct_passwd:
    """The build account: a system one, in the agent's group to reach its Python."""
    from composespawner.hostagent.accounts import ensure_group, open_the_way
    from composespawner.hostagent.config import USERS_GROUP
    from composespawner.launchers.accounts import AccountError, ensure_account, useradd_command

    try:
        group = ensure_group(USERS_GROUP)
        command = useradd_command(config.build_account)
        account = ensure_account(
            config.build_account, [*command[:-1], "--groups", group, command[-1]]
        )
        open_the_way()  # the agent's own Python, which the build runs
    except AccountError as e:
        raise StackBuildError(str(e)) from e
    return account
