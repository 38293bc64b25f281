"""Issue 32's walk on the demo: idle GPUs go back to the pool while their servers run on.

The demo's hub with its reclaimer on, in seconds rather than minutes, reading each
host's DCGM exporter on the simulator, whose GPU figures the test sets:

* an L40S nothing holds is detached after ``detach_after``; its JupyterLab stays up;
* a T4 a process holds without working is warned about (the notebook reads the warning
  from the portal, and its JupyterLab's server extension passes it on), then taken: the
  server's kernel is shut down through its own API, the GPU detached, the server stays up;
* an A100 that works the whole time is never touched.

Every give-back is in the ledger with the figures that justified it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from composespawner.ledger import Ledger
from harness.hub import FABRIC_AUTH, PORTAL, Hub, notebook_pid, process_env, running_hub, wait_for
from tests.e2e.test_faults import ledger_ready

pytestmark = pytest.mark.e2e
LAB_TOKEN = "reclaim-test-lab-token-0123456789"
# Seconds, not the demo's minutes; the reclaimer looks every second.
SHORT_POLICY = f"""
c.ReclaimerApp.interval = 1
c.ComposeSettings.reclaim_policy = {{
    "detach_after": 6, "warn_after": 10, "reclaim_after": 30, "max_gap": 5
}}
c.JupyterHub.services.append({{"name": "test-lab", "api_token": "{LAB_TOKEN}"}})
c.JupyterHub.load_roles.append(
    {{"name": "test-lab", "scopes": ["access:servers"], "services": ["test-lab"]}}
)
"""
HELD_IDLE = {"utilization": 0, "memory_used_mib": 2000}  # a CUDA context, no kernel running
BUSY = {"utilization": 85, "memory_used_mib": 9000}


@contextmanager
def reclaiming_hub(tmp: Path, config: str) -> Iterator[Hub]:
    """The demo hub with its reclaimer on under ``config``, GPU figures settable."""
    with running_hub(
        tmp,
        config,
        COMPOSE_FABRIC_ARGS="--faults-api",
        COMPOSE_RECLAIM="1",
        COMPOSE_RECONCILE_EVERY="3600",
    ) as hub:
        yield ledger_ready(hub)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with reclaiming_hub(tmp_path_factory.mktemp("reclaim"), SHORT_POLICY) as hub:
        yield hub


def blocks_of(ledger: Ledger, word: str) -> list[str]:
    return [d.block_id for d in ledger.devices() if word in d.model.lower()]


def set_activity(hub: Hub, figures: dict[str, dict[str, int]]) -> None:
    response = requests.patch(
        f"{hub.fabric_url}/sim/activity", json=figures, auth=FABRIC_AUTH, timeout=10
    )
    assert response.status_code == 200, response.text


def lab(hub: Hub, user: str, method: str, path: str) -> requests.Response:
    """The user's notebook server's REST API, through the hub's proxy."""
    return requests.request(
        method,
        f"{hub.url}/user/{user}/api/{path}",
        headers={"Authorization": f"token {LAB_TOKEN}"},
        timeout=30,
    )


def started_with(hub: Hub, user: str) -> list[str]:
    gpus = json.loads(process_env(notebook_pid(hub, user, ""))["COMPOSE_GPUS"])
    return [gpu["id"] for gpu in gpus]


def gpus_of(ledger: Ledger, user: str) -> tuple[str, ...]:
    (machine,) = ledger.live_machines(user)
    return machine.block_ids


def given_back(hub: Hub, ledger: Ledger, user: str, gpu: str) -> bool:
    """Whether the GPU is off the user's host, freed in the ledger and its give-back recorded:
    the reclaimer does these in that order, so a test that checked one could race the next."""
    return (
        gpu not in hub.attached(hub.server_host(user))
        and gpu not in gpus_of(ledger, user)
        and any(g.block_id == gpu for g in ledger.reclaims.givebacks(*_all_time()))
    )


