"""A composer on the demo's catalog and fabric inventory, its fabric the strict fake."""

from __future__ import annotations

from pathlib import Path

from composespawner.domain.catalog import Catalog
from composespawner.ledger import Ledger
from composespawner.services.composer import Composer
from harness.paths import HUB_CONFIG
from tests.support.faulty import FaultyFabric


def demo_composer(tmp_path: Path, ledger_class: type[Ledger] = Ledger) -> Composer:
    """A composer with a fresh SQLite ledger in ``tmp_path`` and no snapshot caching."""
    ledger = ledger_class(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.upgrade()
    return Composer(
        ledger=ledger,
        fabric=FaultyFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml"),
        catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
        hub_id="test-hub",
        snapshot_ttl=0,
    )
