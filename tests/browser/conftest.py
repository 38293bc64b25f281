"""A hub, a browser and a fresh page for each browser test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from harness.browser import CHROMIUM, FLAGS
from harness.hub import Hub, fabric_on_its_own, running_hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """The demo hub, its fabric a process of its own whose faults a test may switch on."""
    tmp = tmp_path_factory.mktemp("hub")
    with (
        fabric_on_its_own(tmp, "--faults-api") as fabric,
        running_hub(tmp, fabric_port=fabric.port) as hub,
    ):
        yield hub


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    yield page
    context.close()
