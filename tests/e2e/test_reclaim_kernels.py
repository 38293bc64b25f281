"""Issue 32's last step on the demo's hub: a reclaim ends only the kernel holding the GPU.

The hub's own reclaimer service reads NVML (``activity_source = "nvml"``), where the
NVIDIA driver would answer a strict fake ``pynvml`` (``tests/support/nvml_stub``) says
which processes hold which GPU: the pid of a real kernel of the student's server. The
reclaimer maps each pid to its kernel through the real ``/proc``, warns, and at
``reclaim_after`` shuts down that kernel alone through the server's API and detaches
its GPU. The kernel on the other GPU, busy, keeps running and keeps its GPU; so does a
kernel holding no GPU; the server stays up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from composespawner.domain.reclaim import GpuWatch
from composespawner.ledger import Ledger
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for
from tests.e2e.test_faults import ledger_ready
from tests.e2e.test_gpu_reclaim import LAB_TOKEN, given_back, gpus_of, lab, machine_of

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "tests" / "support" / "nvml_stub"


def config(state: Path, source: str = "nvml") -> str:
    """The demo's hub with a reclaimer of its own, as the demo config runs one (its
    command, role and config file), reading NVML through the stub: itself (``"nvml"``),
    or each host's agent (``"agent"``: the stub is then in the agents' environment)."""
    stub = f"""
reclaimer["environment"]["PYTHONPATH"] = "{STUB}:{ROOT}"
reclaimer["environment"]["FAKE_NVML_STATE"] = "{state}"
"""
    return f"""
from pathlib import Path
from composespawner.commands.hubconfig import RECLAIMER, Services

c.ReclaimerApp.interval = 1
c.ReclaimerApp.activity_source = "{source}"
c.ComposeSettings.reclaim_policy = {{
    "detach_after": 6, "warn_after": 8, "reclaim_after": 20, "max_gap": 5
}}
reclaimer = Services(Path("{ROOT}/hub_config/jupyterhub_config.py"), portal_port=0).reclaimer()
{stub if source == "nvml" else ""}
c.JupyterHub.services.append(reclaimer)
c.JupyterHub.load_roles.append(
    {{"name": RECLAIMER, "scopes": ["access:servers"], "services": [RECLAIMER]}}
)
c.JupyterHub.services.append({{"name": "test-lab", "api_token": "{LAB_TOKEN}"}})
c.JupyterHub.load_roles.append(
    {{"name": "test-lab", "scopes": ["access:servers"], "services": ["test-lab"]}}
)
"""


def set_nvml(state: Path, gpus: list[dict[str, object]] | str) -> None:
    """What NVML says from now on, written whole (the reclaimer never reads half): the
    GPUs, or "no driver" (see tests/support/nvml_stub)."""
    partial = state.with_suffix(".partial")
    partial.write_text(json.dumps(gpus))
    os.replace(partial, state)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("nvml") / "nvml.json"
    set_nvml(state, [])  # no GPU listed: every GPU unknown, none touched
    return state


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, state: Path) -> Iterator[Hub]:
    # COMPOSE_RECLAIM=0: the demo config's own reclaimer (DCGM) off, the one above on.
    with running_hub(
        tmp_path_factory.mktemp("reclaim-kernels"),
        config(state),
        COMPOSE_FABRIC_ARGS="--faults-api",
        COMPOSE_RECLAIM="0",
        COMPOSE_RECONCILE_EVERY="3600",
    ) as hub:
        yield ledger_ready(hub)


def kernel_pid(kernel_id: str) -> int:
    """The kernel's process, as the test finds it: by its connection file's name."""
    wanted = f"kernel-{kernel_id}.json".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no process of kernel {kernel_id}")


def start_kernel(hub: Hub, user: str) -> str:
    kernel = lab(hub, user, "POST", "kernels")
    assert kernel.status_code == 201, kernel.text
    return str(kernel.json()["id"])


@pytest.mark.timeout(300)
def test_a_reclaim_shuts_down_only_the_kernel_holding_the_idle_gpu(hub: Hub, state: Path) -> None:
    only_the_holding_kernel_goes(hub, state, lambda: process_env(notebook_pid(hub, "student1")))


def only_the_holding_kernel_goes(
    hub: Hub, state: Path, notebook_env: Callable[[], dict[str, str]]
) -> None:
    """student1's server on two T4s, three kernels: one holds a T4 idle, one works on the
    other, one holds none. Only the first is shut down, with its T4. ``notebook_env``:
    the environment of the server's notebook process (where its launcher says it is)."""
    ledger = Ledger(hub.ledger_url())
    try:
        response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 2})
        assert response.status_code in (201, 202), response.text
        hub.wait_ready("student1", timeout=180)
        env = notebook_env()
        (idle_gpu, idle_uuid), (busy_gpu, busy_uuid) = (
            (gpu["id"], gpu["uuid"]) for gpu in json.loads(env["COMPOSE_GPUS"])
        )
        host = hub.server_host("student1")
        idle_kernel, busy_kernel, no_gpu_kernel = (start_kernel(hub, "student1") for _ in "abc")
        set_nvml(
            state,
            [
                {"uuid": f"GPU-{idle_uuid}", "used_mib": 2000, "pids": [kernel_pid(idle_kernel)]},
                {
                    "uuid": f"GPU-{busy_uuid}",
                    "utilization": 90,
                    "used_mib": 9000,
                    "pids": [kernel_pid(busy_kernel)],
                },
            ],
        )
        machine = machine_of(ledger, "student1")

        def watch_of(gpu: str) -> GpuWatch | None:
            return ledger.reclaims.watches([machine]).get((machine, gpu))

        # The reclaimer names the holder of each GPU, and warns about the idle one...
        wait_for(
            lambda: (w := watch_of(idle_gpu)) is not None and w.warned_at is not None,
            60,
            "a warning about the idle T4",
        )
        held = {gpu: getattr(watch_of(gpu), "holders", None) for gpu in (idle_gpu, busy_gpu)}
        assert held == {idle_gpu: (f"kernel:{idle_kernel}",), busy_gpu: (f"kernel:{busy_kernel}",)}
        # ...then shuts down its kernel alone and takes it; the busy one keeps its own.
        wait_for(lambda: given_back(hub, ledger, "student1", idle_gpu), 60, "the idle T4 reclaimed")
        kernels = lab(hub, "student1", "GET", "kernels")
        assert kernels.status_code == 200, kernels.text
        assert {k["id"] for k in kernels.json()} == {busy_kernel, no_gpu_kernel}
        assert busy_gpu in hub.attached(host)
        assert gpus_of(ledger, "student1") == (busy_gpu,)
        assert lab(hub, "student1", "GET", "status").status_code == 200
    finally:
        set_nvml(state, [])
        if hub.server("student1") is not None:
            hub.stop("student1")
        ledger.close()
