"""SSH launchers made in process, outside a hub, for the suite's tests."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Any

from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.domain.hardware import Device, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.ssh import MachineStates, SSHLauncher

GPU = Device(
    block_id="r1-t4-1",
    kind="gpu",
    model="NVIDIA T4",
    zones=frozenset({"rack-1"}),
    chassis="rack-1",
    state="attached",
    uuid="0f3c1c9e-aaaa-bbbb-cccc-000000000001",
)


def machine(machine_id: str = "m-1", host: str = "host-1") -> ComposedMachine:
    return ComposedMachine(machine_id, host, "rack-1", (GPU,), None, (), Share(4, 32))


class RecordingLauncher(SSHLauncher):
    """Records what the launcher tells the composing side; ``ledger`` stands in for the
    composer's ledger: each machine's state (None: no ledger)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exits: list[int | None] = []
        self.progress_seen: list[str] = []
        self.exited = asyncio.Event()
        self.ledger: dict[str, str] | None = None

    def machine_states(self) -> MachineStates | None:
        ledger = self.ledger
        if ledger is None:
            return None

        async def states(machine_ids: Collection[str]) -> dict[str, str]:
            return {m: ledger[m] for m in machine_ids if m in ledger}

        return states

    async def notebook_exited(self, status: int | None) -> None:
        self.exits.append(status)
        self.exited.set()

    def launch_progress(self, message: str, percent: int) -> None:
        self.progress_seen.append(message)


def ssh_launcher(
    user: User,
    hosts: dict[str, str],
    key: Path,
    known_hosts: Path,
    *,
    host: str = "host-1",
    name: str = "",
    **config: Any,
) -> RecordingLauncher:
    """A launcher for ``user`` whose composed machine is on ``host``."""
    settings = {
        "hosts": hosts,
        "ssh_key": str(key),
        "known_hosts": str(known_hosts),
        "connect_timeout": 5,
        "request_timeout": 5,
        **config,
    }
    spawner: RecordingLauncher = user._new_spawner(
        name, spawner_class=RecordingLauncher, hub=Hub(), **settings
    )
    spawner.machine = machine(f"m-{user.name}{name}", host)
    spawner.share = spawner.machine.share
    return spawner
