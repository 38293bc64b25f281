"""compose-ssh when the composed host's sshd stops in the middle of a spawn.

The fabric simulator answers each attach after a while (asynchronous tasks), so
the host is known, in the ledger, well before the hub connects to it: its sshd
is stopped then. The user gets a clear failure and nothing is held: no device
attached, the machine released, no notebook on any host.
Run under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub, running_hub, wait_for
from harness.sshhosts import SSHHosts, ssh_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TASK_SECONDS = 1.5  # each attach: the spawn is composing for a few seconds


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    with ssh_hosts(tmp_path_factory.mktemp("hosts"), users=("student1",)) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def hub(hosts: SSHHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(
        tmp_path_factory.mktemp("hub"),
        hosts.hub_config(),
        COMPOSE_FABRIC_ARGS=f"--async-tasks --task-duration {TASK_SECONDS}",
    ) as hub:
        yield hub


def test_the_hosts_sshd_stopped_mid_spawn_fails_it_clearly_and_leaks_nothing(
    hub: Hub, hosts: SSHHosts, ledger: Ledger
) -> None:
    options = {"gpu_model": "t4", "gpu_count": 2, "network": "25g"}  # three slow attaches
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(hub.spawn, "student1", options)
        placed = wait_for(lambda: ledger.live_machine("student1", ""), 30, "a placed machine")
        host_id = placed.host_id
        assert host_id is not None
        hosts.stop(host_id)
        try:
            response = answer.result(timeout=120)
            if response.status_code == 202:  # still composing when the POST gave up waiting
                hub.wait_gone("student1", timeout=120)
        finally:
            hosts.start(host_id)
    server = hub.server("student1")
    assert server is None
    assert response.status_code in (202, 503), response.text
    if response.status_code == 503:
        assert f"compute host {host_id}: the hub could not reach" in response.json()["message"]
    log = hub.log_path.read_text()
    assert f"cannot start on compute host {host_id}" in log
    assert "Nothing accepts SSH there" in log
    wait_for(lambda: ledger.live_machine("student1", "") is None, 60, "the machine released")
    wait_for(lambda: hub.composed_hosts() == {}, 60, "every device to be detached")
    assert {h: hosts.records(h) for h in hosts.hosts} == {h: [] for h in hosts.hosts}