@pytest.mark.timeout(420)
def test_idle_gpus_go_back_while_servers_run_and_a_busy_one_stays(hub: Hub) -> None:
    ledger = Ledger(hub.ledger_url())
    try:
        # Before any server starts: every T4 held by an idle process, every A100 busy.
        set_activity(hub, {b: HELD_IDLE for b in blocks_of(ledger, "t4")})
        set_activity(hub, {b: BUSY for b in blocks_of(ledger, "a100")})
        asks = {"student1": "l40s", "student2": "t4", "researcher1": "a100"}
        for user, model in asks.items():
            response = hub.spawn(user, {"gpu_model": model, "gpu_count": 1})
            assert response.status_code in (201, 202), response.text
        for user in asks:
            hub.wait_ready(user, timeout=180)
        # What each notebook was started with (the reclaimer may have acted already).
        (l40s,), (t4,), (a100,) = (started_with(hub, user) for user in asks)
        hosts = {user: hub.server_host(user) for user in asks}
        kernel = lab(hub, "student2", "POST", "kernels")
        assert kernel.status_code == 201, kernel.text
        kernel_id = kernel.json()["id"]

        # 1. Nothing holds the L40S: detached, quietly; the server runs on.
        wait_for(lambda: given_back(hub, ledger, "student1", l40s), 60, "the L40S given back")
        assert gpus_of(ledger, "student1") == ()
        assert lab(hub, "student1", "GET", "status").status_code == 200

        # 2. The T4 is held but idle: a warning first, while it is still attached...
        def warned() -> bool:
            watch = ledger.reclaims.watches().get((machine_of(ledger, "student2"), t4))
            return watch is not None and watch.warned_at is not None

        wait_for(warned, 60, "a warning about the idle T4")
        assert t4 in hub.attached(hosts["student2"])
        # ...which the notebook reads from the portal (client.machine(), JupyterLab)...
        told = portal_as_notebook(hub, "student2")
        warning = next(g for g in told["gpus"] if g["id"] == t4)["warning"]
        assert warning["message"].startswith("Your NVIDIA T4 has done no work for")
        assert warning["keep_allowed"] is True
        in_lab = requests.get(
            f"{hub.url}/user/student2/compose/machine",
            headers={"Authorization": f"token {LAB_TOKEN}"},
            timeout=30,
        )
        assert in_lab.status_code == 200, in_lab.text
        assert next(g for g in in_lab.json()["gpus"] if g["id"] == t4)["warning"] == warning
        # ...then its kernel is shut down and the T4 taken; the server stays.
        wait_for(lambda: given_back(hub, ledger, "student2", t4), 60, "the T4 reclaimed")
        kernels = lab(hub, "student2", "GET", "kernels")
        assert kernels.status_code == 200, kernels.text
        assert kernel_id not in {k["id"] for k in kernels.json()}
        assert lab(hub, "student2", "GET", "status").status_code == 200
        assert hub.server("student2") is not None

        # 3. The busy A100 was never touched, watched for longer than every window.
        def watched_past_every_window() -> bool:
            watch = ledger.reclaims.watches().get((machine_of(ledger, "researcher1"), a100))
            return watch is not None and watch.since is not None and time.time() - watch.since > 30

        wait_for(watched_past_every_window, 60, "the A100 watched past reclaim_after")
        assert a100 in hub.attached(hosts["researcher1"])
        assert gpus_of(ledger, "researcher1") == (a100,)

        given = {(g.user_name, g.block_id): g for g in ledger.reclaims.givebacks(*_all_time())}
        assert set(given) == {("student1", l40s), ("student2", t4)}
        assert given["student1", l40s].action == "detach"
        assert given["student2", t4].action == "reclaim"
        assert given["student2", t4].figures["idle_s"] >= 30
        assert ledger.holders().get(l40s) is None
        assert ledger.holders().get(t4) is None
    finally:
        for user in ("student1", "student2", "researcher1"):
            if hub.server(user) is not None:
                hub.stop(user)
        ledger.close()


def portal_as_notebook(hub: Hub, user: str) -> dict[str, Any]:
    """``GET {gpus}`` as ``client.machine()`` asks it: with the notebook's own token."""
    token = process_env(notebook_pid(hub, user, ""))["JUPYTERHUB_API_TOKEN"]
    answer = requests.get(
        f"{hub.url}{PORTAL}api/me/server/gpus",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def machine_of(ledger: Ledger, user: str) -> str:
    (machine,) = ledger.live_machines(user)
    return machine.id


def _all_time() -> tuple[datetime, datetime]:
    return datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
