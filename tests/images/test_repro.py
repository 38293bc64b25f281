"""The repro helper's records and their comparison (its framework parts run in the stacks)."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from harness.paths import ROOT


def load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("repro", ROOT / "images" / "common" / "repro.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["repro"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["repro"]
    return module


repro = load_helper()


def a_record(**changes: object) -> object:
    record = repro.Record(
        seed=7,
        versions={"python": "3.11.2", "torch": "2.13.0"},
        device={"kind": "cpu", "cpu": "x86_64"},
        data_order=repro.order_hash(range(100)),
        weights="ab" * 32,
        metric=0.93,
    )
    return replace(record, **changes)


def test_equal_records_have_no_differences() -> None:
    assert repro.compare(a_record(), a_record()) == []


def test_a_changed_version_is_named() -> None:
    other = a_record(versions={"python": "3.11.2", "torch": "2.12.1"}, weights="cd" * 32)
    differences = repro.compare(a_record(), other)
    assert differences[0] == "version of torch: 2.13.0 vs 2.12.1"
    assert any(d.startswith("final weights") for d in differences)


def test_a_framework_missing_on_one_side_is_named() -> None:
    other = a_record(versions={"python": "3.11.2"})
    assert repro.compare(a_record(), other) == ["version of torch: 2.13.0 vs absent"]


def test_another_data_order_is_named() -> None:
    shuffled = list(range(100))
    shuffled[3], shuffled[4] = shuffled[4], shuffled[3]
    other = a_record(data_order=repro.order_hash(shuffled), metric=0.92)
    assert repro.compare(a_record(), other) == [
        "data order: the data was seen in another order",
        "metric: 0.93 vs 0.92",
    ]
    assert repro.compare(a_record(), other, metric_tolerance=0.02) == [
        "data order: the data was seen in another order"
    ]


def test_device_and_seed_differences_are_named() -> None:
    gpu = {"kind": "gpu", "gpus": ["NVIDIA H100 PCIe"], "driver": "580.65"}
    differences = repro.compare(a_record(), a_record(device=gpu, seed=8))
    assert differences == [
        "device: CPU x86_64 vs NVIDIA H100 PCIe (driver 580.65)",
        "seed: 7 vs 8",
    ]


def test_a_record_saves_and_loads_unchanged(tmp_path: Path) -> None:
    record = a_record(notes={"kit": "digits"})
    path = record.save(tmp_path / "run.json")
    assert json.loads(path.read_text())["notes"] == {"kit": "digits"}
    assert repro.load(path) == record


def test_record_describes_this_python_and_hashes_the_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"stack": {"id": "pytorch", "lock_sha256": "f" * 64}}))
    monkeypatch.setenv("COMPOSE_RUN_MANIFEST", str(manifest))
    record = repro.record(seed=3, data_order=[2, 0, 1], metric=1)
    assert record.versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record.data_order == repro.order_hash([2, 0, 1]) != repro.order_hash([0, 1, 2])
    assert record.stack == {"id": "pytorch", "lock_sha256": "f" * 64, "image_digest": None}
    assert record.metric == 1.0
    assert record.weights is None


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True, "7"])
def test_a_seed_out_of_range_is_refused(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be an integer"):
        repro.seed_everything(seed)
