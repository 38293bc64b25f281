"""What a person sees, in Debian's Chromium: the form, the progress page, JupyterLab.

Screenshots land in test-artifacts/ (the README's pictures come from here).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.hubharness import PASSWORD, Hub, running_hub, wait_for
from tests.paths import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
# Flags that let Chromium run as root on a closed network (TESTING.md).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as hub:
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


def log_in(page: Page, hub: Hub, user: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url("**/hub/**")


def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.mark.timeout(240)
def test_form_progress_and_arrival_in_jupyterlab(hub: Hub, page: Page) -> None:
    log_in(page, hub, "student1")
    page.goto(f"{hub.url}/hub/spawn")
    expect(page.locator('[data-model="t4"]')).to_contain_text("8 free")
    expect(page.locator("#compose-quota")).to_contain_text("4 of 4 GPUs left")
    expect(page.locator('[data-model="rtx6000"]')).to_have_count(0)
    assert shot(page, "spawn-form").stat().st_size > 10_000

    page.check("#gpu-t4")
    page.select_option("#gpu_count", "2")
    page.check("#net-25g")
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/spawn-pending/**")
    expect(page.locator("#progress-message")).to_contain_text("starting notebook", timeout=60_000)
    log = page.locator("#progress-log")
    expect(log).to_contain_text("attaching GPU 1/2 (NVIDIA T4)")
    expect(log).to_contain_text("attaching GPU 2/2 (NVIDIA T4)")
    shot(page, "spawn-progress")

    page.wait_for_url("**/user/student1/lab**", timeout=120_000)
    expect(page.locator(".jp-LauncherCard").first).to_be_visible(timeout=120_000)
    shot(page, "jupyterlab")
    hub.stop("student1")
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")


@pytest.mark.timeout(120)
def test_a_refusal_is_shown_on_the_form(hub: Hub, page: Page) -> None:
    log_in(page, hub, "student2")
    page.goto(f"{hub.url}/hub/spawn")
    # The browser only offers valid choices; forge a count to see the server's answer.
    page.evaluate(
        "document.querySelector('#gpu_count').innerHTML = '<option value=\"-4\">-4</option>'"
    )
    page.check("#gpu-t4")
    page.click("form input[type=submit], form button[type=submit]")
    expect(page.locator(".spawn-error-msg")).to_have_text(
        "Error: GPU count must be from 1 to 4 (the most one machine can hold); got -4."
    )
    shot(page, "spawn-refused")
    assert hub.composed_hosts() == {}
