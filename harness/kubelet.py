"""A process kubelet: the node side of a cluster, for tests against a real kube-apiserver.

No container runtime runs here, so this double stands at the node boundary
only. It registers a Node per name it is given, binds each pending pod that
asks for one of them (``nodeName``, a ``kubernetes.io/hostname`` node selector
or required node affinity), spreads pods that ask for no node over its nodes in
turn (as the scheduler would, without its scoring), and runs the pod's first
container's command as a local process with the pod's environment, on a
loopback address of its own: a wildcard address (``0.0.0.0``) in its arguments
or environment becomes that address, as the pod's own network namespace would
make it. It reports the pod Running, then Ready once the container's port
answers, and Failed (or Succeeded) with the exit code when the process ends; a
pod being deleted has its process stopped (SIGTERM, then SIGKILL after the
grace period) and is then deleted for good. It posts the events a scheduler and
a kubelet would (Scheduled, Started), runs the process as the pod's
``runAsUser`` (when it runs as root), and gives each pod a working folder of
its own as its home.

``python -m harness.kubelet --api URL --token-file F --ca CA --logs DIR NODE...``;
:func:`running_nodes` runs it for a test or a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from harness.hub import wait_for
from harness.kube import KubeApiServer

log = logging.getLogger("kubelet")
HOSTNAME = "kubernetes.io/hostname"
WILDCARD = "0.0.0.0"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wanted_node(pod: dict[str, Any]) -> str | None:
    """The one node a pod asks for by name, if it asks for exactly one."""
    spec = pod["spec"]
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    selected = (spec.get("nodeSelector") or {}).get(HOSTNAME)
    if selected:
        return str(selected)
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in required:
        for expression in term.get("matchExpressions") or []:
            values = expression.get("values") or []
            if (expression.get("key"), expression.get("operator"), len(values)) == (
                HOSTNAME,
                "In",
                1,
            ):
                return str(values[0])
    return None


def run_as(pod: dict[str, Any]) -> tuple[int, int] | None:
    """The (uid, gid) the notebook container asks to run as, if it asks and we may."""
    wanted: dict[str, Any] = {
        **(pod["spec"].get("securityContext") or {}),
        **(pod["spec"]["containers"][0].get("securityContext") or {}),
    }
    uid = wanted.get("runAsUser")
    if uid is None or os.geteuid() != 0:
        return None
    gid = wanted.get("runAsGroup")
    if gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = 0  # as a container runtime does for a uid unknown to the image
    return int(uid), int(gid)


def on_own_address(value: str, address: str) -> str:
    """``value`` with a wildcard bind address made the pod's own."""
    return value.replace(WILDCARD, address)


def readiness(ready: bool) -> list[dict[str, str]]:
    """A pod's Ready and ContainersReady conditions (one container each)."""
    flag = "True" if ready else "False"
    return [
        {"type": kind, "status": flag, "lastTransitionTime": now()}
        for kind in ("Ready", "ContainersReady")
    ]


def container_status(*, ready: bool, state: dict[str, Any]) -> dict[str, Any]:
    """The notebook container's status: a process, not an image, runs it."""
    return {
        "name": "notebook",
        "ready": ready,
        "restartCount": 0,
        "image": "process",
        "imageID": "",
        "started": "running" in state,
        "state": state,
    }


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    address: str
    process: asyncio.subprocess.Process
    deleting: bool = False
    watchers: list[asyncio.Task[None]] = field(default_factory=list)


