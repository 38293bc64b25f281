"""Dynamic Resource Allocation: the composed GPUs as a ``resource.k8s.io/v1`` ResourceClaim.

DRA (GA in Kubernetes 1.34) is how a cluster hands devices to pods once a
driver publishes them as ResourceSlices; composable fabrics join it through a
driver that attaches devices on demand and holds the pod until they are there
(KEP-5007 binding conditions; the CoHDI composable DRA driver). Here the
machine is composed before the pod exists, so the claim asks for exactly the
devices already attached, by UUID, and the pod is pinned to their host: the
scheduler's allocation can only confirm what the fabric did.

With ``c.ComposeKubeSpawner.gpu_allocation = "dra"`` the launcher creates this
claim before the pod, and the pod's notebook container uses it instead of
``NVIDIA_VISIBLE_DEVICES`` and a RuntimeClass: the driver gives the container
its devices (through CDI).

A GPU share (``gpu_share`` n > 1: several machines hold one GPU, time-sliced) is one
claim per pod too, each on the same device with 1/n of its ``share_capacity``
(memory, by default): DRA's consumable capacity (KEP-5075, ``capacity.requests`` in
``resource.k8s.io/v1``; alpha in 1.34-1.35 behind ``DRAConsumableCapacity``, beta and
on from 1.36), for a driver that publishes the GPU with ``allowMultipleAllocations``.
Not the other ways DRA shares a device: one claim that every holder's pod names
would outlive any one holder and need a keeper to delete it after the last, which
the launcher is not (each pod's claim goes with its pod, as a whole GPU's does);
``adminAccess`` is for monitoring a device in use, not for using it (and needs an
admin-labelled namespace). An API server without the gate drops the field, and the
claim would then want the whole GPU: :func:`kept_share` tells.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import CoreV1ResourceClaim, V1Pod, V1PodResourceClaim

from composespawner.domain.machine import ComposedMachine

API_VERSION = "resource.k8s.io/v1"
REQUEST = "gpus"  # the claim's one request, and the name the pod knows it by


class NoDeviceIds(ValueError):
    """The fabric did not report what a claim selects devices by (UUIDs; a share's memory)."""


def gpu_claim(
    machine: ComposedMachine,
    *,
    name: str,
    namespace: str,
    device_class: str,
    attribute_domain: str,
    labels: Mapping[str, str],
    share_capacity: str = "memory",
) -> dict[str, Any]:
    """The ResourceClaim for exactly ``machine``'s GPUs, selected by UUID.

    ``device_class`` is the DeviceClass the DRA driver installs (``gpu.nvidia.com``
    for NVIDIA's); ``attribute_domain`` the domain of the ``uuid`` attribute its
    ResourceSlices publish (``device.attributes["gpu.nvidia.com"].uuid``). A share's
    claim asks for its part of the device's ``share_capacity`` (see the module's note).
    """
    missing = [gpu.block_id for gpu in machine.gpus if not gpu.uuid]
    if missing:
        raise NoDeviceIds(
            f"the fabric reports no UUID for {', '.join(missing)}: a claim cannot name them"
            ' (gpu_allocation = "dra" needs GPU UUIDs from the fabric)'
        )
    uuids = [f"GPU-{gpu.uuid}" for gpu in machine.gpus]
    # A JSON list of strings is a CEL list literal.
    selector = f"device.attributes[{json.dumps(attribute_domain)}].uuid in {json.dumps(uuids)}"
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": len(uuids),
        "selectors": [{"cel": {"expression": selector}}],
    }
    if machine.gpu_share > 1:
        exactly["capacity"] = {"requests": {share_capacity: share_quantity(machine)}}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}},
    }


def share_quantity(machine: ComposedMachine) -> str:
    """A share's part of its GPU's memory, in whole MiB rounded down: n holders fit."""
    (gpu,) = machine.gpus  # a share is of exactly one GPU
    if not gpu.memory_gib:
        raise NoDeviceIds(
            f"the fabric reports no memory for {gpu.block_id}: a share's claim cannot say"
            f" its part (1/{machine.gpu_share}) of it"
        )
    return f"{gpu.memory_gib * 1024 // machine.gpu_share}Mi"


def kept_share(sent: Mapping[str, Any], created: Mapping[str, Any]) -> bool:
    """Whether the API server kept a share's capacity request (``created``, the claim it
    answered with, as JSON), or dropped it as a server without consumable capacity does."""
    asked = sent["spec"]["devices"]["requests"][0]["exactly"].get("capacity")
    if asked is None:  # whole GPUs: nothing to keep
        return True
    requests = ((created.get("spec") or {}).get("devices") or {}).get("requests") or [{}]
    return bool((requests[0].get("exactly") or {}).get("capacity"))


def use_claim(pod: V1Pod, claim_name: str, container_name: str) -> V1Pod:
    """``pod`` with its ``container_name`` container given the claim's devices."""
    pod.spec.resource_claims = [
        *(pod.spec.resource_claims or []),
        V1PodResourceClaim(name=REQUEST, resource_claim_name=claim_name),
    ]
    container = next(c for c in pod.spec.containers if c.name == container_name)
    resources = container.resources
    resources.claims = [*(resources.claims or []), CoreV1ResourceClaim(name=REQUEST)]
    return pod
