"""Fixtures of the end-to-end suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hub import fabric_on_its_own
from harness.simulator import SimulatorProcess


@pytest.fixture
def external_fabric(tmp_path: Path) -> Iterator[SimulatorProcess]:
    """The fabric simulator as its own process (as in production), with fault switches."""
    with fabric_on_its_own(tmp_path, "--faults-api") as simulator:
        yield simulator
