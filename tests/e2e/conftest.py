"""Fixtures of the end-to-end suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from composespawner.ledger import Ledger
from tests.hubharness import Hub, fabric_on_its_own
from tests.support.simulator import SimulatorProcess


@pytest.fixture
def external_fabric(tmp_path: Path) -> Iterator[SimulatorProcess]:
    """The fabric simulator as its own process (as in production), with fault switches."""
    with fabric_on_its_own(tmp_path, "--faults-api") as simulator:
        yield simulator


@pytest.fixture
def ledger(hub: Hub) -> Iterator[Ledger]:
    """The ledger of the module's hub, read beside it as the reconciler would."""
    ledger = Ledger(hub.ledger_url())
    try:
        yield ledger
    finally:
        ledger.close()
