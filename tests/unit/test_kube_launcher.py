"""The Kubernetes launcher's decisions: which node, which GPUs, which image, what ends a pod."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubespawner.objects import make_pod

from composespawner.domain.catalog import Stack, StackBuild
from composespawner.domain.hardware import Device
from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.kubernetes import (
    Placement,
    StartingPod,
    nvidia_visible_devices,
    pin_to_machine,
    pod_ended_message,
    pod_exit_status,
    pushed_image,
    stack_image,
)
from composespawner.launchers.kubespawner_internals import PodWatch
from harness.kube import serialized
from harness.paths import ROOT

UUID_A = "0f9a3c1e-8b7d-5e6f-a1b2-c3d4e5f60718"
UUID_B = "7c6b5a49-3827-5160-9f8e-7d6c5b4a3928"


def gpu(block: str, uuid: str | None) -> Device:
    return Device(block, "gpu", "NVIDIA A100", frozenset({"r1"}), "c1", "attached", uuid=uuid)


def machine(*gpus: Device) -> ComposedMachine:
    return ComposedMachine("m-7", "host-03", "r1", gpus, None, ())


def a_stack(digest: str = "sha256:" + "ab" * 32) -> Stack:
    build = StackBuild(ROOT / "images/pytorch/requirements-gpu.lock", "f" * 64, digest)
    return Stack("pytorch", "PyTorch", image="composespawner/pytorch", gpu=build)


def kubespawner_pod(**config: Any) -> Any:
    """A pod as KubeSpawner makes it, with some of its own knobs set."""
    return make_pod(
        name="jupyter-ada",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="quay.io/jupyter/base-notebook",
        image_pull_policy="IfNotPresent",
        env={"JUPYTERHUB_USER": "ada"},
        **config,
    )


# -- which GPUs ------------------------------------------------------------------


def test_gpus_are_named_by_uuid_as_the_nvidia_runtime_selects_them() -> None:
    chosen = machine(gpu("g1", UUID_A), gpu("g2", UUID_B))
    assert nvidia_visible_devices(chosen) == f"GPU-{UUID_A},GPU-{UUID_B}"


def test_without_uuids_the_hosts_only_gpus_go_by_index() -> None:
    assert nvidia_visible_devices(machine(gpu("g1", UUID_A), gpu("g2", None))) == "0,1"


def test_a_machine_without_gpus_gets_none_of_the_nodes() -> None:
    assert nvidia_visible_devices(machine()) == "none"


# -- which image -------------------------------------------------------------------


def test_a_stack_runs_from_its_gpu_image_by_digest() -> None:
    assert stack_image(a_stack()) == "composespawner/pytorch@sha256:" + "ab" * 32


def test_a_stack_whose_image_was_never_pushed_has_none() -> None:
    assert stack_image(a_stack(digest="")) is None
    assert stack_image(replace(a_stack(), image="")) is None


def test_an_unpushed_stack_is_refused_with_what_to_do() -> None:
    assert pushed_image(a_stack()) == stack_image(a_stack())
    with pytest.raises(SpawnRefused) as refused:
        pushed_image(a_stack(digest=""))
    assert refused.value.status_code == 503
    assert "has not been pushed" in str(refused.value)


# -- the pod -------------------------------------------------------------------------


async def test_the_pod_is_required_on_the_composed_hosts_node_within_each_configured_term() -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    pool = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
    pod = await serialized(
        pin_to_machine(kubespawner_pod(node_affinity_required=[zone, pool]), Placement("host-03"))
    )
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    pinned = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-03"]}
    # Terms are ORed: each must also require the host, or the other could place it elsewhere.
    assert [t["matchExpressions"] for t in terms["nodeSelectorTerms"]] == [
        [*zone["matchExpressions"], pinned],
        [*pool["matchExpressions"], pinned],
    ]


async def test_a_pod_with_no_affinity_gets_one_term_for_the_host() -> None:
    pod = await serialized(pin_to_machine(kubespawner_pod(), Placement("host-03")))
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-03"]}
                ]
            }
        ]
    }
    assert "runtimeClassName" not in pod["spec"]


async def test_kubespawners_own_volumes_and_resources_are_kept_beside_the_machines() -> None:
    home = {"name": "home", "persistentVolumeClaim": {"claimName": "claim-ada"}}
    mount = {"name": "home", "mountPath": "/home/jovyan"}
    manifest = json.dumps({"machine": {"id": "m-7"}})
    placement = Placement(
        node="host-03",
        runtime_class="nvidia",
        scratch_host_path="/mnt/composespawner/m-7",
        scratch_mount_path="/scratch",
        run_manifest=manifest,
    )
    pod = await serialized(
        pin_to_machine(
            kubespawner_pod(
                volumes=[home], volume_mounts=[mount], mem_limit="32G", cpu_guarantee=2.0
            ),
            placement,
        )
    )
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert spec["runtimeClassName"] == "nvidia"
    assert [v["name"] for v in spec["volumes"]] == [
        "home",
        "composespawner-scratch",
        "composespawner-run",
    ]
    assert spec["volumes"][1]["hostPath"] == {
        "path": "/mnt/composespawner/m-7",
        "type": "Directory",
    }
    assert spec["volumes"][2]["downwardAPI"]["items"] == [
        {
            "path": "run.json",
            "fieldRef": {"fieldPath": "metadata.annotations['composespawner.io/run-manifest']"},
            "mode": 0o444,
        }
    ]
    assert container["volumeMounts"] == [
        mount,
        {"name": "composespawner-scratch", "mountPath": "/scratch"},
        {"name": "composespawner-run", "mountPath": "/etc/composespawner", "readOnly": True},
    ]
    assert container["resources"]["limits"]["memory"] == "32G"
    assert pod["metadata"]["annotations"]["composespawner.io/run-manifest"] == manifest


# -- what ends a pod -------------------------------------------------------------------


def a_pod(phase: str, **state: Any) -> dict[str, Any]:
    statuses = [{"name": "notebook", "state": state}] if state else []
    return {
        "metadata": {"name": "jupyter-ada"},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


@pytest.mark.parametrize(
    ("pod", "status"),
    [
        (a_pod("Pending"), None),
        (a_pod("Running", running={}), None),
        (a_pod("Running", terminated={"exitCode": 137}), 137),
        (a_pod("Failed", terminated={"exitCode": 3}), 3),
        (a_pod("Succeeded", terminated={"exitCode": 0}), 0),
        ({"metadata": {}, "status": {"phase": "Failed", "reason": "Evicted"}}, 1),
        ({"metadata": {"deletionTimestamp": "2026-11-24T12:00:00Z"}, "status": {}}, 1),
        (None, 1),
    ],
)
def test_a_pod_has_ended_when_it_is_gone_failed_evicted_or_its_notebook_exited(
    pod: dict[str, Any] | None, status: int | None
) -> None:
    assert pod_exit_status(pod) == status


def test_a_pod_that_ended_early_is_explained_with_what_to_do() -> None:
    evicted = {
        "metadata": {"name": "jupyter-ada"},
        "status": {"phase": "Failed", "reason": "Evicted"},
    }
    message = pod_ended_message(evicted, 1)
    assert "exit code 1 (Evicted)" in message
    assert "jupyter-ada" in message
    assert "Start it again" in message


async def test_the_pod_watch_tells_each_change_as_it_arrives() -> None:
    watch = PodWatch(namespace="default")
    seen: list[Any] = []
    watch.watch("default/jupyter-ada", seen.append)
    # A full listing, then the watch's changes, as ResourceReflector makes them.
    watch.resources = {"default/jupyter-ada": a_pod("Pending"), "default/other": a_pod("Pending")}
    watch.resources["default/jupyter-ada"] = a_pod("Running", running={})
    watch.resources["default/other"] = a_pod("Failed")
    watch.resources.pop("default/jupyter-ada", None)
    assert [pod and pod["status"]["phase"] for pod in seen] == ["Pending", "Running", None]
    watch.resources = {}
    watch.unwatch("default/jupyter-ada", seen.append)
    watch.resources = {"default/jupyter-ada": a_pod("Failed")}
    assert len(seen) == 3  # nobody listens any more


def ready_pod(uid: str) -> dict[str, Any]:
    pod = a_pod("Running", running={})
    pod["metadata"]["uid"] = uid
    pod["status"]["containerStatuses"][0]["ready"] = True
    return pod


async def test_a_starting_pod_is_ready_or_ended_whichever_the_watch_sees_first() -> None:
    def ready(pod: dict[str, Any]) -> bool:
        return bool(pod["status"]["containerStatuses"][0].get("ready"))

    starting = StartingPod(ready_pod("old"), ready)
    starting(ready_pod("old"))  # the earlier start's pod, which KubeSpawner replaces
    starting(None)  # and its deletion
    assert not starting.ready.done()
    assert not starting.ended.done()
    starting(ready_pod("new"))
    assert starting.ready.result()["metadata"]["uid"] == "new"
    starting({**a_pod("Failed", terminated={"exitCode": 3}), "metadata": {"uid": "new"}})
    assert not starting.ended.done()  # it was ready first: the end is the pod watch's to tell

    failing = StartingPod(None, ready)
    failing({**a_pod("Failed", terminated={"exitCode": 3}), "metadata": {"uid": "x"}})
    assert failing.ended.result()[0] == 3
    assert not failing.ready.done()
