"""The Kubernetes launcher: the notebook runs as a pod on the composed host's node.

KubeSpawner builds and runs the pod, with all of its own knobs (storage,
profiles, resources, hooks); this launcher adds what the composed machine
decides, in :func:`pin_to_machine`:

- the pod is pinned to the composed host's node (required node affinity on
  ``kubernetes.io/hostname``, ANDed into every term already configured);
- the pod requests exactly the machine's share of its host's cores and memory,
  and is limited to it (Guaranteed), in place of KubeSpawner's own resources;
- the composed GPUs, and only those, are given to the container the way the
  NVIDIA container runtime selects devices: ``NVIDIA_VISIBLE_DEVICES`` with
  their UUIDs (``GPU-<uuid>``) where the fabric reports them, else their
  indexes on the host in attach order, and the runtime's RuntimeClass; or,
  with ``gpu_allocation = "dra"``, through a ResourceClaim (:mod:`.dra`);
- a GPU share's pod (``gpu_share`` n > 1) is given its GPU the same way, by the same
  UUID as every other holder's pod on the node (time-slicing), and requests no
  ``nvidia.com/gpu``: the device plugin's count would let one holder's pod take the
  node's GPU whole and leave the others unschedulable (nor does a whole GPU's pod ask
  it for one: the plugin would choose a GPU of its own, not the composed one);
- the composed NVMe scratch, which the node mounts for the machine, is mounted
  into the container;
- the chosen stack runs from its GPU image, pinned by digest;
- the run manifest travels as an annotation of the pod and is mounted
  read-only into the container through the downward API: no other object to
  create or clean up, and it lives exactly as long as the pod.

KubeSpawner's pod watch tells the mixin at once when the pod fails, is evicted
or disappears (:class:`~composespawner.launchers.kubespawner_internals.PodWatch`),
so devices go back within moments, not at the hub's next poll. What that takes
of KubeSpawner's internals is in :mod:`.kubespawner_internals`, and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import (
    V1Affinity,
    V1Container,
    V1DownwardAPIVolumeFile,
    V1DownwardAPIVolumeSource,
    V1HostPathVolumeSource,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectFieldSelector,
    V1Pod,
    V1ResourceRequirements,
    V1Volume,
    V1VolumeMount,
)
from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner import KubeSpawner
from traitlets import CaselessStrEnum, Unicode, default

from composespawner.domain.catalog import Kit, Stack
from composespawner.domain.hardware import Share
from composespawner.domain.machine import ComposedMachine, nvidia_visible_devices
from composespawner.launchers.base import Launcher, SpawnRefused
from composespawner.launchers.dra import NoDeviceIds, gpu_claim, kept_share, use_claim
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.kubespawner_internals import (
    PodCallback,
    PodWatchingKubeSpawner,
    kube_api,
)

HOSTNAME_LABEL = "kubernetes.io/hostname"
NOTEBOOK_CONTAINER = "notebook"  # KubeSpawner's name for the notebook's container
RUN_MANIFEST_ANNOTATION = "composespawner.io/run-manifest"
RUN_MANIFEST_DIR = "/etc/composespawner"
RUN_MANIFEST_FILE = "run.json"
RUN_MANIFEST_PATH = f"{RUN_MANIFEST_DIR}/{RUN_MANIFEST_FILE}"
RUN_MANIFEST_VOLUME = "composespawner-run"
SCRATCH_VOLUME = "composespawner-scratch"
ENDED_PHASES = ("Failed", "Succeeded")
DEVICE_PLUGIN_GPU = "nvidia.com/gpu"  # the NVIDIA device plugin's extended resource


@dataclass(frozen=True, slots=True)
class Placement:
    """What a composed machine decides about its notebook's pod."""

    node: str
    runtime_class: str = ""  # "" leaves the node's default runtime
    scratch_host_path: str = ""  # "" when no scratch drive was composed
    scratch_mount_path: str = ""
    run_manifest: str = ""  # JSON text, "" for none
    gpu_claim: str = ""  # the ResourceClaim that gives the GPUs (DRA), "" for none
    share: Share | None = None  # the machine's share of its host: the pod's resources
    gpu_share: int = 1  # n > 1: it holds 1/n of its GPU beside the other holders' pods


def stack_image(stack: Stack) -> str | None:
    """The stack's GPU image pinned by digest, or None while none has been pushed."""
    if not stack.image or stack.gpu is None or not stack.gpu.digest:
        return None
    return f"{stack.image}@{stack.gpu.digest}"


