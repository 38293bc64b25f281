"""Fixtures of the SSH launcher's suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from jupyterhub import orm
from jupyterhub.user import User

from composespawner.launchers.ssh import SSHLauncher
from tests.support.fake_agent import FakeAgent


@pytest.fixture
def users() -> Iterator[list[User]]:
    """Three hub users (ada, bob, cy), in an in-memory hub database."""
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add_all([orm.User(name=n) for n in ("ada", "bob", "cy")])
    db.commit()
    yield [User(u, {}) for u in db.query(orm.User).order_by(orm.User.name)]
    db.close()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[FakeAgent]:
    """A strict in-process agent; the launchers' shared links and their class state
    (running notebooks, stops owed, the ledger's states) are reset after it."""
    async with FakeAgent(tmp_path) as agent:
        yield agent
        await SSHLauncher.links.close()
        SSHLauncher._running.clear()
        SSHLauncher._owed.clear()
        SSHLauncher._ledger_states = None
