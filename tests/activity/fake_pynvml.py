"""A strict stand-in for the ``pynvml`` module (nvidia-ml-py), for NvmlSource's tests.

Strict as the real library is: every call before ``nvmlInit`` raises
``NVMLError_Uninitialized``, a handle is only good from this module, an index past
the count is an invalid argument, and each ``nvmlShutdown`` must match an init. What
the tests change: whether the driver is there, and which GPUs are lost.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024

# The codes the real module gives these errors (pynvml's NVML_ERROR_* constants).
UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED = 1, 2, 3
DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GPU_IS_LOST = 9, 12, 15


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


# The error classes and functions keep pynvml's own names.
class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(UNINITIALIZED, "Uninitialized")


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(INVALID_ARGUMENT, "Invalid Argument")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NOT_SUPPORTED, "Not Supported")


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(DRIVER_NOT_LOADED, "Driver Not Loaded")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(GPU_IS_LOST, "GPU is lost")


@dataclass
class FakeGpu:
    uuid: str  # as NVML gives it: "GPU-..."
    utilization: int = 0
    used_mib: int = 3
    total_mib: int = 81920
    pids: tuple[int, ...] = ()
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST from every query
    no_utilization: bool = False  # MIG mode: utilisation is not supported


@dataclass(frozen=True)
class _Handle:
    owner: int  # id() of the FakeNvml that made it
    index: int


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: Callable[[], NVMLError] | None = None  # e.g. NVMLError_LibraryNotFound: no driver
    inits: int = 0
    calls: list[str] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        """This fake as a module named ``pynvml``."""
        module = types.ModuleType("pynvml")
        for name, value in globals().items():
            if name.startswith("NVMLError"):
                setattr(module, name, value)
        for name in FUNCTIONS:
            setattr(module, name, getattr(self, name))
        return module

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", self.module())

    # --- the functions NvmlSource may call (names as in pynvml) -------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._initialised()
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._initialised()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._initialised()
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return _Handle(id(self), index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        gpu = self._gpu(handle)
        if gpu.no_utilization:
            raise NVMLError_NotSupported()
        return _Utilization(gpu.utilization, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> _Memory:
        gpu = self._gpu(handle)
        return _Memory(
            gpu.total_mib * MIB, (gpu.total_mib - gpu.used_mib) * MIB, gpu.used_mib * MIB
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_Process]:
        return [_Process(pid, 256 * MIB) for pid in self._gpu(handle).pids]

    # --- strictness -----------------------------------------------------------------

    def _initialised(self) -> None:
        if self.inits <= 0:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: _Handle) -> FakeGpu:
        self._initialised()
        if not isinstance(handle, _Handle) or handle.owner != id(self):
            raise NVMLError_InvalidArgument()
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu


FUNCTIONS = tuple(name for name in vars(FakeNvml) if name.startswith("nvml"))
ERRORS = tuple(name for name in globals() if name.startswith("NVMLError"))