def pushed_image(stack: Stack) -> str:
    """:func:`stack_image`, or a refusal that says what to do when there is none."""
    image = stack_image(stack)
    if image is None:
        raise SpawnRefused(
            f"The {stack.label} stack cannot run on this cluster yet: its GPU image"
            " has not been pushed. Choose another stack, or ask the admins to publish"
            " it (its digest goes in the catalog).",
            reason="stack",
            status_code=503,
        )
    return image


def pin_to_machine(pod: V1Pod, placement: Placement) -> V1Pod:
    """``pod`` (KubeSpawner's manifest) changed to run on the composed machine."""
    spec = pod.spec
    _require_node(spec, placement.node)
    container = next(c for c in spec.containers if c.name == NOTEBOOK_CONTAINER)
    if placement.share is not None:
        hold_to_share(container, placement.share)
    if placement.gpu_share > 1:
        ask_no_whole_gpu(container)
    if placement.runtime_class:
        spec.runtime_class_name = placement.runtime_class
    if placement.gpu_claim:
        use_claim(pod, placement.gpu_claim, NOTEBOOK_CONTAINER)
    spec.volumes = list(spec.volumes or [])
    container.volume_mounts = list(container.volume_mounts or [])
    if placement.scratch_host_path:
        spec.volumes.append(
            V1Volume(
                name=SCRATCH_VOLUME,
                host_path=V1HostPathVolumeSource(
                    path=placement.scratch_host_path, type="Directory"
                ),
            )
        )
        container.volume_mounts.append(
            V1VolumeMount(name=SCRATCH_VOLUME, mount_path=placement.scratch_mount_path)
        )
    if placement.run_manifest:
        pod.metadata.annotations = {
            **(pod.metadata.annotations or {}),
            RUN_MANIFEST_ANNOTATION: placement.run_manifest,
        }
        field = f"metadata.annotations['{RUN_MANIFEST_ANNOTATION}']"
        spec.volumes.append(
            V1Volume(
                name=RUN_MANIFEST_VOLUME,
                downward_api=V1DownwardAPIVolumeSource(
                    items=[
                        V1DownwardAPIVolumeFile(
                            path=RUN_MANIFEST_FILE,
                            field_ref=V1ObjectFieldSelector(field_path=field),
                            mode=0o444,
                        )
                    ]
                ),
            )
        )
        container.volume_mounts.append(
            V1VolumeMount(name=RUN_MANIFEST_VOLUME, mount_path=RUN_MANIFEST_DIR, read_only=True)
        )
    return pod


def share_resources(share: Share) -> dict[str, str]:
    """A share as Kubernetes quantities: whole cores, memory in GiB."""
    return {"cpu": str(share.cores), "memory": f"{share.memory_gib}Gi"}


def hold_to_share(container: V1Container, share: Share) -> None:
    """The notebook container requests exactly its share and is limited to it.

    Requests equal to limits make the pod Guaranteed (its containers all so:
    KubeSpawner's extra or init containers with resources of their own leave
    it Burstable), so the kubelet never evicts it for a neighbour's use, and a
    static CPU manager gives it whole cores. The share replaces KubeSpawner's
    cpu_guarantee/limit and mem_guarantee/limit for this pod; other resources
    (ephemeral storage, extended resources, a DRA claim) stay as they were.
    """
    resources = container.resources or V1ResourceRequirements()
    amounts = share_resources(share)
    resources.requests = {**(resources.requests or {}), **amounts}
    resources.limits = {**(resources.limits or {}), **amounts}
    container.resources = resources


def ask_no_whole_gpu(container: V1Container) -> None:
    """A share-holder's container without the device plugin's ``nvidia.com/gpu`` (which a
    config's ``extra_resource_limits`` may add): each one is a whole GPU to the scheduler,
    so the second holder's pod on a one-GPU node would never schedule."""
    resources = container.resources
    if resources is None:
        return
    for amounts in ("requests", "limits"):
        held = getattr(resources, amounts)
        if held and DEVICE_PLUGIN_GPU in held:
            setattr(resources, amounts, {k: v for k, v in held.items() if k != DEVICE_PLUGIN_GPU})


def _require_node(spec: Any, node: str) -> None:
    """Require ``node`` in every node selector term (terms are ORed, expressions ANDed)."""
    pinned = V1NodeSelectorRequirement(key=HOSTNAME_LABEL, operator="In", values=[node])
    spec.affinity = spec.affinity or V1Affinity()
    affinity = spec.affinity.node_affinity = spec.affinity.node_affinity or V1NodeAffinity()
    required = affinity.required_during_scheduling_ignored_during_execution
    if required is None or not required.node_selector_terms:
        required = V1NodeSelector(node_selector_terms=[V1NodeSelectorTerm()])
        affinity.required_during_scheduling_ignored_during_execution = required
    for term in required.node_selector_terms:
        term.match_expressions = [*(term.match_expressions or []), pinned]


