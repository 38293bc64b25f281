"""What a person sees, in Debian's Chromium: the form, the progress page, JupyterLab.

Screenshots land in test-artifacts/ (the README's pictures come from here).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from harness.browser import log_in, shot
from harness.hub import Hub, wait_for
from harness.simulator import SimulatorSwitches

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

# JupyterHub's progress page listens with ``onmessage``; keep back each "ready" event
# (and with it the page's reload) in ``window.heldReady`` until the test delivers it.
HOLD_READY = """
window.heldReady = [];
window.EventSource = class extends window.EventSource {
  set onmessage(handler) {
    super.onmessage = (event) => {
      const deliver = () => handler.call(this, event);
      if (JSON.parse(event.data).ready) window.heldReady.push(deliver);
      else deliver();
    };
  }
};
"""


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
    # A fabric that takes a moment per request, as real ones do: a spawn done within a
    # second sends the browser straight to JupyterLab, with no progress page to see.
    fabric = SimulatorSwitches(hub.fabric_url)
    fabric.faults(latency_s=0.5)
    # When the server is ready the progress page reloads itself and the hub sends it on
    # to JupyterLab. Hold the "ready" event in the page until the progress has been
    # read, or a fast spawn carries the page away mid-check.
    page.add_init_script(HOLD_READY)
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url(re.compile(r"/hub/spawn-pending/student1(\?|$)"))
    log = page.locator("#progress-log")
    expect(log).to_contain_text("attaching GPU 1/2 (NVIDIA T4)", timeout=60_000)
    expect(log).to_contain_text("attaching GPU 2/2 (NVIDIA T4)")
    page.wait_for_function("window.heldReady.length > 0", timeout=60_000)
    expect(log).to_contain_text("starting notebook on host-01")
    shot(page, "spawn-progress")
    fabric.clear_faults()
    page.evaluate("window.heldReady.forEach((deliver) => deliver())")

    page.wait_for_url("**/user/student1/lab**", timeout=120_000)
    expect(page.locator(".jp-LauncherCard").first).to_be_visible(timeout=120_000)
    shot(page, "jupyterlab")
    hub.stop("student1")
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")


@pytest.mark.timeout(120)
def test_a_refusal_is_shown_on_the_form(hub: Hub, page: Page) -> None:
    log_in(page, hub, "student2")
    composed = hub.composed_hosts()
    page.goto(f"{hub.url}/hub/spawn")
    page.check("#gpu-t4")
    # The browser only offers valid choices (choosing a model resets them, hence after
    # it); forge a count to see the server's answer.
    page.evaluate(
        "document.querySelector('#gpu_count').innerHTML = '<option value=\"-4\">-4</option>'"
    )
    page.click("form input[type=submit], form button[type=submit]")
    expect(page.locator(".spawn-error-msg")).to_have_text(
        "Error: GPU count must be from 0 (CPU only) to 4 (the most one machine can hold); got -4."
    )
    shot(page, "spawn-refused")
    assert hub.composed_hosts() == composed


@pytest.mark.timeout(240)
def test_a_starter_kit_chosen_on_the_form_opens_in_jupyterlab(hub: Hub, page: Page) -> None:
    log_in(page, hub, "teacher1")
    page.goto(f"{hub.url}/hub/spawn")
    page.check("#gpu-t4")
    page.select_option("#stack", "tensorflow")
    page.select_option("#kit", "digits")
    expect(page.locator("#stack")).to_have_value("pytorch")  # the kit's own stack
    page.click("form input[type=submit], form button[type=submit]")

    page.wait_for_url("**/user/teacher1/lab/tree/starter-kits/digits/digits.ipynb", timeout=120_000)
    notebook = page.locator(".jp-NotebookPanel")
    expect(notebook).to_be_visible(timeout=120_000)
    expect(notebook).to_contain_text("Handwritten digits: a two-minute start", timeout=60_000)
    shot(page, "starter-kit")
    hub.stop("teacher1")
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")
