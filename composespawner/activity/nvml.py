"""GPU activity from NVML on this host (``pynvml``, from the ``nvidia-ml-py`` package).

Unlike the DCGM exporter, NVML lists the compute processes holding a context on each
GPU, so a reading from here says who holds a GPU, not only how much memory is in use:
each process with the Jupyter kernel it belongs to (:mod:`.processes`), so that a
reclaim shuts down only the kernels holding the GPU it takes.

``pynvml`` is imported when a read happens, not when this module is: a host without
the NVIDIA driver (or without the package) gets :class:`ActivityUnreadable`
("NVML: ...") from :meth:`NvmlSource.read`, and everything else still imports.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from composespawner.activity import ActivityUnreadable
from composespawner.activity.processes import holders_of
from composespawner.domain.activity import ActivityReading, GpuActivity, Holder, gpu_uuid

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0  # seconds for one whole read: NVML answers in milliseconds when well
MIB = 1024 * 1024
WHERE = "NVML"


class NvmlSource:
    """Reads the GPUs of the host it runs on (an :class:`ActivitySource`).

    ``host_id`` only names the reading: NVML sees this host's GPUs and no other's.
    A GPU that fails mid-read (lost, fallen off the bus, MIG without utilisation) is
    left out of the reading, so it counts as unknown, never idle; the others are read.
    ``name_holders`` names the processes NVML lists on a GPU (None: they cannot be named
    here); by default from this host's ``/proc`` (:func:`.processes.holders_of`).
    """

    def __init__(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        clock: Callable[[], float] = time.time,
        name_holders: Callable[[list[int]], tuple[Holder, ...] | None] = holders_of,
    ) -> None:
        self.timeout = timeout
        self._clock = clock
        self._name_holders = name_holders

    async def read(self, host_id: str) -> ActivityReading:
        # NVML blocks; a thread keeps the event loop free. A thread stuck in the driver
        # cannot be cancelled: the timeout stops the wait, the thread ends when NVML does.
        try:
            gpus = await asyncio.wait_for(
                asyncio.to_thread(read_gpus, self._name_holders), self.timeout
            )
        except TimeoutError as err:
            raise ActivityUnreadable(host_id, WHERE, f"no answer within {self.timeout:g}s") from err
        except NvmlUnreadable as err:
            raise ActivityUnreadable(host_id, WHERE, str(err)) from err
        return ActivityReading(host_id, self._clock(), gpus)


class NvmlUnreadable(Exception):
    """NVML could not be read at all (no driver, no package); the message says why."""


def read_gpus(
    name_holders: Callable[[list[int]], tuple[Holder, ...] | None] = holders_of,
) -> dict[str, GpuActivity]:
    """This host's GPUs now, by UUID (blocking: NVML answers in milliseconds when well).
    Raises :class:`NvmlUnreadable`; a GPU that fails mid-read is left out (unknown)."""
    nvml = _pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnreadable(
            f"NVML: cannot start ({_said(err)}); is the NVIDIA driver loaded?"
        ) from err
    try:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            raise NvmlUnreadable(f"NVML: cannot count GPUs ({_said(err)})") from err
        gpus = {}
        for index in range(count):
            gpu = _read_gpu(nvml, index, name_holders)
            if gpu is not None:
                gpus[gpu.uuid] = gpu
        return gpus
    finally:
        _shutdown(nvml)


def _pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as err:
        raise NvmlUnreadable(f"NVML: the nvidia-ml-py package is not installed ({err})") from err


def _read_gpu(
    nvml: Any, index: int, name_holders: Callable[[list[int]], tuple[Holder, ...] | None]
) -> GpuActivity | None:
    """GPU ``index`` now, or None (logged) when NVML cannot read it whole."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory_used = nvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
        pids = [process.pid for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except nvml.NVMLError as err:
        log.warning("NVML: GPU %d left out of this reading: %s", index, _said(err))
        return None
    return GpuActivity(
        gpu_uuid(uuid), utilization, float(memory_used), len(pids), name_holders(pids)
    )


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as err:  # the reading is already made; nothing to undo
        log.warning("NVML: shutdown failed: %s", _said(err))


def _text(value: str | bytes) -> str:
    """A string NVML gave (older pynvml releases give bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
