"""A fabric that hangs (SIGSTOP: connections accepted, never answered) hangs no page.

The simulator runs as a process of the test's own, so the test can freeze it
and thaw it (always, in a ``finally``: ``SimulatorProcess.hung``). While it is frozen:

* the spawn form renders within 2 s: the last inventory with its age, or, with
  none ever read, the "not answering" banner and no Start button to press;
* a spawn is refused within a few seconds with a message, nothing claimed;
* a stop returns within a few seconds, the machine ``stopping`` with its devices
  still held (unknown is not dead); once the fabric answers they are freed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from composespawner.ledger import Ledger
from harness.browser import CHROMIUM, FLAGS
from harness.hub import PASSWORD, Hub, fabric_on_its_own, running_hub, wait_for
from harness.simulator import SimulatorProcess
from tests.e2e.test_faults import TWO_T4, ledger_ready

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
# Every form and spawn asks the fabric afresh, as they do whenever nobody asked
# in the last few seconds (the cache lasts 3 s).
NO_INVENTORY_CACHE = "c.ComposeSpawner.inventory_cache_seconds = 0\n"
FORM_S = 2.0  # the bound for the form
FEW_S = 10.0  # "a few seconds" for a refused spawn and a stop, on a loaded machine


@contextmanager
def hub_on(tmp: Path, fabric: SimulatorProcess) -> Iterator[Hub]:
    # The reconciler is tested elsewhere: here the hub alone must cope.
    with running_hub(
        tmp, NO_INVENTORY_CACHE, fabric_port=fabric.port, COMPOSE_RECONCILE_EVERY="3600"
    ) as hub:
        yield hub


@pytest.fixture
def page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def timed_form(page: Page, hub: Hub) -> float:
    began = time.monotonic()
    response = page.goto(f"{hub.url}/hub/spawn")
    took = time.monotonic() - began
    assert response is not None
    assert response.status == 200
    return took


def shows(page: Page, hub: Hub, text: str) -> bool:
    page.goto(f"{hub.url}/hub/spawn")
    return text in page.content()


@pytest.mark.timeout(300)
def test_the_form_renders_within_2_s_whatever_the_fabric_does(tmp_path: Path, page: Page) -> None:
    start = page.locator("#spawn_form [type=submit]")
    with fabric_on_its_own(tmp_path) as fabric, hub_on(tmp_path, fabric) as hub:
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", "student1")
        page.fill("#password_input", PASSWORD)
        with fabric.hung():  # before this hub ever read the inventory
            began = time.monotonic()
            page.click("#login_submit")  # the landing page is the form
            page.wait_for_url("**/hub/spawn")
            took = time.monotonic() - began
            expect(page.locator("#compose-unavailable")).to_contain_text("not answering")
            expect(start).to_be_disabled()
        assert took < FORM_S, f"login to form took {took:.1f} s with no inventory to show"

        wait_for(lambda: shows(page, hub, "8 free"), 30, "the free counts once it answers")
        expect(page.locator("#compose-stale")).to_have_count(0)

        with fabric.hung():
            took = timed_form(page, hub)
            expect(page.locator("#compose-stale")).to_contain_text(
                "the GPU fabric is slow to answer"
            )
            expect(page.locator('[data-model="t4"]')).to_contain_text("8 free")
            expect(start).to_be_enabled()
        assert took < FORM_S, f"the form took {took:.1f} s with an inventory to show"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    with fabric_on_its_own(tmp_path_factory.mktemp("fabric")) as fabric:
        yield fabric


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, fabric: SimulatorProcess) -> Iterator[Hub]:
    with hub_on(tmp_path_factory.mktemp("hub"), fabric) as hub:
        yield ledger_ready(hub)


@pytest.mark.timeout(180)
def test_a_spawn_meeting_a_hung_fabric_is_refused_within_seconds(
    hub: Hub, fabric: SimulatorProcess, ledger: Ledger
) -> None:
    with fabric.hung():
        began = time.monotonic()
        response = hub.spawn("student2", TWO_T4)
        took = time.monotonic() - began
        assert response.status_code == 503, response.text
        message = str(response.json()["message"])
        assert "GPU fabric is not answering" in message, message
        assert "nothing was claimed" in message, message
        assert took < FEW_S, f"the refusal took {took:.1f} s"
        assert ledger.live_machine("student2", "") is None
        assert ledger.holders() == {}
    hub.wait_gone("student2")


@pytest.mark.timeout(240)
def test_a_stop_returns_at_once_and_the_release_finishes_when_the_fabric_answers(
    hub: Hub, fabric: SimulatorProcess, ledger: Ledger
) -> None:
    response = hub.spawn("student1", TWO_T4)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    [machine] = ledger.live_machines("student1")
    held = ledger.holders()
    assert len(held) == 2  # its two GPUs: the host is shared, its block nobody's

    with fabric.hung():
        began = time.monotonic()
        response = hub.request("DELETE", "/users/student1/server")
        took = time.monotonic() - began
        assert response.status_code == 204, response.text
        assert took < FEW_S, f"the stop took {took:.1f} s"
        assert hub.server("student1") is None
        stopping = ledger.machine(machine.id)
        assert stopping is not None
        assert stopping.state == "stopping"
        assert ledger.holders() == held, "freed without the fabric's word"

    wait_for(lambda: ledger.holders() == {}, 60, "the devices freed in the ledger")
    released = ledger.machine(machine.id)
    assert released is not None
    assert released.state == "released"
    assert hub.composed_hosts() == {}
