"""The real API server the Kubernetes launcher's tests run against: it serves, validates,
and leaves pods Pending until a kubelet (the tests' own) binds them."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from harness.kube import KubeApiServer

pytestmark = pytest.mark.kubernetes
IMAGE = "quay.io/jupyter/base-notebook"  # never pulled: no kubelet runs images here


async def api(server: KubeApiServer) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(server.kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration)


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "notebook", "image": IMAGE}],
        },
    }


@pytest.mark.timeout(60)
async def test_the_api_server_is_kubernetes_1_20_and_takes_a_pod(apiserver: KubeApiServer) -> None:
    assert apiserver.request("GET", "/version").json()["gitVersion"] == "v1.20.2"
    async with await api(apiserver) as session:
        core = client.CoreV1Api(session)
        created = await core.create_namespaced_pod("default", pod("first"))
        assert created.metadata.uid
        seen = await core.read_namespaced_pod("first", "default")
        # Nothing schedules or runs it: that is the tests' kubelet's job.
        assert (seen.status.phase, seen.spec.node_name) == ("Pending", None)

        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod("default", pod("Not_A_DNS_Name"))
        assert refused.value.status == 422


@pytest.mark.timeout(60)
def test_a_wrong_token_gets_nothing(apiserver: KubeApiServer) -> None:
    stranger = requests.get(
        f"{apiserver.url}/api/v1/namespaces/default/pods",
        headers={"Authorization": "Bearer wrong"},
        verify=str(apiserver.ca),
        timeout=10,
    )
    assert stranger.status_code == 401
    assert apiserver.request("GET", "/api/v1/namespaces/default/pods").status_code == 200
