"""Every use of KubeSpawner's internals, in one place.

Written against jupyterhub-kubespawner >=7.1,<8 (setup.py; 7.1.0 in
constraints.txt). KubeSpawner offers no public way to be told when a pod
changes, nor to end its start early; the launcher does both through what is
here, and nothing else of ours names a private part of KubeSpawner. This relies on:

- ``KubeSpawner._start_watching_pods(replace=False)``: KubeSpawner starts its
  shared pod reflector through it (on start, poll and stop). Overridden, so that
  reflector is a :class:`PodWatch`, started by ``_start_reflector(kind,
  reflector_class, replace=False, **kwargs)`` with the same ``labels`` and
  ``omit_namespace`` as KubeSpawner's own.
- ``ResourceReflector.resources``, a traitlets ``Dict`` that a full listing
  replaces (``self.resources = {...}``) and the watch changes in place
  (``self.resources[key] = pod``, ``self.resources.pop(key, None)``):
  :class:`PodWatch` sees each of those as it happens.
- ``KubeSpawner._get_pod_url(pod)`` and the ``pod_id`` attribute, which its
  start sets from the pod it found ready: :meth:`PodWatchingKubeSpawner.take_ready_pod`
  does the same when the watch saw the pod ready first.
- ``KubeSpawner._build_common_labels(extra_labels)`` and ``_expand_all(src)``:
  the labels KubeSpawner gives the objects it makes (for the GPUs' ResourceClaim).
- ``kubespawner.clients.shared_client(name)``: KubeSpawner's shared API clients.

tests/unit/test_kubespawner_internals.py fails, naming which, when an upgrade
moves any of these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubespawner import KubeSpawner
from kubespawner.clients import shared_client
from kubespawner.reflector import ResourceReflector
from kubespawner.spawner import PodReflector
from traitlets import validate

PodCallback = Callable[[dict[str, Any] | None], None]


class PodWatch(PodReflector):
    """KubeSpawner's pod reflector that also tells whoever asked when a pod changes.

    KubeSpawner reads ``resources`` (a dict per pod key) and only on its polls;
    every change the watch brings goes through here as it arrives.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._callbacks: dict[str, PodCallback] = {}
        super().__init__(*args, **kwargs)

    def watch(self, key: str, callback: PodCallback) -> None:
        """Call ``callback`` with the pod ``key`` ("namespace/name") at each change."""
        self._callbacks[key] = callback

    def unwatch(self, key: str, callback: PodCallback) -> None:
        if self._callbacks.get(key) == callback:
            del self._callbacks[key]

    def _changed(self, key: str, pod: dict[str, Any] | None) -> None:
        callback = self._callbacks.get(key)
        if callback is not None:
            callback(pod)

    @validate("resources")
    def _observe_each_change(self, proposal: Any) -> dict[str, Any]:
        # A full listing replaces the dict: what changed in it is told too.
        listed = _ObservedPods(proposal.value, self._changed)
        previous = self.resources if isinstance(self.resources, dict) else {}
        for key in self._callbacks:
            if previous.get(key) is not listed.get(key):
                self._changed(key, listed.get(key))
        return listed


class _ObservedPods(dict[str, Any]):
    """The reflector's pods; each set or removal is reported."""

    def __init__(self, pods: Mapping[str, Any], changed: Callable[[str, Any], None]) -> None:
        super().__init__(pods)
        self._report = changed

    def __setitem__(self, key: str, pod: Any) -> None:
        super().__setitem__(key, pod)
        self._report(key, pod)

    def pop(self, key: str, *default: Any) -> Any:
        found = super().pop(key, *default)
        self._report(key, None)
        return found


class PodWatchingKubeSpawner(KubeSpawner):
    """KubeSpawner whose pod reflector is a :class:`PodWatch`; its internals by public names."""

    async def _start_watching_pods(self, replace: bool = False) -> ResourceReflector:
        return await self._start_reflector(
            kind="pods",
            reflector_class=PodWatch,
            labels={"component": self.component_label},
            omit_namespace=self.enable_user_namespaces,
            replace=replace,
        )

    async def pod_watch(self) -> PodWatch:
        """The shared pod watch of this spawner's namespace, started if it was not."""
        reflector = await self._start_watching_pods()
        assert isinstance(reflector, PodWatch), "another pod reflector took this namespace"
        return reflector

    @property
    def running_pod_watch(self) -> PodWatch | None:
        """The pod watch if it is running (None before the first start or poll)."""
        reflector = self.pod_reflector
        return reflector if isinstance(reflector, PodWatch) else None

    def take_ready_pod(self, pod: Mapping[str, Any]) -> str:
        """What KubeSpawner's start does with the pod it found ready: keep its uid; its url."""
        self.pod_id = pod["metadata"]["uid"]
        url: str = self._get_pod_url(pod)
        return url

    def object_labels(self) -> dict[str, str]:
        """The labels KubeSpawner gives the objects it makes for this server."""
        labels: dict[str, str] = self._build_common_labels(self._expand_all(self.extra_labels))
        return labels


def kube_api(name: str) -> Any:
    """KubeSpawner's shared client of the Kubernetes API group ``name`` ("ResourceV1Api")."""
    return shared_client(name)
