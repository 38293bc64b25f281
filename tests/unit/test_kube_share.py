"""A pod on a shared node gets its machine's share of the host: requests = limits (Guaranteed).

Against the manifest KubeSpawner builds, with its own resource knobs set as a
university's config sets them: the share wins for cpu and memory, and nothing
else of KubeSpawner's resources (or a DRA claim) is lost.
"""

from __future__ import annotations

import json
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import kube_config
from kubespawner.objects import make_pod

from composespawner.domain.hardware import Device, Share
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers import kubernetes
from composespawner.launchers.kubernetes import KubeLauncher, Placement, pin_to_machine
from harness.kube import serialized

UUID_A = "0f9a3c1e-8b7d-5e6f-a1b2-c3d4e5f60718"
MACHINE = ComposedMachine(
    "m-7",
    "host-03",
    "r1",
    (Device("g1", "gpu", "NVIDIA T4", frozenset({"r1"}), "c1", "attached", uuid=UUID_A),),
    None,
    (),
)
KUBESPAWNER_RESOURCES: dict[str, Any] = {
    "cpu_limit": 8.0,
    "cpu_guarantee": 0.5,
    "mem_limit": "64G",
    "mem_guarantee": "1G",
    "extra_resource_limits": {"ephemeral-storage": "10Gi"},
    "extra_resource_guarantees": {"ephemeral-storage": "1Gi"},
}


def kubespawner_pod(**config: Any) -> Any:
    return make_pod(
        name="jupyter-ada",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="quay.io/jupyter/base-notebook",
        image_pull_policy="IfNotPresent",
        env={"JUPYTERHUB_USER": "ada"},
        **config,
    )


def resources(pod: dict[str, Any]) -> dict[str, Any]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "notebook")
    found: dict[str, Any] = container["resources"]
    return found


async def test_the_share_is_the_pods_requests_and_limits_and_the_rest_stays() -> None:
    pod = kubespawner_pod(**KUBESPAWNER_RESOURCES)
    pinned = await serialized(pin_to_machine(pod, Placement("host-03", share=Share(4, 32))))
    assert resources(pinned) == {
        "requests": {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "10Gi"},
    }


async def test_a_pod_with_no_resources_of_its_own_is_guaranteed_its_share() -> None:
    pinned = await serialized(pin_to_machine(kubespawner_pod(), Placement("h", share=Share(2, 8))))
    held = resources(pinned)
    assert held["requests"] == held["limits"] == {"cpu": "2", "memory": "8Gi"}


async def test_the_share_and_a_dra_claim_go_together() -> None:
    placement = Placement("host-03", gpu_claim="jupyter-ada-gpus", share=Share(1, 4))
    held = resources(await serialized(pin_to_machine(kubespawner_pod(), placement)))
    assert held["claims"] == [{"name": "gpus"}]
    assert held["limits"] == {"cpu": "1", "memory": "4Gi"}


async def test_without_a_share_kubespawners_resources_are_kept() -> None:
    pinned = await serialized(
        pin_to_machine(kubespawner_pod(**KUBESPAWNER_RESOURCES), Placement("host-03"))
    )
    assert resources(pinned)["limits"] == {
        "cpu": 8.0,
        "memory": "64G",
        "ephemeral-storage": "10Gi",
    }


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster KubeSpawner can be configured for; building a manifest never calls it."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))


async def test_the_launchers_pod_has_its_share_and_exactly_its_own_gpus(kubeconfig: None) -> None:
    launcher = KubeLauncher(_mock=True, namespace="default", **KUBESPAWNER_RESOURCES)
    launcher.machine, launcher.share = MACHINE, Share(4, 32)
    pod = await serialized(await launcher.get_pod_manifest())
    held = resources(pod)
    assert held["requests"]["cpu"] == held["limits"]["cpu"] == "4"
    assert held["requests"]["memory"] == held["limits"]["memory"] == "32Gi"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{UUID_A}"


async def test_a_share_holders_pod_asks_the_device_plugin_for_no_whole_gpu() -> None:
    whole = {"nvidia.com/gpu": "1", "ephemeral-storage": "1Gi"}
    pod = kubespawner_pod(extra_resource_limits=whole, extra_resource_guarantees=whole)
    placement = Placement("host-03", share=Share(1, 4), gpu_share=4)
    held = resources(await serialized(pin_to_machine(pod, placement)))
    assert (
        held["limits"]
        == held["requests"]
        == {
            "cpu": "1",
            "memory": "4Gi",
            "ephemeral-storage": "1Gi",
        }
    )
    # A whole GPU's pod keeps what the config asks (the cluster's choice, as before).
    kept = pin_to_machine(kubespawner_pod(extra_resource_limits=whole), Placement("host-03"))
    assert resources(await serialized(kept))["limits"]["nvidia.com/gpu"] == "1"


async def test_the_placement_says_the_machines_share_of_its_gpu() -> None:
    spawner = KubeLauncher(_mock=True, namespace="default")
    assert spawner.placement(replace(MACHINE, gpu_share=4)).gpu_share == 4
    assert spawner.placement(MACHINE).gpu_share == 1


class ResourceApi:
    """resource.k8s.io/v1 as a server answers a create: the claim back, as the client's model;
    one without consumable capacity drops a request's ``capacity``, as a disabled gate does."""

    def __init__(self, serves_capacity: bool) -> None:
        self.api_client = ApiClient()
        self.serves_capacity = serves_capacity
        self.claims: dict[str, dict[str, Any]] = {}

    async def create_namespaced_resource_claim(
        self, namespace: str, body: dict[str, Any], _request_timeout: float
    ) -> Any:
        kept = json.loads(json.dumps(body))
        if not self.serves_capacity:
            kept["spec"]["devices"]["requests"][0]["exactly"].pop("capacity", None)
        self.claims[kept["metadata"]["name"]] = kept
        answer: Any = types.SimpleNamespace(data=json.dumps(kept))  # a RESTResponse's part
        return self.api_client.deserialize(answer, "ResourceV1ResourceClaim")

    async def delete_namespaced_resource_claim(
        self, name: str, namespace: str, _request_timeout: float
    ) -> None:
        if self.claims.pop(name, None) is None:
            raise ApiException(status=404)


@pytest.mark.parametrize("serves_capacity", [True, False])
async def test_a_shares_claim_the_server_would_make_whole_is_taken_back_and_said(
    monkeypatch: pytest.MonkeyPatch, serves_capacity: bool
) -> None:
    api = ResourceApi(serves_capacity)
    monkeypatch.setattr(kubernetes, "kube_api", lambda name: api)
    launcher = KubeLauncher(_mock=True, namespace="default", gpu_allocation="dra")
    launcher.machine = replace(
        MACHINE, gpus=(replace(MACHINE.gpus[0], memory_gib=16),), gpu_share=4
    )
    try:
        if serves_capacity:
            await launcher.create_gpu_claim()
            (claim,) = api.claims.values()
            assert claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
                "requests": {"memory": "4096Mi"}
            }
        else:
            with pytest.raises(kubernetes.NotebookNotStarted, match="consumable capacity"):
                await launcher.create_gpu_claim()
            assert api.claims == {}  # it would have waited for the whole GPU
    finally:
        await api.api_client.close()
