"""Fixtures shared by the suites that run a hub (``tests/ledger`` has a ``ledger`` of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from composespawner.ledger import Ledger
from harness.hub import Hub


@pytest.fixture
def ledger(hub: Hub) -> Iterator[Ledger]:
    """The ledger of the module's hub, read beside it as the reconciler would."""
    ledger = Ledger(hub.ledger_url())
    try:
        yield ledger
    finally:
        ledger.close()
