"""Which device nodes a notebook may open, decided from the driver's own lists: its GPUs
by UUID, their control and unified-memory nodes, and nothing of its neighbours'."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from composespawner.launchers.gpu_devices import (
    BASIC_DEVICES,
    UnknownGpuNode,
    device_rules,
    gpu_device_rules,
    minors_in,
    unfound,
    uvm_major_in,
)

pytestmark = pytest.mark.timeout(10)

# As the NVIDIA driver 550 writes /proc/driver/nvidia/gpus/<bus>/information.
INFORMATION = """\
Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 1234
GPU UUID: \t GPU-3f5c0c62-aaaa-bbbb-cccc-0123456789ab
Video BIOS: \t 96.00.74.00.0d
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:18:00.0
Device Minor: \t 3
GPU Excluded:\t No
"""
PROC_DEVICES = """\
Character devices:
  1 mem
195 nvidia-frontend
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
"""


def test_the_driver_says_each_gpus_minor_by_uuid() -> None:
    other = INFORMATION.replace("3f5c0c62", "9a1e0000").replace("Minor: \t 3", "Minor: \t 0")
    assert minors_in([INFORMATION, other, "Model: something else\n"]) == {
        "gpu-3f5c0c62-aaaa-bbbb-cccc-0123456789ab": 3,
        "gpu-9a1e0000-aaaa-bbbb-cccc-0123456789ab": 0,
    }


def test_the_unified_memory_major_is_the_drivers() -> None:
    assert uvm_major_in(PROC_DEVICES) == 508
    assert uvm_major_in("Character devices:\n  1 mem\n") is None


def test_a_notebook_gets_its_own_gpus_nodes_control_and_uvm_and_no_others() -> None:
    rules = device_rules([3], 508)
    assert rules == (*BASIC_DEVICES, "c 195:3 rwm", "c 195:255 rwm", "c 508:* rwm")
    assert not any(rule.startswith("c 195:*") or rule.startswith("a") for rule in rules)


def test_a_notebook_without_gpus_gets_no_nvidia_node() -> None:
    assert device_rules([], 508) == BASIC_DEVICES
    assert not any(rule.startswith("c 195:") for rule in BASIC_DEVICES)


def test_gpus_the_driver_does_not_list_are_named() -> None:
    minors = {"gpu-3f5c0c62-aaaa-bbbb-cccc-0123456789ab": 3}
    asked = ["GPU-3F5C0C62-AAAA-BBBB-CCCC-0123456789AB", "GPU-ffff", "0"]
    assert unfound(asked, minors) == ["GPU-ffff", "0"]


def test_a_hosts_rules_are_read_from_its_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "gpus" / "0000:18:00.0"
    folder.mkdir(parents=True)
    (folder / "information").write_text(INFORMATION)
    devices = tmp_path / "devices"
    devices.write_text(PROC_DEVICES)
    uuid = "GPU-3f5c0c62-aaaa-bbbb-cccc-0123456789ab"
    assert gpu_device_rules([uuid], tmp_path, devices)[-3:] == (
        "c 195:3 rwm",
        "c 195:255 rwm",
        "c 508:* rwm",
    )
    with pytest.raises(UnknownGpuNode, match="no device node for GPUs GPU-ffff0000"):
        gpu_device_rules(["GPU-ffff0000"], tmp_path, devices)  # a MIG instance, say
    with caplog.at_level(logging.WARNING):  # no driver: no GPU to open, nor to give
        assert gpu_device_rules([uuid], tmp_path / "no-driver", devices) == BASIC_DEVICES
    assert "no NVIDIA driver" in caplog.text
    assert gpu_device_rules([], tmp_path, devices) == BASIC_DEVICES