def pod_exit_status(pod: Mapping[str, Any] | None) -> int | None:
    """The notebook's exit status if its pod has ended (gone, failed, evicted), else None.

    As KubeSpawner's poll reads it: the notebook container's exit code, else 1.
    """
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return 1
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        if container.get("name") == NOTEBOOK_CONTAINER:
            terminated = (container.get("state") or {}).get("terminated")
            if terminated is not None:
                return int(terminated.get("exitCode", 1))
    return 1 if status.get("phase") in ENDED_PHASES else None


def pod_ended_message(pod: Mapping[str, Any], status: int) -> str:
    """What the user is told of a pod that ended before its notebook was ready."""
    why = (pod.get("status") or {}).get("reason") or (pod.get("status") or {}).get("message")
    because = f" ({why})" if why else ""
    return (
        f"Your notebook's pod ended before it was ready, with exit code {status}{because}."
        " Its devices were given back. Start it again; if it fails again, tell the admins"
        f" the pod's name, {pod['metadata']['name']}."
    )


class NotebookNotStarted(Exception):
    """The notebook could not be started on the cluster; the message says what to do."""


class StartingPod:
    """What the pod watch says of a pod being started: ready, or ended first.

    A pod of an earlier start (``stale``, which KubeSpawner replaces) is ignored.
    """

    def __init__(
        self, stale: Mapping[str, Any] | None, is_ready: Callable[[dict[str, Any]], bool]
    ) -> None:
        self._stale_uid = stale["metadata"].get("uid") if stale else None
        self._is_ready = is_ready
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.Future()
        self.ended: asyncio.Future[tuple[int, dict[str, Any]]] = asyncio.Future()

    def __call__(self, pod: dict[str, Any] | None) -> None:
        if pod is None or pod["metadata"].get("uid") == self._stale_uid:
            return
        if self.ready.done() or self.ended.done():
            return
        status = pod_exit_status(pod)
        if status is not None:
            self.ended.set_result((status, pod))
        elif self._is_ready(pod):
            self.ready.set_result(pod)


