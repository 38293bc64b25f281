"""The path a user walks, end to end, on a real hub with real notebooks and the simulated fabric."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, notebook_pid, process_env, running_hub, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as hub:
        yield hub


@pytest.fixture(autouse=True)
def nothing_left_composed(hub: Hub) -> Iterator[None]:
    """Every test starts and ends with the whole fabric free."""
    assert hub.composed_hosts() == {}
    yield
    for user in ("student1", "student2", "researcher1"):
        for name in hub.user(user).get("servers", {}):
            hub.stop(user, name)
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")


@pytest.mark.timeout(180)
def test_spawn_composes_a_machine_and_stop_gives_it_back(hub: Hub, ledger: Ledger) -> None:
    options = {"gpu_model": "t4", "gpu_count": 2, "network": "25g", "scratch_gb": 1920}
    response, events = hub.spawn_watching("student1", options)
    assert response.status_code in (201, 202), response.text

    messages = [event["message"] for event in events]
    assert any(m.startswith("claiming 2 × NVIDIA T4 16GB in rack-") for m in messages), messages
    assert any(m.startswith("attaching GPU 1/2 (NVIDIA T4) to host-") for m in messages)
    assert any(m.startswith("attaching GPU 2/2") for m in messages)
    assert any(m.startswith("attaching 25 Gb/s network card") for m in messages)
    assert any(m.startswith("starting notebook on host-") for m in messages)
    hub.wait_ready("student1")

    pid = notebook_pid(hub, "student1")
    env = process_env(pid)
    # The demo's shared account: the notebook runs in the user's own home.
    home = hub.homes / "student1"
    assert env["HOME"] == str(home)
    assert Path(f"/proc/{pid}/cwd").resolve() == home.resolve()
    gpus = json.loads(env["COMPOSE_GPUS"])
    assert [g["model"] for g in gpus] == ["NVIDIA T4", "NVIDIA T4"]
    # Its own GPUs by UUID (the host may hold a neighbour's too), for CUDA and a runtime.
    visible = ",".join(f"GPU-{g['uuid']}" for g in gpus)
    assert all(g["uuid"] for g in gpus)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == visible
    assert env["COMPOSE_SCRATCH_GB"] == "1920"
    host = env["COMPOSE_HOST"]
    attached = hub.attached(host)
    assert {g["id"] for g in gpus} < set(attached)
    assert len(attached) == 4, attached  # 2 GPUs, a NIC, a drive
    assert all(hub.block_state(block) == "Composed" for block in attached)
    mark = hub.redfish(f"/redfish/v1/Systems/{host}")["Oem"]["ComposeSpawner"]
    assert mark["Hub"] == "composespawner-demo"  # the host's mark names the hub...
    assert mark["Machines"] == [{"Machine": env["COMPOSE_MACHINE_ID"], "Owner": "student1/"}]

    lab = hub.login("student1").get(f"{hub.url}/user/student1/lab", timeout=30)
    assert lab.status_code == 200
    assert "JupyterLab" in lab.text

    hub.stop("student1")
    hub.wait_released(env["COMPOSE_MACHINE_ID"])
    assert hub.attached(host) == []
    assert all(hub.block_state(block) == "Unused" for block in attached)
    assert "ComposeSpawner" not in (hub.redfish(f"/redfish/v1/Systems/{host}").get("Oem") or {})
    machine = ledger.machine(env["COMPOSE_MACHINE_ID"])
    assert machine is not None
    assert machine.state == "released"
    used = {u.block_id for u in ledger.usage("student1") if u.machine_id == machine.id}
    assert used == set(attached)  # the host is shared: its own block is not a device of it


def memory_limit(pid: int) -> int | None:
    """The memory limit of the cgroup ``pid`` is in (v1 memory controller, or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            limit = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.limit_in_bytes")
            return int(limit.read_text())
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::") and (root / line[4:] / "memory.max").exists():
                return int((root / line[4:] / "memory.max").read_text())
    return None


@pytest.mark.timeout(180)
def test_named_servers_share_a_host_each_with_its_own_devices(hub: Hub) -> None:
    """Two servers pack onto one host: each sees only its own GPU and is held to its share;
    stopping one detaches its devices alone, and the host stays marked for the other."""
    for name in ("exp1", "exp2"):
        response = hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1}, name=name)
        assert response.status_code in (201, 202), response.text
    envs = {}
    for name in ("exp1", "exp2"):
        hub.wait_ready("student2", name)
        envs[name] = process_env(notebook_pid(hub, "student2", name))
    host = envs["exp1"]["COMPOSE_HOST"]
    assert envs["exp2"]["COMPOSE_HOST"] == host  # packed: the composed host had room
    assert envs["exp1"]["COMPOSE_NIC"] == "none"  # no card asked for: the host network
    mine = {name: envs[name]["COMPOSE_DEVICE_IDS"] for name in envs}
    assert mine["exp1"] != mine["exp2"]
    assert sorted(hub.attached(host)) == sorted([mine["exp1"], mine["exp2"]])
    for name, env in envs.items():
        [gpu] = json.loads(env["COMPOSE_GPUS"])
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{gpu['uuid']}"
        # The demo's default size for one GPU: 4 cores, 32 GiB, enforced on the notebook.
        assert memory_limit(notebook_pid(hub, "student2", name)) == 32 * 2**30
    mark = hub.redfish(f"/redfish/v1/Systems/{host}")["Oem"]["ComposeSpawner"]
    assert sorted(m["Machine"] for m in mark["Machines"]) == sorted(
        env["COMPOSE_MACHINE_ID"] for env in envs.values()
    )

    hub.stop("student2", "exp1")
    hub.wait_released(envs["exp1"]["COMPOSE_MACHINE_ID"])
    assert hub.attached(host) == [mine["exp2"]]  # exp1's GPU alone went back
    mark = hub.redfish(f"/redfish/v1/Systems/{host}")["Oem"]["ComposeSpawner"]
    assert [m["Machine"] for m in mark["Machines"]] == [envs["exp2"]["COMPOSE_MACHINE_ID"]]
    hub.stop("student2", "exp2")
    hub.wait_released(envs["exp2"]["COMPOSE_MACHINE_ID"])
    assert hub.attached(host) == []
    assert "ComposeSpawner" not in (hub.redfish(f"/redfish/v1/Systems/{host}").get("Oem") or {})


