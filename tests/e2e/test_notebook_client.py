"""``composespawner.client`` inside a real notebook: its machine and quota, grown and shrunk.

The code runs in a real kernel of the user's notebook server (started through
Jupyter Server's API, as JupyterLab does), with the notebook's own token; the
fabric simulator's Redfish tree says what is attached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from harness.hub import (
    PORTAL,
    Hub,
    notebook_pid,
    process_env,
    running_hub,
    wait_for_portal,
)
from tests.e2e.test_portal import Visitor
from tests.support.kernel import Executed, run_in_kernel

pytestmark = [pytest.mark.e2e]

ONE_T4 = {"gpu_model": "t4", "gpu_count": 1}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("client")) as hub:
        wait_for_portal(hub)
        yield hub


@pytest.fixture
def running(hub: Hub) -> Iterator[str]:
    """student1's default server with one T4; its host."""
    hub.spawn("student1", ONE_T4).raise_for_status()
    hub.wait_ready("student1")
    try:
        yield hub.server_host("student1")
    finally:
        hub.stop("student1")
    assert hub.composed_hosts() == {}


def in_notebook(hub: Hub, user: str, code: str) -> Executed:
    token = process_env(notebook_pid(hub, user))["JUPYTERHUB_API_TOKEN"]
    return run_in_kernel(f"{hub.url}/user/{user}/", token, code)


def printed(hub: Hub, code: str) -> Any:
    """What the code's last line printed, as JSON; the kernel's traceback if it raised."""
    done = in_notebook(hub, "student1", "import json\nfrom composespawner import client\n" + code)
    assert done.error is None, done.error
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
def test_a_notebook_reads_its_machine_and_quota_grows_and_shrinks(hub: Hub, running: str) -> None:
    host = running
    mine = printed(
        hub,
        "m = client.machine()\n"
        "print(json.dumps({'host': m.host, 'gpus': [g.id for g in m.gpus],"
        " 'left': client.quota_left(), 'hours': client.use()['gpu_hours_week']}))",
    )
    assert mine["host"] == host
    assert mine["gpus"] == hub.attached(host)
    assert mine["left"]["gpus"] == 3  # the demo's site default: 4 GPUs held at once
    assert mine["hours"] >= 0

    grown = printed(
        hub,
        "r = client.grow(1)\n"
        "print(json.dumps({'gpus': [g.id for g in r.machine.gpus], 'env': r.environment,"
        " 'next': r.next_step}))",
    )
    assert len(grown["gpus"]) == 2
    assert sorted(hub.attached(host)) == sorted(grown["gpus"])  # the fabric shows it attached
    # Its own GPUs by UUID: on a shared host, indexes would name a neighbour's.
    grown_gpus = json.loads(grown["env"]["COMPOSE_GPUS"])
    assert [g["id"] for g in grown_gpus] == grown["gpus"]
    visible = ",".join(f"GPU-{g['uuid']}" for g in grown_gpus)
    assert grown["env"]["CUDA_VISIBLE_DEVICES"] == visible
    assert "restart" in grown["next"]
    manifest = json.loads((hub.homes / "student1" / ".composespawner" / "default.json").read_text())
    assert [g["id"] for g in manifest["gpus"]] == grown["gpus"]
    env_file = (hub.homes / "student1" / ".composespawner" / "default.env").read_text()
    assert f"export CUDA_VISIBLE_DEVICES='{visible}'" in env_file

    # A new kernel takes the machine's new environment before its framework counts GPUs.
    applied = printed(
        hub, "client.apply()\nimport os\nprint(json.dumps(os.environ['CUDA_VISIBLE_DEVICES']))"
    )
    assert applied == visible

    given = printed(hub, "r = client.shrink()\nprint(json.dumps([g.id for g in r.machine.gpus]))")
    assert given == grown["gpus"][:1]
    assert hub.attached(host) == given


