"""Every object the Kubernetes launcher makes, checked in strict mode against the schemas of
the Kubernetes versions universities run (1.30 and newer), not only the 1.20 API server here;
and what Dynamic Resource Allocation does on a cluster that does not serve it."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_asyncio.config import kube_config
from kubernetes_validate.utils import all_versions

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.domain.hardware import Device
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.dra import gpu_claim, kept_share
from composespawner.launchers.kubernetes import HOSTNAME_LABEL, NotebookNotStarted
from composespawner.spawners.kube import ComposeKubeSpawner
from harness.kube import KubeApiServer, serialized
from harness.paths import ROOT

pytestmark = pytest.mark.kubernetes
OLDEST = (1, 30)  # the oldest release still widely run (its upstream support ended in 2025)
DRA_SINCE = (1, 34)  # resource.k8s.io/v1 is GA from here


def versions(since: tuple[int, int]) -> list[str]:
    """Every Kubernetes release kubernetes-validate has schemas for, from ``since`` on."""
    found = [
        v
        for v in dict.fromkeys(all_versions())  # each twice: loose and strict schemas
        if tuple(int(n) for n in v.split(".")[:2]) >= since
    ]
    # The oldest asked for must be there: else fewer releases would be checked, silently.
    assert found, since
    assert found[0].startswith("{}.{}.".format(*since)), found
    return found


MACHINE = ComposedMachine(
    machine_id="m-42",
    host="host-02",
    zone="rack-1",
    gpus=tuple(
        Device(
            f"gpu-{n}",
            "gpu",
            "NVIDIA A100",
            frozenset({"rack-1"}),
            "rack-1",
            "attached",
            memory_gib=80,
            uuid=f"4a1b2c3d-0000-5000-8000-00000000000{n}",
        )
        for n in (1, 2)
    ),
    nic=Device(
        "nic-1", "nic", "ConnectX-7", frozenset({"rack-1"}), "rack-1", "attached", speed_gbps=100
    ),
    drives=(
        Device(
            "nvme-1",
            "nvme",
            "PM1733",
            frozenset({"rack-1"}),
            "rack-1",
            "attached",
            capacity_gb=1920,
        ),
    ),
)
STACK = Stack(
    "pytorch",
    "PyTorch",
    image="registry.example.edu/composespawner/pytorch",
    gpu=StackBuild(ROOT / "images/pytorch/requirements-gpu.lock", "f" * 64, "sha256:" + "c" * 64),
    env=(("PYTHONHASHSEED", "0"),),
)


@pytest.fixture
def kubeconfig(apiserver: KubeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """KubeSpawner loads the cluster's kubeconfig as a hub does, from $KUBECONFIG.

    The client reads $KUBECONFIG once, when imported: this process imported it already.
    """
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(apiserver.kubeconfig))


async def composed_spawner(
    apiserver: KubeApiServer, machine: ComposedMachine = MACHINE, **config: Any
) -> ComposeKubeSpawner:
    """A spawner that composed ``machine`` on STACK and wrote its run manifest, as start() has."""
    spawner = ComposeKubeSpawner(
        _mock=True,
        namespace="default",
        k8s_api_host=apiserver.url,
        k8s_api_ssl_ca_cert=str(apiserver.ca),
        # KubeSpawner's own knobs, as a university's z2jh config sets them.
        storage_pvc_ensure=True,
        storage_capacity="10Gi",
        storage_class="standard",
        services_enabled=True,
        mem_limit="64G",
        cpu_guarantee=4.0,
        node_affinity_required=[
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
        ],
        volumes=[{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}],
        volume_mounts=[{"name": "home", "mountPath": "/home/jovyan"}],
        **config,
    )
    spawner.machine, spawner.stack = machine, STACK
    await spawner.prepare_launch()
    await spawner.deliver_run_manifest({"version": 1, "machine": {"id": machine.machine_id}})
    return spawner


def assert_valid(manifest: dict[str, Any], since: tuple[int, int]) -> None:
    for version in versions(since):
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{manifest['kind']} invalid for {version}: {e}") from e


@pytest.mark.parametrize("allocation", ["runtime", "dra"])
async def test_every_object_the_launcher_makes_is_valid_for_1_30_and_newer(
    apiserver: KubeApiServer, kubeconfig: None, allocation: str
) -> None:
    spawner = await composed_spawner(apiserver, gpu_allocation=allocation)
    pod = await serialized(await spawner.get_pod_manifest())
    owner = {"apiVersion": "v1", "kind": "Pod", "name": spawner.pod_name, "uid": "u-1"}
    service = await serialized(spawner.get_service_manifest(owner, 8888))
    # KubeSpawner leaves the Service's apiVersion out; the API server takes it from the URL.
    service.setdefault("apiVersion", "v1")
    for manifest in (await serialized(spawner.get_pvc_manifest()), service):
        assert_valid(manifest, OLDEST)
    # A pod that uses a ResourceClaim by name needs 1.31's pod API, and DRA 1.34's.
    assert_valid(pod, OLDEST if allocation == "runtime" else DRA_SINCE)
    container = pod["spec"]["containers"][0]
    assert container["image"] == f"{STACK.image}@{STACK.gpu.digest}"  # type: ignore[union-attr]
    env = {e["name"]: e["value"] for e in container["env"]}
    if allocation == "runtime":
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(f"GPU-{g.uuid}" for g in MACHINE.gpus)
        assert pod["spec"]["runtimeClassName"] == "nvidia"
        assert "resourceClaims" not in pod["spec"]
    else:
        claim = gpu_claim(
            MACHINE,
            name=f"{spawner.pod_name}-gpus",
            namespace="default",
            device_class="gpu.nvidia.com",
            attribute_domain="gpu.nvidia.com",
            labels={"app.kubernetes.io/managed-by": "kubespawner"},
        )
        assert_valid(claim, DRA_SINCE)
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert "runtimeClassName" not in pod["spec"]
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpus", "resourceClaimName": claim["metadata"]["name"]}
        ]
        assert container["resources"]["claims"] == [{"name": "gpus"}]


def test_the_claim_asks_for_exactly_the_composed_gpus_by_uuid() -> None:
    claim = gpu_claim(
        MACHINE,
        name="jupyter-ada-gpus",
        namespace="default",
        device_class="gpu.nvidia.com",
        attribute_domain="gpu.nvidia.com",
        labels={},
    )
    request = claim["spec"]["devices"]["requests"][0]
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["allocationMode"] == "ExactCount"
    assert "capacity" not in request["exactly"]  # a whole GPU's claim takes it all
    uuids = ", ".join(f'"GPU-{g.uuid}"' for g in MACHINE.gpus)
    assert request["exactly"]["selectors"] == [
        {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid in [{uuids}]'}}
    ]


# Two holders of quarters of one A100 (its memory 80 GiB), composed on the same node.
QUARTERS = [
    replace(MACHINE, machine_id=f"m-4{n}", gpus=MACHINE.gpus[:1], drives=(), gpu_share=4)
    for n in (3, 4)
]


async def test_every_share_holders_pod_names_the_same_gpu_and_asks_no_whole_one(
    apiserver: KubeApiServer, kubeconfig: None
) -> None:
    # A z2jh config that asks the device plugin for a GPU on every pod.
    whole_gpu = {"nvidia.com/gpu": "1"}
    pods = [
        await serialized(
            await (
                await composed_spawner(
                    apiserver,
                    machine,
                    extra_resource_limits=whole_gpu,
                    extra_resource_guarantees=whole_gpu,
                )
            ).get_pod_manifest()
        )
        for machine in QUARTERS
    ]
    envs = []
    for pod in pods:
        assert_valid(pod, OLDEST)
        container = pod["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
        assert "nvidia.com/gpu" not in container["resources"].get("requests", {})
        envs.append({e["name"]: e["value"] for e in container["env"]})
        affinity = pod["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": HOSTNAME_LABEL, "operator": "In", "values": ["host-02"]} in terms[0][
            "matchExpressions"
        ]
    gpu = f"GPU-{MACHINE.gpus[0].uuid}"
    assert [e["NVIDIA_VISIBLE_DEVICES"] for e in envs] == [gpu, gpu]
    assert [e["COMPOSE_GPU_SHARE"] for e in envs] == ["1/4", "1/4"]


@pytest.mark.parametrize("quarter", QUARTERS, ids=["one", "another"])
async def test_each_share_holder_has_its_own_claim_on_the_shared_gpu_valid_for_1_34_on(
    apiserver: KubeApiServer, kubeconfig: None, quarter: ComposedMachine
) -> None:
    spawner = await composed_spawner(apiserver, quarter, gpu_allocation="dra")
    pod = await serialized(await spawner.get_pod_manifest())
    assert_valid(pod, DRA_SINCE)
    claim = gpu_claim(
        quarter,
        name=f"{spawner.pod_name}-gpus",
        namespace="default",
        device_class="gpu.nvidia.com",
        attribute_domain="gpu.nvidia.com",
        labels={},
    )
    assert_valid(claim, DRA_SINCE)
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["count"] == 1
    assert exactly["capacity"] == {"requests": {"memory": "20480Mi"}}  # 80 GiB / 4
    assert f'"GPU-{MACHINE.gpus[0].uuid}"' in exactly["selectors"][0]["cel"]["expression"]
    assert kept_share(claim, claim)
    dropped = json.loads(json.dumps(claim))
    del dropped["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    assert not kept_share(claim, dropped)  # a server without consumable capacity


async def test_dra_on_a_cluster_that_does_not_serve_it_says_what_to_do(
    apiserver: KubeApiServer, kubeconfig: None
) -> None:
    spawner = await composed_spawner(apiserver, gpu_allocation="dra")
    with pytest.raises(NotebookNotStarted) as refused:
        await spawner.create_gpu_claim()
    assert "Dynamic Resource Allocation" in str(refused.value)
    assert 'gpu_allocation to "runtime"' in str(refused.value)
    # Nothing was made: 1.20 has no such API, and no pod was created before the claim.
    assert apiserver.request("GET", "/api/v1/namespaces/default/pods").json()["items"] == []


async def test_a_profile_still_applies_but_the_stack_chooses_the_image(
    apiserver: KubeApiServer, kubeconfig: None
) -> None:
    profile = {
        "display_name": "Course default",
        "default": True,
        "kubespawner_override": {"image": "quay.io/jupyter/base-notebook", "mem_limit": "8G"},
    }
    spawner = await composed_spawner(apiserver, profile_list=[profile])
    await spawner.load_user_options()  # as KubeSpawner's start does, after prepare_launch
    pod = await serialized(await spawner.get_pod_manifest())
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == 8 * 1024**3  # the profile's 8G
    assert container["image"] == f"{STACK.image}@{STACK.gpu.digest}"  # type: ignore[union-attr]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["JUPYTER_IMAGE"] == container["image"]