@pytest.mark.timeout(180)
def test_a_cpu_only_server_gets_its_size_and_no_gpu(hub: Hub, ledger: Ledger) -> None:
    response = hub.spawn("student1", {"gpu_count": 0, "size": "small"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    env = process_env(notebook_pid(hub, "student1"))
    assert json.loads(env["COMPOSE_GPUS"]) == []
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU of the host's is this notebook's
    assert env["COMPOSE_DEVICE_IDS"] == ""
    assert memory_limit(notebook_pid(hub, "student1")) == 8 * 2**30
    machine = ledger.machine(env["COMPOSE_MACHINE_ID"])
    assert machine is not None
    assert (machine.cores, machine.memory_gib, machine.block_ids) == (2, 8, ())
    mark = hub.redfish(f"/redfish/v1/Systems/{env['COMPOSE_HOST']}")["Oem"]["ComposeSpawner"]
    assert [m["Machine"] for m in mark["Machines"]] == [machine.id]
    hub.stop("student1")
    hub.wait_released(machine.id)
    assert "ComposeSpawner" not in (
        hub.redfish(f"/redfish/v1/Systems/{env['COMPOSE_HOST']}").get("Oem") or {}
    )


@pytest.mark.timeout(180)
def test_a_dead_notebook_gives_its_devices_back(hub: Hub, ledger: Ledger) -> None:
    hub.spawn("student1", {"gpu_model": "l40s", "gpu_count": 1})
    hub.wait_ready("student1")
    pid = notebook_pid(hub, "student1")
    env = process_env(pid)
    assert hub.attached(env["COMPOSE_HOST"])
    os.kill(pid, signal.SIGKILL)
    hub.wait_gone("student1")
    wait_for(lambda: hub.attached(env["COMPOSE_HOST"]) == [], 30, "the devices to be detached")
    machine = ledger.machine(env["COMPOSE_MACHINE_ID"])
    assert machine is not None
    assert machine.state == "released"


@pytest.mark.timeout(180)
def test_two_users_racing_for_the_last_gpus_cannot_both_win(hub: Hub) -> None:
    # 4 H100s exist, all in rack-2: two asks for 3 cannot both be met.
    ask = {"gpu_model": "h100", "gpu_count": 3}
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda u: hub.spawn(u, ask), ["student2", "researcher1"]))
    codes = sorted(r.status_code for r in responses)
    assert codes in ([201, 409], [202, 409]), [(r.status_code, r.text) for r in responses]
    loser = next(r for r in responses if r.status_code == 409)
    assert "NVIDIA H100 80GB" in loser.json()["message"]
    winner = "student2" if responses[0].status_code != 409 else "researcher1"
    hub.wait_ready(winner)
    assert sum(len(blocks) for blocks in hub.composed_hosts().values()) == 3


@pytest.mark.timeout(180)
def test_racing_spawns_of_one_user_cannot_exceed_the_quota(hub: Hub, ledger: Ledger) -> None:
    ask = {"gpu_model": "a100", "gpu_count": 3}  # 8 A100s exist; the limit is 4 per user
    with ThreadPoolExecutor(2) as pool:
        responses = list(
            pool.map(lambda name: hub.spawn("researcher1", ask, name=name), ["q1", "q2"])
        )
    refused = [r for r in responses if r.status_code == 403]
    assert len(refused) == 1, [(r.status_code, r.text) for r in responses]
    message = refused[0].json()["message"]
    assert "limit is 4 GPUs" in message, message
    assert "3 are in use" in message, message
    held = sum(use.gpus for use in ledger.gpu_use("researcher1"))
    assert held == 3


