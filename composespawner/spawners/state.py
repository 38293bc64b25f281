"""What a composing spawner keeps in the hub's database between hub restarts.

Its part of ``Spawner.get_state``: the machine it runs on, the options it last
started with (the next start's defaults) and the run manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from composespawner.domain.machine import ComposedMachine

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class ComposeState:
    """What a saved state holds of ours; None for what it does not."""

    machine: ComposedMachine | None = None
    accepted_options: dict[str, Any] | None = None
    run_manifest: dict[str, Any] | None = None


def saved_state(kept: ComposeState) -> dict[str, Any]:
    """Our keys of ``get_state``, for what is there to keep."""
    state: dict[str, Any] = {}
    if kept.machine is not None:
        state["compose"] = {"version": STATE_VERSION, **kept.machine.to_state()}
    if kept.accepted_options:
        # Kept across stops (clear_state leaves it): the next start's defaults.
        state["compose_options"] = kept.accepted_options
    if kept.run_manifest is not None:
        state["run_manifest"] = kept.run_manifest
    return state


def restored_state(state: dict[str, Any]) -> ComposeState:
    """What ``load_state`` is given of ours; a value that is not ours to read stays None."""
    compose = state.get("compose")
    options, manifest = state.get("compose_options"), state.get("run_manifest")
    return ComposeState(
        # version 1 is the first; later versions must keep reading it. Its gpu_share
        # came later, with a default (1: whole GPUs, as every older state's were).
        machine=ComposedMachine.from_state(compose) if compose else None,
        accepted_options=options if isinstance(options, dict) else None,
        run_manifest=manifest if isinstance(manifest, dict) else None,
    )
