"""Fixtures for the Redfish client's tests: the DMTF mockup and a scripted fake service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from composespawner.fabric.redfish import RedfishFabric, RedfishRetry, RedfishTimeouts
from tests.support.mockserver import MockupServer

from .fake_redfish import PASSWORD, USER, FakeRedfish, FakeRedfishServer

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """The read-only ``shared`` directory beside the repository root."""
    return REPO_ROOT.parent / "shared"


COMPOSABILITY_MOCKUP = shared_dir() / "redfish" / "mockups" / "public-composability"
MOCKUP_CREDENTIALS = ("mockreader", "mock-pass")

# Short enough that the fault tests finish fast, long enough for 2 slow cores.
FAST_TIMEOUTS = RedfishTimeouts(connect=1.0, request=1.0, operation=5.0, task_poll_max=0.05)
FAST_RETRY = RedfishRetry(attempts=4, backoff_first=0.01, backoff_max=0.05, etag_attempts=3)


@pytest.fixture
async def mockup_server() -> AsyncIterator[MockupServer]:
    server = MockupServer(COMPOSABILITY_MOCKUP, credentials=MOCKUP_CREDENTIALS)
    server.listen()
    yield server
    await server.stop()


@pytest.fixture
async def fake_service() -> AsyncIterator[FakeRedfishServer]:
    server = FakeRedfishServer(FakeRedfish())
    server.start()
    yield server
    await server.stop()


@pytest.fixture
async def fabric(fake_service: FakeRedfishServer) -> AsyncIterator[RedfishFabric]:
    client = RedfishFabric(
        fake_service.url,
        username=USER,
        password=PASSWORD,
        timeouts=FAST_TIMEOUTS,
        retry=FAST_RETRY,
    )
    yield client
    await client.close()
