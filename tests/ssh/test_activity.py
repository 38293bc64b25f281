"""The reclaimer's activity source on bare hosts: each host's agent reads NVML, through
a real OpenSSH sshd with the agent as the hub key's forced command (harness/sshhosts.py).

NVML is the strict stand-in of tests/support/nvml_stub, in the agents' environment only;
everything above it is the real code: the agent names each holder's kernel from the
host's /proc, the hub's reclaimer reads the answer over SSH and, on the demo's hub with
compose-ssh, shuts down only the kernel holding the idle GPU it takes.
Run under ``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest
from traitlets.config import Config

from composespawner.activity import ActivityUnreadable
from composespawner.activity.agent import AgentActivity, ssh_settings
from composespawner.domain.activity import GpuActivity, Holder
from composespawner.hostagent.decisions import Record
from composespawner.hostagent.state import StateDir
from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from composespawner.launchers.processes import process_started
from harness.hub import Hub, process_env, running_hub
from harness.paths import ROOT
from harness.sshhosts import SSHHosts, ssh_hosts
from tests.e2e.test_faults import ledger_ready
from tests.e2e.test_reclaim_kernels import config, only_the_holding_kernel_goes, set_nvml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

STUB = ROOT / "tests" / "support" / "nvml_stub"
HELD, BUSY, FREE = (f"GPU-{n}b2f4c3e-55aa-4bb0-8c1d-2e3f4a5b6c7d" for n in "123")
KERNEL_ID = "4f0c3a52-1d2e-4b6a-9c1f-7e8d9a0b1c2d"
# A process shaped as Jupyter Server starts a kernel: its connection file on the command line.
KERNEL = "import sys; sys.stdin.read()"
# The kernel's account, not root (the one that lies about its kernel): the demo's notebook
# account, which may run this Python (a pyenv one under /root, say).
OWNER = pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("nvml") / "nvml.json"
    os.chmod(state.parent, 0o755)  # the agents run as root, but keep it plain
    set_nvml(state, [])
    return state


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, state: Path) -> Iterator[SSHHosts]:
    agent_env = {"PYTHONPATH": f"{STUB}:{ROOT}", "FAKE_NVML_STATE": str(state)}
    with ssh_hosts(
        tmp_path_factory.mktemp("hosts"), users=("student1",), agent_env=agent_env
    ) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def hub(hosts: SSHHosts, state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    # COMPOSE_RECLAIM=0: the demo config's own reclaimer (DCGM) off, one reading agents on.
    with running_hub(
        tmp_path_factory.mktemp("hub"),
        hosts.hub_config() + config(state, source="agent"),
        COMPOSE_FABRIC_ARGS="--faults-api",
        COMPOSE_RECLAIM="0",
        COMPOSE_RECONCILE_EVERY="3600",
    ) as hub:
        yield ledger_ready(hub)


@pytest.fixture
async def source(hosts: SSHHosts) -> AsyncIterator[AgentActivity]:
    config = {
        "SSHLauncher": {
            "hosts": {h: host.where for h, host in hosts.hosts.items()},
            "ssh_key": str(hosts.client_key),
            "known_hosts": str(hosts.known_hosts),
            "connect_timeout": 5.0,
        }
    }
    source = AgentActivity(ssh_settings(Config(config)), timeout=20)
    yield source
    await source.close()


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[int]:
    """A running kernel-shaped process (its pid) of OWNER's; it ends with the test."""
    yield from kernel_shaped(tmp_path / "runtime", user=OWNER.pw_uid, cwd="/")


def kernel_shaped(runtime: Path, **popen: Any) -> Iterator[int]:
    """A process with KERNEL_ID's connection file (in ``runtime``) on its command line,
    as Jupyter Server starts a kernel: its pid, until the fixture using it ends."""
    connection = runtime / f"kernel-{KERNEL_ID}.json"
    with subprocess.Popen(
        [sys.executable, "-c", KERNEL, "-f", str(connection)], stdin=PIPE, **popen
    ) as process:
        assert process.stdin is not None
        try:
            yield process.pid
        finally:
            process.stdin.close()
            process.wait(timeout=10)


@pytest.fixture
def notebook_of_kernel(hosts: SSHHosts, kernel: int) -> Iterator[Record]:
    """host-01's agent's record of a notebook holding HELD whose account the kernel runs
    as (the kernel's own pid stands for the notebook's)."""
    started = process_started(kernel)
    assert started is not None
    record = Record("m-k", OWNER.pw_name, OWNER.pw_uid, "", kernel, started, 9, (HELD,), 1, 1, ())
    state = StateDir(hosts.hosts["host-01"].state_dir)
    state.write(record)
    yield record
    state.remove(record)


@pytest.fixture
def liar(tmp_path: Path) -> Iterator[int]:
    """A process of another account (root's, here) naming the notebook's kernel on its
    command line as the kernel does (its pid); it ends with the test."""
    yield from kernel_shaped(tmp_path / "elsewhere")


async def test_the_agent_names_the_kernel_holding_each_gpu_and_no_strangers_word(
    source: AgentActivity, state: Path, kernel: int, notebook_of_kernel: Record, liar: int
) -> None:
    other = os.getpid()  # a process that is no kernel's: pytest
    # The probe's: another account's process naming the notebook's kernel on its command
    # line was taken for it (and a reclaim would have shut the notebook's kernel down).
    set_nvml(
        state,
        [
            {"uuid": HELD, "used_mib": 2000, "pids": [kernel, liar]},
            {"uuid": BUSY, "utilization": 87, "used_mib": 9000, "pids": [other]},
            {"uuid": FREE},
        ],
    )
    reading = await source.read("host-01")
    assert reading.host_id == "host-01"
    holders = tuple(sorted([Holder(kernel, KERNEL_ID), Holder(liar, None)]))
    assert dict(reading.gpus) == {
        HELD[4:]: GpuActivity(HELD[4:], 0.0, 2000.0, 2, holders),
        BUSY[4:]: GpuActivity(BUSY[4:], 87.0, 9000.0, 1, (Holder(other, None),)),
        FREE[4:]: GpuActivity(FREE[4:], 0.0, 3.0, 0, ()),
    }


async def test_a_host_whose_nvml_cannot_start_is_unreadable(
    source: AgentActivity, state: Path
) -> None:
    set_nvml(state, "no driver")
    try:
        with pytest.raises(ActivityUnreadable, match=r"NVML: cannot start .*driver"):
            await source.read("host-01")
    finally:
        set_nvml(state, [])


async def test_a_host_not_in_the_table_or_not_reachable_is_unreadable(
    source: AgentActivity, hosts: SSHHosts, state: Path
) -> None:
    with pytest.raises(ActivityUnreadable, match=r"not in c\.SSHLauncher\.hosts"):
        await source.read("host-99")
    hosts.stop("host-01")
    try:
        with pytest.raises(ActivityUnreadable, match="host-01 unreadable from its agent at"):
            await source.read("host-01")
    finally:
        hosts.start("host-01")
    set_nvml(state, [{"uuid": FREE}])
    assert list((await source.read("host-01")).gpus) == [FREE[4:]]  # back, on a new connection


@pytest.mark.timeout(300)
def test_on_a_bare_host_a_reclaim_shuts_down_only_the_kernel_holding_the_idle_gpu(
    hub: Hub, hosts: SSHHosts, state: Path
) -> None:
    def notebook_env() -> dict[str, str]:
        found = hosts.notebook("student1")
        assert found is not None, "no notebook of student1 on any host"
        return process_env(found[1]["pid"])

    only_the_holding_kernel_goes(hub, state, notebook_env)
