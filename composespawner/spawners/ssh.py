"""The composing spawner for bare compute hosts: ``c.JupyterHub.spawner_class = "compose-ssh"``.

Its own module, so that a hub running notebooks otherwise never imports asyncssh.
"""

from __future__ import annotations

from functools import partial

from jupyterhub.spawner import SpawnException

from composespawner.launchers.ssh import MachineStates, SSHLauncher, ledger_states
from composespawner.spawners.spawner import ComposeMixin


class ComposeSSHSpawner(ComposeMixin, SSHLauncher):
    """Compose a machine, then run the notebook on its host, as the user's own account there.

    The hub reaches each host over SSH (its key pinned in known_hosts) and asks the
    host's agent, ``composespawner-host``, the only command the hub's key may run
    there, to start ``jupyterhub-singleuser`` as the user, held to the machine's
    share and shown only its GPUs. Configure composing as ``c.ComposeMixin`` and the
    hosts as ``c.SSHLauncher`` (``hosts``, ``ssh_key``, ``known_hosts``).
    """

    def machine_states(self) -> MachineStates | None:
        """The composer's ledger tells a host's orphaned notebooks from its live ones."""
        try:
            runner = self.composer.runner
        except SpawnException:  # the ledger cannot be used now (logged): none are orphans
            return None
        return partial(ledger_states, runner)
