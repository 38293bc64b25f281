"""Which kernel a process belongs to: real processes read through the real ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.activity.processes import (
    ProcessUnreadable,
    holders_of,
    in_initial_pid_namespace,
    kernel_id_in,
    kernel_of,
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
    me = os.getuid()  # each holder's account, as the kernel's own account is checked
    assert holders_of([worker, pid, worker]) == tuple(
        sorted([Holder(pid, KERNEL_ID, me), Holder(worker, KERNEL_ID, me)])
    )


def test_a_process_that_is_no_kernels_is_nones_and_one_unreadable_is_unknown() -> None:
    assert kernel_of(os.getpid()) is None  # pytest, and its parents up to init
    assert kernel_of(1) is None
    assert holders_of([os.getpid()]) == (Holder(os.getpid(), None, os.getuid()),)
    with pytest.raises(ProcessUnreadable):
        kernel_of(4194305)  # past PID_MAX_LIMIT: no such process (ended, say)
    assert holders_of([os.getpid(), 4194305]) is None  # one unknown: all unknown


def test_the_outermost_kernel_is_the_one_the_server_runs(tmp_path: Path) -> None:
    # A kernel that papermill started from a cell of the server's kernel holds the GPU.
    chain = {
        300: ("python -m ipykernel_launcher -f /tmp/pm/kernel-inner.json", 200),
        200: ("papermill in.ipynb out.ipynb", 100),
        100: ("python -m ipykernel_launcher -f /run/jupyter/kernel-outer.json", 50),
        50: ("jupyterhub-singleuser", 1),
    }
    for pid, (command, parent) in chain.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(command.replace(" ", "\0").encode())
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) S {parent} {pid} {pid} 0")
    assert kernel_of(300, tmp_path) == "outer"
    assert kernel_of(200, tmp_path) == "outer"
    assert kernel_of(50, tmp_path) is None
    (tmp_path / "200" / "stat").unlink()  # a parent gone, or not ours to read
    with pytest.raises(ProcessUnreadable):
        kernel_of(300, tmp_path)


def test_holders_are_named_only_in_the_hosts_pid_namespace(tmp_path: Path) -> None:
    # The suite runs in the host's initial PID namespace; a /proc of another namespace
    # (a container's own mount) is told apart by its ns/pid inode.
    assert in_initial_pid_namespace()
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").write_text("")
    assert not in_initial_pid_namespace(tmp_path)
    assert holders_of([os.getpid()], tmp_path) is None


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
