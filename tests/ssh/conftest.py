"""Fixtures of the SSH launcher's suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from jupyterhub import orm
from jupyterhub.user import User


@pytest.fixture
def users() -> Iterator[list[User]]:
    """Three hub users (ada, bob, cy), in an in-memory hub database."""
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add_all([orm.User(name=n) for n in ("ada", "bob", "cy")])
    db.commit()
    yield [User(u, {}) for u in db.query(orm.User).order_by(orm.User.name)]
    db.close()
