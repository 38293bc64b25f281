"""Parsing the inventory TOML into specs."""

from __future__ import annotations

from typing import Any

import pytest

from fabricsim.inventory import (
    InventoryError,
    load_inventory,
    parse_inventory,
)
from harness.simulator import INVENTORY


def minimal(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "zones": [{"id": "z1"}],
        "chassis": [{"id": "c1", "type": "Rack"}],
        "hosts": [{"prefix": "h", "count": 2, "zone": "z1", "chassis": "c1", "cpus": 8,
                   "memory_gib": 64}],
        "devices": [{"prefix": "g", "count": 1, "kind": "gpu", "chassis": "c1", "zones": ["z1"],
                     "manufacturer": "NVIDIA", "model": "T4", "memory_gib": 16}],
    }  # fmt: skip
    document.update(overrides)
    return document


def test_hub_inventory_expands_groups() -> None:
    spec = load_inventory(INVENTORY)
    assert [h.id for h in spec.hosts] == [f"host-0{n}" for n in range(1, 9)]
    assert spec.host("host-05") is not None
    assert spec.hosts[4].zones == ("rack-2",)
    assert len(spec.devices) == 50
    gpu = spec.device("r1-a100-1")
    assert gpu is not None
    assert (gpu.kind, gpu.memory_gib, gpu.zones) == ("gpu", 80, ("rack-1",))
    assert spec.device("r1-a100-4") is not None
    assert spec.device("r1-a100-5") is None
    shared = spec.device("x1-rtx6000-2")
    assert shared is not None
    assert shared.zones == ("rack-1", "rack-2")
    assert [c.type for c in spec.chassis] == ["Rack", "Rack", "Expansion"]
    assert spec.block_ids()[:2] == ("host-01-block", "host-02-block")
    assert spec.host_of_block("host-08-block") == spec.host("host-08")
    assert spec.host_of_block("r1-t4-1") is None


def test_first_and_zones_list_are_honoured() -> None:
    spec = parse_inventory(minimal(hosts=[{"prefix": "n", "first": 9, "count": 2,
                                           "zones": ["z1"], "chassis": "c1", "cpus": 1,
                                           "memory_gib": 1}]))  # fmt: skip
    assert [h.id for h in spec.hosts] == ["n-09", "n-10"]


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"chassis": [{"id": "c1", "type": "Spaceship"}]}, "Spaceship"),
        ({"zones": []}, "unknown zones"),
        ({"zones": [{"id": "z1"}, {"id": "z1"}]}, "duplicate zone"),
        ({"devices": [{"prefix": "g", "count": 1, "kind": "tpu"}]}, "kind"),
        ({"devices": [{"prefix": "g", "count": 1, "kind": "nic", "chassis": "c1",
                       "zones": ["z1"], "manufacturer": "x", "model": "y"}]}, "speed_gbps"),
        ({"hosts": [{"prefix": "h", "count": "2", "zone": "z1", "chassis": "c1", "cpus": 1,
                     "memory_gib": 1}]}, "count"),
        ({"hosts": "h"}, "array of tables"),
    ],
)  # fmt: skip
def test_inconsistent_inventories_are_refused(overrides: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InventoryError, match=complaint):
        parse_inventory(minimal(**overrides))


def test_hosts_give_cores_or_older_files_cpus() -> None:
    older = parse_inventory(minimal())
    assert [(h.cores, h.cpus, h.sockets, h.memory_gib) for h in older.hosts] == [
        (8, 8, None, 64)
    ] * 2
    group = {"prefix": "h", "count": 1, "zone": "z1", "chassis": "c1", "memory_gib": 64}
    newer = parse_inventory(minimal(hosts=[{**group, "cores": 96, "sockets": 2, "cpus": 4}]))
    assert (newer.hosts[0].cores, newer.hosts[0].sockets) == (96, 2)  # cores wins over cpus


@pytest.mark.parametrize(
    ("sizes", "complaint"),
    [({}, "`cores` must be an integer"), ({"cores": 0}, "at least 1"),
     ({"cpus": 8, "sockets": 0}, "`sockets` must be at least 1")],
)  # fmt: skip
def test_host_sizes_are_checked(sizes: dict[str, Any], complaint: str) -> None:
    group = {"prefix": "h", "count": 1, "zone": "z1", "chassis": "c1", "memory_gib": 64}
    with pytest.raises(InventoryError, match=complaint):
        parse_inventory(minimal(hosts=[{**group, **sizes}]))


def test_unreadable_file(tmp_path: Any) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "missing.toml")
