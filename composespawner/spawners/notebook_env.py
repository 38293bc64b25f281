"""What the notebook is told of its machine, its stack, its kit and the portal."""

from __future__ import annotations

from composespawner.domain.catalog import Kit, Stack
from composespawner.domain.machine import ComposedMachine, machine_env
from composespawner.launchers.kits import HOME_FOLDER


def compose_env(
    machine: ComposedMachine | None, stack: Stack | None, portal_url: str
) -> dict[str, str]:
    """The variables composing adds (the launcher adds where its stack is)."""
    env: dict[str, str] = {}
    if machine is not None:
        env.update(machine_env(machine))
    if portal_url:
        env["COMPOSE_PORTAL_URL"] = portal_url
    if stack is not None:
        env.update(stack_env(stack))
    return env


def stack_env(stack: Stack) -> dict[str, str]:
    """What a notebook on ``stack`` is given: the stack's own settings, and which it is."""
    return {**dict(stack.env), "COMPOSE_STACK": stack.id}


def kit_default_url(kit: Kit) -> str:
    """Where a server started with ``kit`` opens: on the kit's notebook, in the home."""
    return f"/lab/tree/{HOME_FOLDER}/{kit.id}/{kit.notebook}"