@pytest.mark.timeout(180)
def test_a_grow_past_quota_is_refused_and_changes_nothing(hub: Hub, running: str) -> None:
    host = running
    before = hub.attached(host)
    manifest = hub.homes / "student1" / ".composespawner" / "default.json"
    written = manifest.read_text() if manifest.exists() else None
    done = in_notebook(
        hub,
        "student1",
        "from composespawner import client\n"
        "try:\n    client.grow(4)\n"
        "except client.PortalError as e:\n    print(e.status, e)\n",
    )
    assert done.error is None, done.error
    assert done.stdout.startswith("403 "), done.stdout
    assert "your limit is 4 GPUs at once (from the site default)" in done.stdout
    assert hub.attached(host) == before
    assert (manifest.read_text() if manifest.exists() else None) == written


class Caller:
    """Calls of the portal's API with the notebook's own token, as the client makes them."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub = hub
        self.token = process_env(notebook_pid(hub, user))["JUPYTERHUB_API_TOKEN"]

    def __call__(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return requests.request(
            method,
            f"{self.hub.url}{PORTAL}{path}",
            headers={"Authorization": f"token {self.token}"},
            timeout=60,
            **kwargs,
        )


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "api/me/server/gpus", {"count": 0}, 400, "count must be a whole number"),
        ("POST", "api/me/server/gpus", {"count": -1}, 400, "count must be a whole number"),
        ("POST", "api/me/server/gpus", {"count": "1"}, 400, "count must be a whole number"),
        ("POST", "api/me/server/gpus", {"count": 10**12}, 400, "count must be a whole number"),
        ("POST", "api/me/server/gpus", {"count": 1.5}, 400, "count must be a whole number"),
        ("POST", "api/me/server/gpus", {"gpus": 1}, 400, 'Send {"count": N}'),
        ("POST", "api/me/server/gpus", [1], 400, 'Send {"count": N}'),
        ("POST", "api/me/servers/%3Cb%3Ex/gpus", {"count": 1}, 404, "no server '<b>x' running"),
        ("DELETE", "api/me/server/gpus/gpu-t4-99", None, 404, "holds no GPU 'gpu-t4-99'"),
    ],
)
def test_bad_grows_and_shrinks_are_refused_and_change_nothing(
    hub: Hub, running: str, method: str, path: str, body: Any, status: int, message: str
) -> None:
    call = Caller(hub, "student1")
    before = hub.attached(running)
    response = call(method, path, json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["message"]
    assert response.headers["Content-Type"].startswith("application/json")
    assert hub.attached(running) == before
    assert [g["id"] for g in call("GET", "api/me/server/gpus").json()["gpus"]] == before


@pytest.mark.timeout(180)
def test_nobody_gives_back_anothers_gpu(hub: Hub, running: str) -> None:
    hub.spawn("student2", ONE_T4).raise_for_status()
    hub.wait_ready("student2")
    try:
        # Its own GPU: the host may be student1's too, and carry student1's GPU beside it.
        theirs = process_env(notebook_pid(hub, "student2"))["COMPOSE_DEVICE_IDS"]
        attached = hub.attached(hub.server_host("student2"))
        assert theirs in attached
        response = Caller(hub, "student1")("DELETE", f"api/me/server/gpus/{theirs}")
        assert response.status_code == 404, response.text
        assert hub.attached(hub.server_host("student2")) == attached
    finally:
        hub.stop("student2")


@pytest.mark.timeout(180)
def test_my_machine_page_adds_a_gpu_and_gives_it_back(hub: Hub, running: str) -> None:
    student = Visitor(hub, "student1")
    xsrf = student.session.cookies.get("_xsrf", path=PORTAL)

    def act(**form: str) -> requests.Response:
        return student.session.post(
            f"{hub.url}{PORTAL}", data={"_xsrf": xsrf, "server": "", **form}, timeout=60
        )

    page = act(action="grow", count="1")
    assert page.status_code == 200, page.text
    assert "Your server has 2 GPUs now" in page.text
    gpus = hub.attached(running)
    assert len(gpus) == 2
    too_many = act(action="grow", count="9")
    assert too_many.status_code == 403
    assert "your limit is 4 GPUs at once" in too_many.text
    assert hub.attached(running) == gpus
    back = act(action="shrink", gpu=gpus[-1])
    assert back.status_code == 200, back.text
    assert "Your server has 1 GPU now" in back.text
    assert hub.attached(running) == gpus[:1]