class Kubelet:
    def __init__(self, api: str, token: str, ca: Path, nodes: list[str], logs: Path) -> None:
        self.api = api.rstrip("/")
        self.token = token
        self.ca = ca
        self.nodes = nodes
        self.logs = logs
        self.pods: dict[str, RunningPod] = {}  # by uid
        self.finished: set[str] = set()  # uids whose process ended: never started again
        self._next_node = 0  # where the next pod that names no node goes
        self._free_addresses = [f"127.0.{n // 250}.{n % 250 + 2}" for n in range(1000)]
        self._session: aiohttp.ClientSession | None = None
        # The pods' working folders, open to the accounts they run as (unlike ``logs``).
        self.workspace = Path(tempfile.mkdtemp(prefix="kubelet-pods-"))
        self.workspace.chmod(0o755)

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    async def run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca))
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.token}"},
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        ) as self._session:
            try:  # however it ends, even while still registering
                for node in self.nodes:
                    await self.register(node)
                log.info("kubelet for %s ready", ", ".join(self.nodes))
                async for pod in self.watch_pods():
                    await self.handle(pod)
            finally:
                for running in list(self.pods.values()):
                    await self.stop_process(running, grace=2)
                shutil.rmtree(self.workspace, ignore_errors=True)

    async def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        async with self.session.request(
            method,
            f"{self.api}{path}",
            json=body,
            timeout=aiohttp.ClientTimeout(total=10),
            **kwargs,
        ) as answer:
            text = await answer.text()
            if answer.status >= 400 and answer.status not in (404, 409):
                raise RuntimeError(f"{method} {path}: {answer.status} {text[:500]}")
            return json.loads(text) if text else None

    async def register(self, node: str) -> None:
        await self.call(
            "POST",
            "/api/v1/nodes",
            {"metadata": {"name": node, "labels": {HOSTNAME: node}}},
        )
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": now(),
                }
            ],
        }
        await self.call(
            "PATCH", f"/api/v1/nodes/{node}/status", {"status": status}, headers=MERGE_PATCH
        )

    async def watch_pods(self) -> AsyncIterator[dict[str, Any]]:
        """Every pod as it is now, then every change, from a list and a watch (listed
        again when the watch ends)."""
        while True:
            listing = await self.call("GET", "/api/v1/pods")
            for pod in listing["items"]:
                yield pod
            version = listing["metadata"]["resourceVersion"]
            url = f"{self.api}/api/v1/pods?watch=1&resourceVersion={version}"
            async with self.session.get(url) as stream:
                async for line in stream.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        break  # too old a version: list again
                    if event["type"] in ("ADDED", "MODIFIED"):
                        yield event["object"]

    async def handle(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        node = spec.get("nodeName") or wanted_node(pod) or self.any_node(pod)
        if node not in self.nodes:
            return
        if meta.get("deletionTimestamp"):
            running = self.pods.get(uid)
            if running is not None and not running.deleting:
                running.deleting = True
                grace = int(meta.get("deletionGracePeriodSeconds") or 0)
                await self.stop_process(running, grace)
            await self.delete_now(meta)
            return
        if not spec.get("nodeName"):
            await self.event(
                pod,
                "Scheduled",
                f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
                component="default-scheduler",
            )
            await self.call(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
            )
            return
        if uid not in self.pods and uid not in self.finished:
            await self.start(pod)

    def any_node(self, pod: dict[str, Any]) -> str | None:
        """A node for a pod that asks for none in particular; None if it asks otherwise."""
        spec = pod["spec"]
        if spec.get("nodeSelector") or (spec.get("affinity") or {}).get("nodeAffinity"):
            return None  # it asks for nodes by labels this kubelet does not judge
        self._next_node = (self._next_node + 1) % len(self.nodes)
        return self.nodes[self._next_node]

    async def start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        address = self._free_addresses.pop(0)
        argv = [
            on_own_address(a, address)
            for a in container.get("command", []) + container.get("args", [])
        ]
        account = run_as(pod)
        home = self.workspace / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}"
        home.mkdir(mode=0o700)
        if account is not None:
            os.chown(home, *account)
        env = {"PATH": os.environ["PATH"], "HOME": str(home)}
        for variable in container.get("env") or []:
            if "value" in variable:
                env[variable["name"]] = on_own_address(variable["value"], address)
        logs = self.logs / f"{meta['namespace']}-{meta['name']}"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            with (logs / "container.log").open("ab") as output:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    cwd=home,  # the image's workingDir is not on this machine
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    user=None if account is None else account[0],
                    group=None if account is None else account[1],
                    extra_groups=None if account is None else [],
                )
        except OSError as e:
            self.finished.add(meta["uid"])
            await self.report_ended(meta, 127, f"cannot run {argv[:1]}: {e}")
            return
        running = RunningPod(meta["uid"], meta["namespace"], meta["name"], address, process)
        self.pods[running.uid] = running
        log.info(
            "pod %s/%s runs as pid %d on %s", running.namespace, running.name, process.pid, address
        )
        await self.event(pod, "Started", f"Started container {container['name']}")
        await self.report(running, ready=False)
        ports = [p["containerPort"] for p in container.get("ports") or []]
        if ports:
            running.watchers.append(asyncio.create_task(self.wait_ready(running, ports[0])))
        else:
            await self.report(running, ready=True)
        running.watchers.append(asyncio.create_task(self.wait_exit(running)))

    async def wait_ready(self, running: RunningPod, port: int) -> None:
        while running.process.returncode is None:
            try:
                _, writer = await asyncio.open_connection(running.address, port)
            except OSError:
                await asyncio.sleep(0.1)  # a readiness probe's period
                continue
            writer.close()
            await self.report(running, ready=True)
            return

    async def wait_exit(self, running: RunningPod) -> None:
        returncode = await running.process.wait()
        code = 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128+N
        self.pods.pop(running.uid, None)
        self.finished.add(running.uid)
        self._free_addresses.append(running.address)
        if not running.deleting:
            log.info("pod %s/%s exited with %d", running.namespace, running.name, code)
            await self.report_ended(
                {"namespace": running.namespace, "name": running.name}, code, "process exited"
            )

    async def report(self, running: RunningPod, *, ready: bool) -> None:
        status = {
            "phase": "Running",
            "podIP": running.address,
            "podIPs": [{"ip": running.address}],
            "hostIP": "127.0.0.1",
            "startTime": now(),
            "conditions": [
                *readiness(ready),
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
            ],
            "containerStatuses": [
                container_status(ready=ready, state={"running": {"startedAt": now()}})
            ],
        }
        await self.patch_status(running.namespace, running.name, status)

    async def report_ended(self, meta: dict[str, Any], code: int, message: str) -> None:
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "message": message,
            "conditions": readiness(False),
            "containerStatuses": [
                container_status(
                    ready=False,
                    state={
                        "terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}
                    },
                )
            ],
        }
        await self.patch_status(meta["namespace"], meta["name"], status)

    async def event(
        self, pod: dict[str, Any], reason: str, message: str, component: str = "kubelet"
    ) -> None:
        """A core/v1 Event about ``pod``, as KubeSpawner shows them on the spawn page."""
        meta = pod["metadata"]
        await self.call(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/events",
            {
                "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}"},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": "Normal",
                "source": {"component": component},
                "firstTimestamp": now(),
                "lastTimestamp": now(),
                "count": 1,
            },
        )

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.call(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": status},
            headers=MERGE_PATCH,
        )

    async def stop_process(self, running: RunningPod, grace: int) -> None:
        process = running.process
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=max(grace, 1))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        for watcher in running.watchers:
            watcher.cancel()

    async def delete_now(self, meta: dict[str, Any]) -> None:
        await self.call(
            "DELETE",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("nodes", nargs="+")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    kubelet = Kubelet(args.api, args.token_file.read_text().strip(), args.ca, args.nodes, args.logs)
    loop = asyncio.new_event_loop()
    task = loop.create_task(kubelet.run())
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(task)
    loop.close()


@contextmanager
def process_kubelet(
    api: str, token: str, ca: Path, nodes: list[str], folder: Path
) -> Iterator[Path]:
    """The kubelet as a process of its own for ``nodes``; yields its log's path."""
    folder.mkdir(parents=True, exist_ok=True)
    token_file = folder / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    log_path = folder / "kubelet.log"
    with log_path.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.kubelet",
                f"--api={api}",
                f"--token-file={token_file}",
                f"--ca={ca}",
                f"--logs={folder}",
                *nodes,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[1],
        )
    try:
        yield log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


if __name__ == "__main__":
    main()


@contextmanager
def running_nodes(api: KubeApiServer, nodes: list[str], folder: Path) -> Iterator[Path]:
    """``nodes`` served by a process kubelet, Ready, with the ``nvidia`` RuntimeClass a GPU
    cluster has; yields the kubelet's log."""
    runtime = {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
    made = api.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", json=runtime)
    if made.status_code not in (201, 409):
        raise RuntimeError(f"RuntimeClass nvidia: {made.status_code} {made.text}")
    with process_kubelet(api.url, api.token, api.ca, nodes, folder) as log:
        wait_for(lambda: api.ready_nodes() >= set(nodes), 60, f"{len(nodes)} nodes to be Ready")
        yield log
