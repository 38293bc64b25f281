"""What a GPU was doing when last read: pure values shared by the activity sources and the
reclaim policy.

A source (DCGM exporter, NVML) turns what it read into an ``ActivityReading``; the policy
folds readings into its watch. Everything keys by ``gpu_uuid``: the UUID nvidia-smi shows,
without its "GPU-" prefix, lower-cased, so both sources and the inventory agree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

_UUID_PREFIX = "gpu-"


def gpu_uuid(text: str) -> str:
    """The key a GPU is known by: ``text`` without an optional "GPU-" prefix, lower-cased."""
    key = text.strip().lower()
    if key.startswith(_UUID_PREFIX):
        key = key[len(_UUID_PREFIX) :]
    return key


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """A process holding a context on a GPU, and the Jupyter kernel it belongs to.

    ``kernel_id`` is the kernel whose process (or whose child, such as a data loader's
    worker) it is, as Jupyter Server names kernels; None: not a kernel's (a terminal's
    program, a process that ended before it could be looked up).
    """

    pid: int
    kernel_id: str | None = None
    # The account the process runs as (its real uid), where the source can tell: a
    # process names its kernel on its own command line, so that word counts only for a
    # process of the server's own account (see owned_by).
    uid: int | None = None

    @property
    def key(self) -> str:
        """Who holds it, as the reclaimer compares holders across GPUs and keeps them: the
        kernel (its processes are one holder), else the process."""
        return f"{KERNEL_KEY}{self.kernel_id}" if self.kernel_id else f"{PROCESS_KEY}{self.pid}"


KERNEL_KEY, PROCESS_KEY = "kernel:", "pid:"


def kernel_in(key: str) -> str | None:
    """The kernel id a holder's ``key`` names; None for a process that is no kernel's."""
    return key[len(KERNEL_KEY) :] if key.startswith(KERNEL_KEY) else None


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """One reading of one GPU, by the UUID nvidia-smi shows (without the "GPU-" prefix,
    lower-case)."""

    uuid: str
    utilization: float  # percent of the sample period a kernel ran, 0..100
    memory_used_mib: float  # framebuffer in use
    processes: int | None  # compute processes holding a context; None: the source cannot tell
    # Those processes, where the source can name them (NVML on the notebooks' own host);
    # None: it cannot (DCGM names none), so which kernel holds the GPU is unknown.
    holders: tuple[Holder, ...] | None = None


@dataclass(frozen=True, slots=True)
class ActivityReading:
    """What one source said about one compute host at one moment."""

    host_id: str
    at: float  # time.time() of the read
    gpus: Mapping[str, GpuActivity]  # uuid -> activity; a GPU not listed is UNKNOWN, never idle


def holds_context(gpu: GpuActivity, memory_floor_mib: float) -> bool:
    """Whether something holds the GPU: a compute process when the source counts them, else
    framebuffer above the floor (a CUDA context takes hundreds of MiB; a GPU nobody holds
    shows a few)."""
    if gpu.processes is not None:
        return gpu.processes > 0
    return gpu.memory_used_mib > memory_floor_mib


def did_work(gpu: GpuActivity, busy_percent: float) -> bool:
    """Whether a kernel ran for more than ``busy_percent`` of the sample period."""
    return gpu.utilization > busy_percent


def owned_by(gpu: GpuActivity, uids: Collection[int] | None) -> GpuActivity:
    """``gpu`` with a holder's kernel believed only where its process runs as one of
    ``uids`` (the accounts of the notebooks that hold the GPU).

    Any process can put ``kernel-<id>.json`` on its command line, another user's kernel
    id too, and a reclaim ends the kernels its holders name: one of another account is
    a process that holds the GPU, never a kernel of the server. ``uids`` None (whose the
    notebooks are is not known), or a holder whose account was not read: the holders
    are unknown, as a source that names none (unknown is never a stranger's word).
    """
    if gpu.holders is None:
        return gpu
    if uids is None or any(h.kernel_id and h.uid is None for h in gpu.holders):
        return replace(gpu, holders=None)
    return replace(
        gpu,
        holders=tuple(
            h if h.kernel_id is None or h.uid in uids else replace(h, kernel_id=None)
            for h in gpu.holders
        ),
    )
