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
        # The demo inventory names no sockets: Count stays what older clients read as cores.
        assert system["ProcessorSummary"] == {
            "Count": 64,
            "CoreCount": 64,
            "LogicalProcessorCount": 128,
        }
        assert system["MemorySummary"] == {"TotalSystemMemoryGiB": 512}


def test_an_inventory_with_cores_and_sockets(
    start_simulator: StartSimulator, tmp_path: Path
) -> None:
    text = INVENTORY.read_text().replace("cpus = 64", "cores = 96\nsockets = 2", 1)
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(text)
    client = start_simulator("--inventory", str(inventory)).client
    summary = client.get(f"{SYSTEMS}/host-01").json["ProcessorSummary"]
    assert summary == {"Count": 2, "CoreCount": 96, "LogicalProcessorCount": 192}
    assert client.get(f"{SYSTEMS}/host-05").json["ProcessorSummary"]["CoreCount"] == 64