def test_the_form_shows_what_is_free_and_hides_what_is_not_yours(hub: Hub) -> None:
    student = hub.login("student1").get(f"{hub.url}/hub/spawn", timeout=30)
    assert student.status_code == 200
    assert "NVIDIA T4 16GB" in student.text
    assert 'data-free="8"' in student.text
    assert "RTX 6000" not in student.text
    assert "rtx6000" not in student.text
    assert "4</strong> of 4 GPUs left" in student.text
    owner = hub.login("researcher1").get(f"{hub.url}/hub/spawn", timeout=30)
    assert "NVIDIA RTX 6000 Ada 48GB" in owner.text


@pytest.mark.timeout(180)
def test_the_form_spawns_and_remembers_the_last_choice(hub: Hub) -> None:
    session = hub.login("researcher1")
    form = {
        "gpu_model": "rtx6000",
        "gpu_count": "2",
        "network": "100g",
        "scratch_gb": "0",
        "_xsrf": session.cookies.get("_xsrf"),
    }
    response = session.post(f"{hub.url}/hub/spawn", data=form, timeout=60)
    assert response.status_code == 200, response.text[-2000:]
    hub.wait_ready("researcher1")
    env = process_env(notebook_pid(hub, "researcher1"))
    assert (
        env["COMPOSE_GPU_MODELS"] == "NVIDIA RTX 6000 Ada Generation,NVIDIA RTX 6000 Ada Generation"
    )
    assert env["COMPOSE_NIC"].endswith("(100 Gb/s)")
    hub.stop("researcher1")
    hub.wait_released(env["COMPOSE_MACHINE_ID"])  # the form offers them again once free
    again = session.get(f"{hub.url}/hub/spawn", timeout=30).text
    assert 'value="rtx6000"\n             checked' in again or 'value="rtx6000" checked' in again
    assert '<option value="2" selected>' in again


BAD_OPTIONS = [
    ({"gpu_model": "v100", "gpu_count": 1}, "Unknown GPU model 'v100'"),
    ({"gpu_model": "rtx6000", "gpu_count": 1}, "Unknown GPU model 'rtx6000'"),
    ({"gpu_model": "t4", "gpu_count": 0}, "A CPU-only server (gpu_count 0) has no GPU model"),
    ({"gpu_model": "t4", "gpu_count": -3}, "from 0 (CPU only) to 4"),
    ({"gpu_model": "t4", "gpu_count": "1.5"}, "whole number"),
    ({"gpu_model": "t4", "gpu_count": 100000}, "from 0 (CPU only) to 4"),
    ({"gpu_count": 0, "size": "huge"}, "Unknown size 'huge'. Choose one of: small"),
    ({"gpu_count": 0, "cores": 8}, 'Cores and memory come in sizes: give "size"'),
    ({"gpu_count": 0, "size": "<b>x</b>"}, "Unknown size '?b?x?/b?'"),
    ({"gpu_model": "t4", "gpu_count": 1, "scratch_gb": 99999}, "Scratch size must be one of"),
    ({"gpu_model": "t4", "gpu_count": 1, "network": "<b>fast</b>"}, "Unknown network choice"),
    ({"gpu_model": "t4", "gpu_count": 1, "host": "host-01"}, "Unknown option 'host'"),
]


@pytest.mark.parametrize(("options", "words"), BAD_OPTIONS)
def test_bad_api_input_is_refused_and_claims_nothing(
    hub: Hub, ledger: Ledger, options: dict[str, object], words: str
) -> None:
    response = hub.spawn("student1", options)
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert words in message
    assert "<b>" not in message
    wait_for(lambda: hub.server("student1") is None, 30, "the failed server to be cleared")
    assert ledger.live_machines("student1") == []
    assert ledger.holders() == {}


def test_bad_form_input_is_shown_on_the_form(hub: Hub, ledger: Ledger) -> None:
    session = hub.login("student2")
    form = {"gpu_model": "t4", "gpu_count": "-1", "_xsrf": session.cookies.get("_xsrf")}
    response = session.post(f"{hub.url}/hub/spawn", data=form, timeout=30)
    assert response.status_code == 400
    assert "GPU count must be from 0 (CPU only) to 4" in response.text
    assert ledger.holders() == {}


@pytest.mark.parametrize("name", ["<script>x</script>", "a%20b"])
def test_markup_in_a_server_name_is_refused(hub: Hub, name: str, ledger: Ledger) -> None:
    response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1}, name=name)
    assert response.status_code in (400, 404), response.text
    assert "<script>" not in response.text
    assert ledger.holders() == {}


def test_the_ledger_keeps_an_event_log(hub: Hub, ledger: Ledger, tmp_path: Path) -> None:
    hub.spawn("student2", {"gpu_model": "t4", "gpu_count": 1})
    hub.wait_ready("student2")
    machine_id = process_env(notebook_pid(hub, "student2"))["COMPOSE_MACHINE_ID"]
    hub.stop("student2")
    hub.wait_released(machine_id)
    states = [e.to_state for e in ledger.events(machine_id)]
    assert states == [
        "requested",
        "claimed",
        "composed",
        "launching",
        "running",
        "stopping",
        "released",
    ]
