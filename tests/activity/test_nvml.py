"""NvmlSource against a strict fake ``pynvml`` (monkeypatched into sys.modules), and the
real pynvml on whatever host the tests run on."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable

import pytest

from composespawner.activity import ActivitySource, ActivityUnreadable
from composespawner.activity.nvml import NvmlSource
from composespawner.domain.activity import GpuActivity, Holder

from .fake_pynvml import (
    ERRORS,
    FUNCTIONS,
    FakeGpu,
    FakeNvml,
    NVMLError,
    NVMLError_LibraryNotFound,
)

A = "GPU-0AB1C2D3-0000-1111-2222-333344445555"
B = "GPU-9f8e7d6c-0000-1111-2222-333344445555"


def fake(
    monkeypatch: pytest.MonkeyPatch,
    *gpus: FakeGpu,
    init_error: Callable[[], NVMLError] | None = None,
) -> FakeNvml:
    nvml = FakeNvml(list(gpus), init_error=init_error)
    nvml.install(monkeypatch)
    return nvml


def test_the_fake_speaks_the_real_modules_names() -> None:
    real = importlib.import_module("pynvml")  # nvidia-ml-py is a dependency
    assert [name for name in (*FUNCTIONS, *ERRORS) if not hasattr(real, name)] == []


async def test_reads_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake(
        monkeypatch,
        FakeGpu(A, utilization=0, used_mib=3),
        FakeGpu(B, utilization=87, used_mib=20480, pids=(4242, 4343)),
    )
    # Naming holders is /proc's (tests/activity/test_processes.py): here it says kernel k<pid>.
    source = NvmlSource(
        clock=lambda: 7.0, name_holders=lambda pids: tuple(Holder(p, f"k{p}") for p in pids)
    )
    assert isinstance(source, ActivitySource)
    reading = await source.read("host-01")
    assert (reading.host_id, reading.at) == ("host-01", 7.0)
    assert dict(reading.gpus) == {
        "0ab1c2d3-0000-1111-2222-333344445555": GpuActivity(
            "0ab1c2d3-0000-1111-2222-333344445555", 0.0, 3.0, 0, ()
        ),
        "9f8e7d6c-0000-1111-2222-333344445555": GpuActivity(
            "9f8e7d6c-0000-1111-2222-333344445555",
            87.0,
            20480.0,
            2,
            (Holder(4242, "k4242"), Holder(4343, "k4343")),
        ),
    }
    assert nvml.inits == 0  # every init was shut down again
    assert nvml.calls == ["nvmlInit", "nvmlShutdown"]


async def test_no_driver_is_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake(monkeypatch, FakeGpu(A), init_error=NVMLError_LibraryNotFound)
    with pytest.raises(ActivityUnreadable) as caught:
        await NvmlSource().read("host-01")
    assert str(caught.value).startswith("GPU activity of host-01 unreadable from NVML: NVML:")
    assert "NVML Shared Library Not Found" in caught.value.why
    assert "driver" in caught.value.why
    assert nvml.calls == ["nvmlInit"]  # nothing else was tried, nothing to shut down


async def test_a_gpu_lost_mid_read_is_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = fake(monkeypatch, FakeGpu(A, lost=True), FakeGpu(B, used_mib=900, pids=(1,)))
    with caplog.at_level(logging.WARNING, logger="composespawner.activity.nvml"):
        reading = await NvmlSource().read("host-01")
    # The lost GPU is unknown (absent), never idle; the other is read.
    assert list(reading.gpus) == ["9f8e7d6c-0000-1111-2222-333344445555"]
    assert "GPU 0 left out" in caplog.text
    assert "GPU is lost" in caplog.text
    assert nvml.inits == 0


async def test_a_gpu_without_utilisation_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, FakeGpu(A, no_utilization=True), FakeGpu(B))
    reading = await NvmlSource().read("h")
    assert list(reading.gpus) == ["9f8e7d6c-0000-1111-2222-333344445555"]


async def test_missing_package_is_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with pytest.raises(ActivityUnreadable, match="nvidia-ml-py package is not installed"):
        await NvmlSource().read("h")


async def test_a_stuck_driver_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    release = threading.Event()
    nvml = fake(monkeypatch, FakeGpu(A))

    def stuck() -> int:
        release.wait(10)  # the driver hangs until the test lets go
        return 1

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlDeviceGetCount", stuck)
    try:
        with pytest.raises(ActivityUnreadable, match=r"no answer within 0\.2s"):
            await NvmlSource(timeout=0.2).read("h")
    finally:
        release.set()
    assert nvml.calls[0] == "nvmlInit"


async def test_real_pynvml_on_this_host() -> None:
    """No driver here: unreadable, with NVML's reason; on a GPU host: a reading."""
    real = importlib.import_module("pynvml")
    try:
        real.nvmlInit()
    except real.NVMLError:
        with pytest.raises(ActivityUnreadable, match="NVML: cannot start"):
            await NvmlSource().read("h")
        return
    real.nvmlShutdown()
    reading = await NvmlSource().read("h")
    assert all(gpu.processes is not None for gpu in reading.gpus.values())
