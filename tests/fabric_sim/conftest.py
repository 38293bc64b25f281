"""Fixtures for the fabric simulator's tests: simulator processes, stopped in teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.tls import TLSFiles, make_tls_files

from .harness import RedfishClient, SimulatorProcess, StartSimulator


@pytest.fixture
def start_simulator(tmp_path: Path) -> Iterator[StartSimulator]:
    """Start simulators with extra CLI arguments; all are stopped in teardown."""
    started: list[SimulatorProcess] = []

    def start(*args: str, tls: TLSFiles | None = None) -> SimulatorProcess:
        log_path = tmp_path / f"simulator-{len(started)}.log"
        simulator = SimulatorProcess(args, log_path, tls=tls)
        started.append(simulator)
        simulator.start()
        return simulator

    yield start
    for simulator in started:
        simulator.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A CA and a certificate for 127.0.0.1, for simulators serving https."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def simulator(start_simulator: StartSimulator, tmp_path: Path) -> SimulatorProcess:
    """A synchronous simulator with the faults API and a state file."""
    return start_simulator("--faults-api", "--state-file", str(tmp_path / "state.json"))


@pytest.fixture
def client(simulator: SimulatorProcess) -> RedfishClient:
    return simulator.client