class KubeLauncher(Launcher, PodWatchingKubeSpawner):
    """Run the notebook as a pod on the composed host's node; say at once when it ends."""

    node_name_template = Unicode(
        "{host}",
        config=True,
        help="""The Kubernetes node name of a composed host, from its Redfish
        ComputerSystem Id as ``{host}``. The pod is required to run there.""",
    )
    gpu_runtime_class = Unicode(
        "nvidia",
        config=True,
        help="""The RuntimeClass of pods given GPUs: the NVIDIA container runtime, which
        gives the container the devices NVIDIA_VISIBLE_DEVICES names. Empty: the node's
        default runtime (when that is already the NVIDIA runtime).""",
    )
    gpu_allocation = CaselessStrEnum(
        ["runtime", "dra"],
        "runtime",
        config=True,
        help="""How the pod is given its composed GPUs. ``runtime``: NVIDIA_VISIBLE_DEVICES
        and ``gpu_runtime_class``, which any cluster with the NVIDIA container runtime
        serves. ``dra``: a resource.k8s.io/v1 ResourceClaim for exactly those GPUs, by
        UUID (Kubernetes 1.34 or newer with a DRA driver for them).""",
    )
    dra_device_class = Unicode(
        "gpu.nvidia.com",
        config=True,
        help="""With gpu_allocation = "dra": the DeviceClass the GPUs' DRA driver installs.""",
    )
    dra_attribute_domain = Unicode(
        "gpu.nvidia.com",
        config=True,
        help="""With gpu_allocation = "dra": the domain of the ``uuid`` device attribute the
        driver publishes, which the claim selects the composed GPUs by.""",
    )
    dra_share_capacity = Unicode(
        "memory",
        config=True,
        help="""With gpu_allocation = "dra", for GPU shares: the device capacity a share's
        claim asks 1/n of (the GPU's memory as the fabric reports it, in MiB rounded down).
        Change it where the driver publishes another name for the GPU's memory. Shares need
        DRA consumable capacity (Kubernetes 1.36, or 1.34-1.35 with DRAConsumableCapacity)
        and a driver that publishes the GPU with allowMultipleAllocations.""",
    )
    scratch_host_path_template = Unicode(
        "/mnt/composespawner/{machine_id}",
        config=True,
        help="""Where the node mounts a machine's composed NVMe scratch
        (``{machine_id}``, ``{host}``): mounted into the notebook's container at
        ``scratch_mount_path``.""",
    )
    scratch_mount_path = Unicode(
        "/scratch",
        config=True,
        help="""Where the notebook finds its composed NVMe scratch ($COMPOSE_SCRATCH).""",
    )

    stack_variant = "gpu"
    machine: ComposedMachine | None = None  # the mixin's; set before start

    _run_manifest_text = ""
    _pod_watched: PodCallback | None = None  # what the pod watch calls for this server

    @default("automount_service_account_token")
    def _no_service_account_token(self) -> bool:
        # A notebook has no business with the cluster's API.
        return False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._configured_image: str = self.image

    # -- the stack and the kit ---------------------------------------------------

    def check_stack(self, stack: Stack) -> None:
        pushed_image(stack)

    def check_kit(self, kit: Kit) -> None:
        # A kit is merged into the home by the hub; here the home is the pod's volume,
        # which the hub does not mount.
        raise SpawnRefused(
            f"Starter kits cannot be put in your home on this cluster yet, so the {kit.label}"
            " kit was not started and nothing was claimed. Start without a kit (choose its"
            f" stack, {kit.stack}, yourself), or ask the admins for the kit's files.",
            reason="kit",
            status_code=400,
        )

    async def prepare_launch(self) -> None:
        # As configured, for KubeSpawner's profiles to change; the stack's wins at the pod.
        self.image = self._configured_image

    # -- the pod ---------------------------------------------------------------

    async def deliver_run_manifest(self, manifest: dict[str, Any]) -> str | None:
        self._run_manifest_text = json.dumps(manifest, sort_keys=True)
        return RUN_MANIFEST_PATH

    def launcher_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.machine is not None:
            if not self._uses_claim:
                env["NVIDIA_VISIBLE_DEVICES"] = nvidia_visible_devices(self.machine)
            if self.machine.drives:
                env["COMPOSE_SCRATCH"] = self.scratch_mount_path
        if self.stack is not None and self.stack.gpu is not None:
            env["COMPOSE_STACK_LOCK_SHA256"] = self.stack.gpu.lock_sha256
        if self._run_manifest_text:
            env["COMPOSE_RUN_MANIFEST"] = RUN_MANIFEST_PATH
        return env

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        env.update(self.launcher_env())
        return env

    def placement(self, machine: ComposedMachine) -> Placement:
        fields = {"machine_id": machine.machine_id, "host": machine.host}
        return Placement(
            node=self.node_name_template.format(**fields),
            runtime_class=self.gpu_runtime_class if machine.gpus and not self._uses_claim else "",
            gpu_claim=self._claim_name if self._uses_claim else "",
            scratch_host_path=(
                self.scratch_host_path_template.format(**fields) if machine.drives else ""
            ),
            scratch_mount_path=self.scratch_mount_path,
            run_manifest=self._run_manifest_text,
            share=self.share,
            gpu_share=machine.gpu_share,
        )

    async def get_pod_manifest(self) -> V1Pod:
        """KubeSpawner's pod (its profile applied by now), on the stack and the machine."""
        if self.stack is not None:
            self.image = pushed_image(self.stack)  # before: JUPYTER_IMAGE in the env says it
        pod: V1Pod = await super().get_pod_manifest()
        if self.machine is None:  # nothing composed: nothing to pin (not one of our starts)
            return pod
        return pin_to_machine(pod, self.placement(self.machine))

    # -- starting, and the pod's end -------------------------------------------

    async def start(self) -> Any:
        """KubeSpawner's start, ended as soon as the pod watch sees its pod ready or ended.

        KubeSpawner alone looks for readiness with exponential backoff (up to 5 s
        between looks), and waits out ``start_timeout`` for a pod that has failed.
        """
        self._unwatch_pod()
        reflector = await self.pod_watch()
        key = self._pod_key
        starting = StartingPod(reflector.pods.get(key), self.is_pod_running)
        reflector.watch(key, starting)
        try:
            await self.create_gpu_claim()
            url = await self._start_pod(starting)
        except BaseException:
            await self.delete_gpu_claim()  # the hub deletes the pod (stop); nothing holds it
            raise
        finally:
            reflector.unwatch(key, starting)
        await self._watch_pod()
        return url

    async def _start_pod(self, starting: StartingPod) -> str:
        started = super().start()  # KubeSpawner's: the future its progress() follows
        relay = asyncio.ensure_future(self._relay_pod_events())
        # Once the pod is created KubeSpawner only waits, unless it has more to make.
        after_creating = self.internal_ssl or self.services_enabled or self.after_pod_created_hook
        watched = [starting.ended] if after_creating else [starting.ended, starting.ready]
        try:
            done, _ = await asyncio.wait([started, *watched], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the hub gave up on this start
            started.cancel()
            raise
        finally:
            relay.cancel()
        if started in done:
            url: str = started.result()
            return url
        started.cancel()
        if starting.ended.done():
            status, pod = starting.ended.result()
            raise NotebookNotStarted(pod_ended_message(pod, status))
        return self.take_ready_pod(starting.ready.result())

    async def _relay_pod_events(self) -> None:
        """KubeSpawner's progress (the pod's events) on the spawn page, beside ours."""
        async for event in KubeSpawner.progress(self):
            self.launch_progress(event["message"], int(event.get("progress") or 0))

    async def stop(self, now: bool = False) -> None:
        self._unwatch_pod()
        await super().stop(now=now)
        await self.delete_gpu_claim()

    async def poll(self) -> int | None:
        status: int | None = await super().poll()
        if status is None and self.machine is not None and self._pod_watched is None:
            await self._watch_pod()  # after a hub restart: the server's pod, found again
        return status

    # -- the GPUs' ResourceClaim (gpu_allocation = "dra") ----------------------

    @property
    def _uses_claim(self) -> bool:
        return self.gpu_allocation == "dra" and self.machine is not None and bool(self.machine.gpus)

    @property
    def _claim_name(self) -> str:
        return f"{self.pod_name}-gpus"

    async def create_gpu_claim(self) -> None:
        """Create the claim before the pod that uses it (a leftover of this pod's goes first)."""
        if not self._uses_claim:
            return
        assert self.machine is not None
        try:
            claim = gpu_claim(
                self.machine,
                name=self._claim_name,
                namespace=self.namespace,
                device_class=self.dra_device_class,
                attribute_domain=self.dra_attribute_domain,
                labels=self.object_labels(),
                share_capacity=self.dra_share_capacity,
            )
        except NoDeviceIds as e:
            raise NotebookNotStarted(
                f"Your GPUs cannot be given to the notebook: {e}. Tell the admins."
            ) from e
        await self.delete_gpu_claim()
        api = kube_api("ResourceV1Api")
        try:
            created = await api.create_namespaced_resource_claim(
                self.namespace, claim, _request_timeout=self.k8s_api_request_timeout
            )
        except ApiException as e:
            if e.status == 404:
                self.log.error(
                    "%s: the cluster does not serve %s: %s",
                    log_name(self),
                    claim["apiVersion"],
                    e.reason,
                )
                raise NotebookNotStarted(
                    "This cluster cannot give GPUs through Dynamic Resource Allocation"
                    " (resource.k8s.io/v1, Kubernetes 1.34 or newer). Your devices were given"
                    ' back. Tell the admins: they set gpu_allocation to "runtime" or upgrade.'
                ) from e
            raise
        if not kept_share(claim, api.api_client.sanitize_for_serialization(created)):
            await self.delete_gpu_claim()  # it would wait for the whole GPU for ever
            raise NotebookNotStarted(
                "This cluster cannot give a share of a GPU through Dynamic Resource"
                " Allocation: it does not serve consumable capacity (Kubernetes 1.36, or"
                " DRAConsumableCapacity from 1.34). Your devices were given back. Start with"
                ' a whole GPU, or tell the admins: they set gpu_allocation to "runtime".'
            )

    async def delete_gpu_claim(self) -> None:
        if self.gpu_allocation != "dra":
            return
        try:
            await kube_api("ResourceV1Api").delete_namespaced_resource_claim(
                self._claim_name, self.namespace, _request_timeout=self.k8s_api_request_timeout
            )
        except ApiException as e:
            if e.status != 404:  # none to delete (or no DRA at all): fine
                raise

    @property
    def _pod_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    async def _watch_pod(self) -> None:
        reflector = await self.pod_watch()
        key = self._pod_key

        def changed(pod: dict[str, Any] | None) -> None:
            status = pod_exit_status(pod)
            if status is None:
                return
            self._unwatch_pod()
            self.log.info("%s: pod %s ended (status %s)", log_name(self), key, status)
            self._exit_seen = asyncio.ensure_future(self.notebook_exited(status))

        reflector.watch(key, changed)
        self._pod_watched = changed
        changed(reflector.pods.get(key))  # it may have ended before we looked

    def _unwatch_pod(self) -> None:
        callback, self._pod_watched = self._pod_watched, None
        reflector = self.running_pod_watch
        if callback is not None and reflector is not None:
            reflector.unwatch(self._pod_key, callback)
