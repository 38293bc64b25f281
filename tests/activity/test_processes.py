"""Which kernel a process belongs to: real processes read through the real ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.activity.processes import (
    holders_of,
    kernel_id_in,
    kernel_of,
    own_pid_namespace,
    parent_in,
)
from composespawner.domain.activity import Holder

pytestmark = pytest.mark.timeout(30)

KERNEL_ID = "3f2b9c1e-5d4a-4e8f-9a0b-1c2d3e4f5a6b"
# A kernel as Jupyter Server starts it that starts a worker (a data loader's, say) and
# says the worker's pid: the worker is the process holding the GPU.
KERNEL = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                          stdin=subprocess.PIPE)
print(worker.pid, flush=True)
sys.stdin.read()
worker.stdin.close()
worker.wait()
"""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A running "kernel" (its pid) and its worker's pid; both end with the test."""
    connection = tmp_path / "runtime" / f"kernel-{KERNEL_ID}.json"
    with subprocess.Popen(
        [sys.executable, "-c", KERNEL, "-f", str(connection)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            yield process.pid, int(process.stdout.readline())
        finally:
            process.stdin.close()  # the kernel closes its worker's stdin: both end
            process.wait(timeout=10)


def test_a_kernel_and_its_workers_are_that_kernels(kernel: tuple[int, int]) -> None:
    pid, worker = kernel
    assert kernel_of(pid) == KERNEL_ID
    assert kernel_of(worker) == KERNEL_ID
    assert holders_of([worker, pid, worker]) == tuple(
        sorted([Holder(pid, KERNEL_ID), Holder(worker, KERNEL_ID)])
    )


def test_a_process_that_is_no_kernels_or_has_ended_is_nones() -> None:
    assert kernel_of(os.getpid()) is None  # pytest, and its parents up to init
    assert kernel_of(4194305) is None  # past PID_MAX_LIMIT: no such process
    assert kernel_of(1) is None
    assert holders_of([4194305]) == (Holder(4194305, None),)


def test_this_machine_sees_pids_as_its_host_does() -> None:
    # The suite runs in the host's PID namespace (no container); a reclaimer in a
    # container of its own would get False and name no holders.
    assert own_pid_namespace()


def test_own_pid_namespace_reads_nspid(tmp_path: Path) -> None:
    status = tmp_path / "self" / "status"
    status.parent.mkdir()
    status.write_text("Name:\tpython\nNSpid:\t812\t7\nPPid:\t1\n")
    assert not own_pid_namespace(tmp_path)
    status.write_text("Name:\tpython\nNSpid:\t812\n")
    assert own_pid_namespace(tmp_path)
    status.write_text("Name:\tpython\n")  # Linux before 4.1: cannot tell
    assert not own_pid_namespace(tmp_path)


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["python", "-m", "ipykernel_launcher", "-f", "/r/kernel-ab12-cd.json"], "ab12-cd"),
        (["/opt/conda/bin/python", "-m", "ipykernel", "--f=/r/kernel-x1.json"], "x1"),
        (["R", "--slave", "-e", "IRkernel::main()", "--args", "/r/kernel-9.json"], "9"),
        (["python", "train.py", "--config", "kernel.json"], None),
        (["python", "-f", "/r/mykernel-1.json"], None),
        (["python", "-f", "/r/kernel-1.json.bak"], None),
        ([], None),
    ],
)
def test_the_kernel_id_is_read_from_the_connection_file_named(
    argv: list[str], found: str | None
) -> None:
    assert kernel_id_in(argv) == found


def test_the_parent_is_read_past_a_command_with_parentheses_and_spaces() -> None:
    assert parent_in("4321 (my (odd) cmd) S 77 4321 4321 0 -1 4194560") == 77
