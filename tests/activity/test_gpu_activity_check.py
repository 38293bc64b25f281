"""The device check (benchmarks/gpu_activity_check) rehearsed without a GPU: a stand-in
holder and nvidia-smi, the fake pynvml, and its verdict on figures a GPU could give.
Device time is scarce: the script must be right before it runs there."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_activity_check import check

from .fake_pynvml import FakeGpu, FakeNvml

UUID = "GPU-11112222-3333-4444-5555-666677778888"

# Prints the holder's phases as holder.cu does, without CUDA.
HOLDER = """
import json, sys, time
for name in ("holding", "busy", "idle_again", "exiting"):
    print(json.dumps({"phase": name, "at": time.time()}), flush=True)
    time.sleep(0.05)
"""

NVIDIA_SMI = f"""#!/bin/sh
case "$*" in
  *--query-gpu=uuid*) echo "{UUID}" ;;
  *--query-gpu=memory.used,utilization.gpu*) echo "3, 0" ;;
  *--query-compute-apps*) echo "4242, {UUID}, 1536 MiB" ;;
  *--query-gpu=name,driver_version*) echo "NVIDIA H100 80GB HBM3, 550.54.15" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def step(processes: int, utilization: float, memory: float, smi_memory: float) -> dict[str, Any]:
    nvml = {
        "processes": processes,
        "utilization": utilization,
        "memory_used_mib": memory,
        "holders": [[4242 + n, check.KERNEL_ID] for n in range(processes)],
    }
    return {"nvml": nvml, "nvidia_smi": {"memory_used_mib": smi_memory}}


def steps(**changes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What a GPU gave at each step, as the check expects it; ``changes`` replace steps."""
    good = {
        "no_process": [step(0, 0.0, 1.0, 1.0)] * 3,
        "held_idle": [step(1, 0.0, 1530.0, 1531.0)] * 3,
        "busy": [step(1, 100.0, 1530.0, 1531.0)] * 3,
        "idle_again": [step(1, 35.0, 1530.0, 1531.0), step(1, 0.0, 1530.0, 1531.0)],
        "after_exit": [step(0, 0.0, 1.0, 1.0)] * 3,
    }
    return {**good, **changes}


def _named(taken: dict[str, Any], holders: list[list[Any]] | None) -> dict[str, Any]:
    return {**taken, "nvml": {**taken["nvml"], "holders": holders}}


def test_verdict_passes_what_the_policy_needs() -> None:
    verdict = check.verdict(steps(), held_mib=1024)
    assert verdict["ok"], verdict["checks"]
    assert verdict["figures"]["context_overhead_mib"] == 1531.0 - 1.0 - 1024


@pytest.mark.parametrize(
    ("changes", "failed"),
    [
        ({"no_process": [step(1, 0.0, 500.0, 500.0)] * 3}, "no_process_reads_0_processes"),
        (  # the count alone wrong (the kernel still named)
            {"held_idle": [_named(step(0, 0.0, 1530.0, 1531.0), [[4242, check.KERNEL_ID]])] * 3},
            "held_reads_1_process",
        ),
        ({"held_idle": [step(1, 2.0, 1530.0, 1531.0)] * 3}, "held_idle_reads_0_utilization"),
        ({"held_idle": [step(1, 0.0, 20.0, 21.0)] * 3}, "held_memory_well_above_idle"),
        ({"busy": [step(1, 0.0, 1530.0, 1531.0)] * 3}, "busy_reads_utilization"),
        ({"after_exit": [step(1, 0.0, 1.0, 1.0)] * 3}, "after_exit_reads_0_processes"),
        (
            {"held_idle": [_named(step(1, 0.0, 1530.0, 1531.0), [[4242, None]])] * 3},
            "held_names_its_kernel",
        ),
        ({"held_idle": [_named(step(1, 0.0, 1530.0, 1531.0), None)] * 3}, "held_names"),
        ({"busy": [{"nvml": None, "nvidia_smi": {"memory_used_mib": 1.0}}] * 3}, "busy_reads"),
    ],
)
def test_verdict_fails_each_check(changes: dict[str, Any], failed: str) -> None:
    verdict = check.verdict(steps(**changes), held_mib=1024)
    assert not verdict["ok"]
    assert [name for name, good in verdict["checks"].items() if not good] == [
        name for name in verdict["checks"] if name.startswith(failed)
    ]


@pytest.mark.timeout(60)
def test_the_script_runs_through_with_stand_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    FakeNvml([FakeGpu(UUID, used_mib=3)]).install(monkeypatch)
    for name, value in (("SAMPLE_EVERY_S", 0.01), ("SETTLE_S", 0.01), ("IDLE_S", 0.05)):
        monkeypatch.setattr(check, name, value)
    monkeypatch.setattr(check, "BUSY_S", 0.05)

    result = asyncio.run(check.run([sys.executable, str(holder)]))
    assert result["uuid"] == UUID
    assert result["holder_exit"] == 0
    assert [said["phase"] for said in result["holder"]] == [
        "holding",
        "busy",
        "idle_again",
        "exiting",
    ]
    assert list(result["steps"]) == ["no_process", "held_idle", "busy", "idle_again", "after_exit"]
    first = result["steps"]["no_process"][0]
    assert first["nvml"] == {
        "utilization": 0.0,
        "memory_used_mib": 3.0,
        "processes": 0,
        "holders": [],
    }
    assert first["nvidia_smi"]["compute_apps"] == [f"4242, {UUID}, 1536 MiB"]
    assert all(len(taken) == check.SAMPLES for taken in result["steps"].values())
    # The fake GPU never changes: a held step reads no process, and the verdict says so.
    assert not check.verdict(result["steps"], result["held_mib"])["checks"]["held_reads_1_process"]
