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
    """The fabric did not report the UUIDs a claim selects devices by."""


def gpu_claim(
    machine: ComposedMachine,
    *,
    name: str,
    namespace: str,
    device_class: str,
    attribute_domain: str,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The ResourceClaim for exactly ``machine``'s GPUs, selected by UUID.

    ``device_class`` is the DeviceClass the DRA driver installs (``gpu.nvidia.com``
    for NVIDIA's); ``attribute_domain`` the domain of the ``uuid`` attribute its
    ResourceSlices publish (``device.attributes["gpu.nvidia.com"].uuid``).
    """
    missing = [gpu.block_id for gpu in machine.gpus if not gpu.uuid]
    if missing:
        raise NoDeviceIds(
            f"the fabric reports no UUID for {', '.join(missing)}: a claim cannot name them"
        )
    uuids = [f"GPU-{gpu.uuid}" for gpu in machine.gpus]
    # A JSON list of strings is a CEL list literal.
    selector = f"device.attributes[{json.dumps(attribute_domain)}].uuid in {json.dumps(uuids)}"
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": REQUEST,
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": len(uuids),
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


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
