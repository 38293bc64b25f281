"""What NvmlSource reads from a real GPU at each step of a notebook's life (see run.sh).

Steps, on the first GPU nvidia-smi lists: (1) no process; (2) a CUDA program holding a
context and memory, idle (started by a process shaped like a Jupyter kernel, its
connection file on its command line, as a kernel starts a worker: NvmlSource should name
that kernel as the GPU's holder); (3) the same program running kernels back to back; (4) it
idle again; (5) after it exits. At each step: NvmlSource's readings of that GPU and
nvidia-smi's memory.used and utilization.gpu, so the reclaim policy's memory floor can
be chosen from real figures. Writes gpu_activity_check.json into the folder given.

Usage: python3 -m benchmarks.gpu_activity_check.check HOLDER_BINARY OUT_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from composespawner.activity import ActivityUnreadable
from composespawner.activity.nvml import NvmlSource
from composespawner.activity.processes import in_initial_pid_namespace
from composespawner.domain.activity import gpu_uuid

HOLD_MIB = 1024  # what the holder allocates: a small model's worth
IDLE_S = 8.0  # each idle phase of the holder
BUSY_S = 8.0  # its busy phase
SAMPLES = 3  # readings per step
SAMPLE_EVERY_S = 1.0  # one per NVML sample period at least
# NVML's utilisation is the share of its last sample period (1/6 s to 1 s, by GPU) in
# which a kernel ran: a step is sampled only after this long into it.
SETTLE_S = 2.0
PHASE_WITHIN_S = 60.0  # the holder's CUDA start and allocation, at most
SMI_TIMEOUT_S = 20.0
KERNEL_ID = "device-check-0001"
# Runs the holder as its child, as a kernel runs a data loader's worker.
AS_KERNEL = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[2:]))"


def smi(*query: str) -> str:
    done = subprocess.run(
        ["nvidia-smi", *query], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True
    )
    return done.stdout.strip()


def smi_gpu(uuid: str) -> dict[str, Any]:
    line = smi(
        "-i", uuid, "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"
    )
    memory, utilization = (part.strip() for part in line.split(","))
    apps = smi("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader")
    return {
        "memory_used_mib": float(memory),
        "utilization": float(utilization),
        "compute_apps": [row for row in apps.splitlines() if uuid in row],
    }


async def sample(source: NvmlSource, uuid: str) -> list[dict[str, Any]]:
    """SAMPLES readings of one GPU, SAMPLE_EVERY_S apart, each beside nvidia-smi's figures."""
    found = []
    for index in range(SAMPLES):
        if index:
            await asyncio.sleep(SAMPLE_EVERY_S)
        entry: dict[str, Any] = {"at": time.time()}
        try:
            reading = await source.read("device")
            gpu = reading.gpus.get(gpu_uuid(uuid))
            entry["nvml"] = (
                None
                if gpu is None
                else {
                    "utilization": gpu.utilization,
                    "memory_used_mib": gpu.memory_used_mib,
                    "processes": gpu.processes,
                    "holders": None
                    if gpu.holders is None
                    else [[h.pid, h.kernel_id] for h in gpu.holders],
                }
            )
        except ActivityUnreadable as err:
            entry["nvml_error"] = str(err)
        entry["nvidia_smi"] = await asyncio.to_thread(smi_gpu, uuid)
        found.append(entry)
    return found


async def phase(holder: asyncio.subprocess.Process, name: str, log: list[Any]) -> None:
    """Wait for the holder to say it has begun ``name``."""
    assert holder.stdout is not None
    while True:
        line = await asyncio.wait_for(holder.stdout.readline(), PHASE_WITHIN_S)
        if not line:
            raise RuntimeError(f"the holder ended before {name}: {log}")
        said = json.loads(line)
        log.append(said)
        if said["phase"] == "error":
            raise RuntimeError(f"the holder failed: {said}")
        if said["phase"] == name:
            return


