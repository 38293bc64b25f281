"""Issue 31's walk on the demo: four students each start a quarter of a T4.

The demo's own config and fabric, with the stand-in notebook: the fabric shows one T4
attached, all four notebooks name the same GPU and are told their share, the form
shows the quarters left, a fifth quarter splits a second T4 only because the first is
full, the T4 stays attached while any holder runs, and when the last one stops it is
free on the fabric.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.hubload import STANDIN_ENV, check_holders, create_users
from harness.hub import Hub, notebook_pid, process_env, running_hub

QUARTER = {"gpu_model": "t4", "gpu_count": 1, "gpu_share": 4}
STUDENTS = ["student1", "student2", "student3", "student4"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("shares"), **STANDIN_ENV) as hub:
        create_users(hub, [*STUDENTS, "student5"])
        yield hub


def quarters_free(hub: Hub) -> int:
    """What the spawn form offers of quarter T4s now."""
    # A named server not started yet: its form, while the default server runs.
    page = hub.login("student1").get(f"{hub.url}/hub/spawn/student1/look", timeout=30).text
    found = re.search(r"Shares of one GPU: [^<]*?(\d+) quarters? free", page)
    assert found, page[-3000:]
    return int(found.group(1))


def attached_t4s(hub: Hub, t4s: set[str]) -> dict[str, list[str]]:
    """host → the T4 blocks attached to it, for hosts with any."""
    found = {h: sorted(set(blocks) & t4s) for h, blocks in hub.composed_hosts().items()}
    return {host: blocks for host, blocks in found.items() if blocks}


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_four_students_share_one_t4_and_the_last_stop_frees_it(hub: Hub) -> None:
    before = quarters_free(hub)
    with ThreadPoolExecutor(len(STUDENTS)) as pool:
        responses = list(pool.map(lambda user: hub.spawn(user, QUARTER), STUDENTS))
    assert all(r.status_code in (201, 202) for r in responses), [r.text for r in responses]
    envs = {}
    for user in STUDENTS:
        hub.wait_ready(user, timeout=180)
        envs[user] = process_env(notebook_pid(hub, user, ""))

    gpus = {user: json.loads(env["COMPOSE_GPUS"]) for user, env in envs.items()}
    assert all(len(g) == 1 for g in gpus.values()), gpus
    [t4] = {g[0]["id"] for g in gpus.values()}  # one GPU, named alike in every notebook
    [host] = {env["COMPOSE_HOST"] for env in envs.values()}
    for env in envs.values():
        assert env["CUDA_VISIBLE_DEVICES"] == f"GPU-{gpus['student1'][0]['uuid']}"
        assert (env["COMPOSE_GPU_SHARE"], env["COMPOSE_GPU_MEMORY_FRACTION"]) == ("1/4", "0.25")
    assert attached_t4s(hub, {t4}) == {host: [t4]}
    assert hub.attached(host).count(t4) == 1
    mark = hub.redfish(f"/redfish/v1/Systems/{host}")["Oem"]["ComposeSpawner"]
    assert sorted(m["Machine"] for m in mark["Machines"]) == sorted(
        env["COMPOSE_MACHINE_ID"] for env in envs.values()
    )
    assert quarters_free(hub) == before - 4

    # The fifth quarter finds the first T4 full: it splits another.
    response = hub.spawn("student5", QUARTER)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student5", timeout=180)
    fifth = process_env(notebook_pid(hub, "student5", ""))
    [other] = [g["id"] for g in json.loads(fifth["COMPOSE_GPUS"])]
    assert other != t4
    assert quarters_free(hub) == before - 5

    for user in STUDENTS[:-1]:
        hub.stop(user)
        hub.wait_released(envs[user]["COMPOSE_MACHINE_ID"])
    assert hub.block_state(t4) == "Composed"  # the last holder still uses it
    assert attached_t4s(hub, {t4}) == {host: [t4]}

    hub.stop(STUDENTS[-1])
    hub.wait_released(envs[STUDENTS[-1]]["COMPOSE_MACHINE_ID"])
    assert hub.block_state(t4) == "Unused"
    assert attached_t4s(hub, {t4}) == {}
    hub.stop("student5")
    hub.wait_released(fifth["COMPOSE_MACHINE_ID"])
    after = check_holders(hub)
    assert (after.fabric_attached, after.ledger_held, after.tagged_hosts) == ([], [], [])
    assert quarters_free(hub) == before
