"""The agent's tests' host fixture (see :mod:`tests.hostagent.hosts`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostagent.hosts import Host, clean, make_host


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    if os.geteuid() != 0:
        pytest.fail("the host agent's tests run as root (it makes accounts and cgroups)")
    made = make_host(tmp_path)
    try:
        yield made
    finally:
        clean(made)