async def run(holder_command: Sequence[str]) -> dict[str, Any]:
    uuid = smi("--query-gpu=uuid", "--format=csv,noheader").splitlines()[0].strip()
    source = NvmlSource()
    steps: dict[str, Any] = {"no_process": await sample(source, uuid)}
    holder_log: list[Any] = []
    connection = Path(tempfile.gettempdir()) / f"kernel-{KERNEL_ID}.json"
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AS_KERNEL,
        f"--f={connection}",
        *holder_command,
        str(HOLD_MIB),
        str(IDLE_S),
        str(BUSY_S),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid},
        start_new_session=True,  # the "kernel" and its holder end together
    )
    try:
        for name, step in (
            ("holding", "held_idle"),
            ("busy", "busy"),
            ("idle_again", "idle_again"),
        ):
            await phase(holder, name, holder_log)
            await asyncio.sleep(SETTLE_S)
            steps[step] = await sample(source, uuid)
        await phase(holder, "exiting", holder_log)
        await asyncio.wait_for(holder.wait(), PHASE_WITHIN_S)
    finally:
        if holder.returncode is None:
            os.killpg(holder.pid, signal.SIGKILL)
            await holder.wait()
    steps["after_exit"] = await sample(source, uuid)
    return {
        "uuid": uuid,
        "gpu": smi("-i", uuid, "--query-gpu=name,driver_version", "--format=csv,noheader"),
        "held_mib": HOLD_MIB,
        # NVML names holders by the host's pids: read from another PID namespace, no
        # holder is named (and held_names_its_kernel fails for that reason, not NVML's).
        "in_initial_pid_namespace": in_initial_pid_namespace(),
        "holder": holder_log,
        "holder_exit": holder.returncode,
        "steps": steps,
    }


def verdict(steps: Mapping[str, Sequence[Mapping[str, Any]]], held_mib: float) -> dict[str, Any]:
    """Whether each step read as the reclaim policy needs (pure, so tests can check it)."""

    def nvml(step: str, key: str) -> list[Any]:
        return [s["nvml"][key] if s.get("nvml") else None for s in steps[step]]

    def smi_memory(step: str) -> float:
        return float(max(s["nvidia_smi"]["memory_used_mib"] for s in steps[step]))

    baseline = smi_memory("no_process")
    held_memory = nvml("held_idle", "memory_used_mib")
    checks = {
        "no_process_reads_0_processes": nvml("no_process", "processes") == [0] * SAMPLES,
        "held_reads_1_process": nvml("held_idle", "processes") == [1] * SAMPLES,
        "held_idle_reads_0_utilization": nvml("held_idle", "utilization") == [0.0] * SAMPLES,
        "held_memory_well_above_idle": all(
            m is not None and m > baseline + held_mib / 2 for m in held_memory
        ),
        "busy_reads_utilization": all((u or 0) > 0 for u in nvml("busy", "utilization")),
        "idle_again_reads_0_utilization": nvml("idle_again", "utilization")[-1] == 0.0,
        "after_exit_reads_0_processes": nvml("after_exit", "processes") == [0] * SAMPLES,
        "held_names_its_kernel": all(
            held and any(kernel == KERNEL_ID for _, kernel in held)
            for held in nvml("held_idle", "holders")
        ),
    }
    return {
        "checks": checks,
        "ok": all(checks.values()),
        "figures": {
            "memory_used_mib_no_process": baseline,
            "memory_used_mib_after_exit": smi_memory("after_exit"),
            "memory_used_mib_held_idle_nvml": held_memory,
            "memory_used_mib_held_idle_smi": smi_memory("held_idle"),
            # The context alone: what a holder costs beyond its own allocation.
            "context_overhead_mib": smi_memory("held_idle") - baseline - held_mib,
            "busy_utilization_nvml": nvml("busy", "utilization"),
        },
    }


def main(holder_binary: str, out: Path) -> int:
    result = asyncio.run(run([holder_binary]))
    result["verdict"] = verdict(result["steps"], result["held_mib"])
    (out / "gpu_activity_check.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result["verdict"], indent=2))
    return 0 if result["verdict"]["ok"] and result["holder_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
