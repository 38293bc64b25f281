"""What launchers/kubespawner_internals.py relies on in the installed KubeSpawner, checked.

An upgrade of jupyterhub-kubespawner that moves any of it fails here, by name,
rather than the launcher in production. Each test names the part of the
adapter's docstring it checks; when one fails, read the new KubeSpawner's
code for that part and change the adapter (and its docstring) with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from kubespawner import KubeSpawner
from kubespawner.clients import shared_client
from kubespawner.reflector import ResourceReflector
from kubespawner.spawner import PodReflector
from packaging.version import Version
from traitlets import Dict

from composespawner.launchers.kubernetes import KubeLauncher
from composespawner.launchers.kubespawner_internals import PodWatch, PodWatchingKubeSpawner

P = inspect.Parameter


def parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Each parameter's name, kind and default."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_installed_kubespawner_is_in_the_range_the_adapter_was_written_for() -> None:
    assert Version("7.1") <= Version(version("jupyterhub-kubespawner")) < Version("8")


def test_kubespawner_starts_its_pod_reflector_through_the_method_the_adapter_overrides() -> None:
    ours, theirs = PodWatchingKubeSpawner._start_watching_pods, KubeSpawner._start_watching_pods
    assert inspect.iscoroutinefunction(theirs)
    assert (
        parameters(theirs)
        == parameters(ours)
        == [
            ("self", P.POSITIONAL_OR_KEYWORD, P.empty),
            ("replace", P.POSITIONAL_OR_KEYWORD, False),
        ]
    )
    for caller in (KubeSpawner._start, KubeSpawner.poll, KubeSpawner.stop):
        assert "self._start_watching_pods(" in inspect.getsource(caller), caller.__name__
    assert KubeLauncher._start_watching_pods is ours


def test_a_reflector_is_started_by_kind_and_class_with_the_labels_kubespawner_uses() -> None:
    start = KubeSpawner._start_reflector
    assert inspect.iscoroutinefunction(start)
    assert parameters(start) == [
        ("self", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("kind", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("reflector_class", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("replace", P.POSITIONAL_OR_KEYWORD, False),
        ("kwargs", P.VAR_KEYWORD, P.empty),
    ]
    # The same reflector as KubeSpawner's own, but for its class.
    theirs = inspect.getsource(KubeSpawner._start_watching_pods)
    assert 'labels={"component": self.component_label}' in theirs
    assert "omit_namespace=self.enable_user_namespaces" in theirs
    assert "reflector_class=PodReflector" in theirs
    assert {"labels", "omit_namespace", "namespace", "resources"} <= set(
        PodReflector.class_trait_names()
    )
    assert issubclass(PodWatch, PodReflector)
    assert isinstance(inspect.getattr_static(KubeSpawner, "pod_reflector"), property)


def test_the_reflector_replaces_its_pods_on_a_listing_and_changes_them_in_place_on_a_watch() -> (
    None
):
    assert isinstance(ResourceReflector.class_traits()["resources"], Dict)
    assert "self.resources = {" in inspect.getsource(ResourceReflector._list_and_update)
    watching = inspect.getsource(ResourceReflector._watch_and_update)
    assert "self.resources.pop(ref_key, None)" in watching
    assert "self.resources[ref_key] = resource" in watching


def test_a_ready_pod_gives_its_uid_and_url_as_kubespawners_start_takes_them() -> None:
    assert parameters(KubeSpawner._get_pod_url) == [
        ("self", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("pod", P.POSITIONAL_OR_KEYWORD, P.empty),
    ]
    starting = inspect.getsource(KubeSpawner._start)
    assert 'self.pod_id = pod["metadata"]["uid"]' in starting
    assert "self._get_pod_url(pod)" in starting


def test_the_labels_of_kubespawners_objects_are_built_by_the_methods_the_adapter_calls() -> None:
    assert parameters(KubeSpawner._build_common_labels) == [
        ("self", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("extra_labels", P.POSITIONAL_OR_KEYWORD, P.empty),
    ]
    assert parameters(KubeSpawner._expand_all) == [
        ("self", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("src", P.POSITIONAL_OR_KEYWORD, P.empty),
    ]
    assert "extra_labels" in KubeSpawner.class_trait_names()


def test_kubespawners_shared_clients_are_had_by_the_api_classs_name() -> None:
    assert parameters(shared_client) == [
        ("ClientType", P.POSITIONAL_OR_KEYWORD, P.empty),
        ("args", P.VAR_POSITIONAL, P.empty),
        ("kwargs", P.VAR_KEYWORD, P.empty),
    ]
    assert "getattr(kubernetes_asyncio.client, ClientType)" in inspect.getsource(shared_client)
