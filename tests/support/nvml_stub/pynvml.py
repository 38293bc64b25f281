"""``pynvml`` for a hub's reclaimer under test: the strict fake of ``tests/activity``, whose
GPUs are read from the JSON file ``$FAKE_NVML_STATE`` at every ``nvmlInit`` (a list of
``FakeGpu`` fields: ``uuid`` as NVML gives it, ``utilization``, ``used_mib``, ``pids``;
the pids of processes that have ended are left out, as the driver does), or the string
``"no driver"``: NVML then cannot start, as on a host whose NVIDIA driver is not loaded.

It stands where the NVIDIA driver would, and only in the reclaimer's environment
(``PYTHONPATH`` of that service): the tests write the file (atomically) to say which
processes hold which GPU, and everything above NVML is the real code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.activity import fake_pynvml
from tests.activity.fake_pynvml import FUNCTIONS, FakeGpu, FakeNvml

_nvml = FakeNvml()


def nvmlInit() -> None:
    state = json.loads(Path(os.environ["FAKE_NVML_STATE"]).read_text())
    no_driver = state == "no driver"
    _nvml.init_error = fake_pynvml.NVMLError_DriverNotLoaded if no_driver else None
    state = [] if no_driver else state
    _nvml.gpus = [FakeGpu(**{**gpu, "pids": _alive(gpu.get("pids", ()))}) for gpu in state]
    _nvml.nvmlInit()


def _alive(pids: list[int]) -> tuple[int, ...]:
    """As the driver lists them: a CUDA context ends with its process."""
    return tuple(pid for pid in pids if Path(f"/proc/{pid}").exists())


def __getattr__(name: str) -> Any:
    """The fake's other functions and pynvml's error classes, by their pynvml names."""
    if name in FUNCTIONS:
        return getattr(_nvml, name)
    if name.startswith("NVMLError"):
        return getattr(fake_pynvml, name)
    raise AttributeError(name)
