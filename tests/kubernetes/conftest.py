from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.kube import KubeApiServer, kube_apiserver


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    with kube_apiserver(tmp_path_factory.mktemp("kube")) as server:
        yield server
