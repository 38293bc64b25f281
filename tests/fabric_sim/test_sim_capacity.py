"""Each host's capacity, served on its system: what machines sharing it divide (issue 29)."""

from __future__ import annotations

from pathlib import Path

from harness.simulator import INVENTORY

from .harness import BLOCKS, SYSTEMS, StartSimulator


def test_systems_serve_their_hosts_cores_and_memory(start_simulator: StartSimulator) -> None:
    expandable = start_simulator().client.get(f"{SYSTEMS}/host-01").json
    specific = start_simulator("--composition", "specific").client
    body = {"Name": "s", "Links": {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/host-05-block"}]}}
    composed = specific.get(specific.post(SYSTEMS, body).headers["Location"]).json
    for system in (expandable, composed):
        assert system["ProcessorSummary"] == {
            "Count": 2,  # sockets
            "CoreCount": 64,
            "LogicalProcessorCount": 128,
        }
        assert system["MemorySummary"] == {"TotalSystemMemoryGiB": 512}


def test_an_older_inventory_gives_cpus_and_no_sockets(
    start_simulator: StartSimulator, tmp_path: Path
) -> None:
    demo = INVENTORY.read_text()
    assert "cores = 64\nsockets = 2" in demo
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(demo.replace("cores = 64\nsockets = 2", "cpus = 48", 1))
    client = start_simulator("--inventory", str(inventory)).client
    summary = client.get(f"{SYSTEMS}/host-01").json["ProcessorSummary"]
    # No sockets named: Count stays the cores, what clients before CoreCount read.
    assert summary == {"Count": 48, "CoreCount": 48, "LogicalProcessorCount": 96}
    assert client.get(f"{SYSTEMS}/host-05").json["ProcessorSummary"]["Count"] == 2
