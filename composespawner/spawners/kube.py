"""The composing spawner for Kubernetes: ``c.JupyterHub.spawner_class = "compose-kubernetes"``.

Its own module, so that a hub running notebooks as local processes never
imports KubeSpawner and its Kubernetes client.
"""

from __future__ import annotations

from composespawner.launchers.kubernetes import KubeLauncher
from composespawner.spawners.spawner import ComposeMixin


class ComposeKubeSpawner(ComposeMixin, KubeLauncher):
    """Compose a machine, then run the notebook as a pod on its host's Kubernetes node.

    Configure it as ``c.ComposeKubeSpawner`` (composing, as ``c.ComposeSpawner``
    takes it) and ``c.KubeSpawner`` (the pod, as for KubeSpawner alone).
    """
