"""Idle GPUs as a student meets them in JupyterLab, in Chromium, on the real thing: the
demo hub with its reclaimer and portal, the fabric simulator's DCGM figures, the
student's own JupyterLab from the stack environment with composespawner-lab in it.

Windows of seconds instead of the demo's minutes; JupyterLab's extension polls every
2 s instead of 30.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from playwright.sync_api import Page, expect

from composespawner.ledger import Ledger
from harness.browser import log_in, shot
from harness.hub import Hub, notebook_pid, process_env, wait_for
from tests.e2e.test_gpu_reclaim import HELD_IDLE, reclaiming_hub, set_activity

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

POLICY = """
c.ReclaimerApp.interval = 1
c.ComposeSettings.reclaim_policy = {
    "detach_after": 8, "warn_after": 10, "reclaim_after": 60, "keep_for": 600, "max_gap": 5
}
c.Spawner.environment = {"COMPOSE_LAB_POLL_SECONDS": "2"}
"""
NOTHING = {"utilization": 0, "memory_used_mib": 0}
NOTICE_S = 60 - 10  # reclaim_after - warn_after
SECONDS = 30_000  # ms: a 1 s reclaimer pass, a 2 s poll, a loaded machine


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with reclaiming_hub(tmp_path_factory.mktemp("lab-reclaim"), POLICY) as hub:
        yield hub


@pytest.mark.timeout(300)
def test_jupyterlab_says_a_gpu_went_back_warns_of_an_idle_one_and_keeps_it(
    hub: Hub, page: Page
) -> None:
    ledger = Ledger(hub.ledger_url())
    try:
        t4s = [d.block_id for d in ledger.devices() if "t4" in d.model.lower()]
        set_activity(hub, dict.fromkeys(t4s, HELD_IDLE))
        log_in(page, hub, "student1")  # before the spawn: with a server, login goes to it
        response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 2})
        assert response.status_code in (201, 202), response.text
        hub.wait_ready("student1", timeout=180)
        env = process_env(notebook_pid(hub, "student1", ""))
        kept, unheld = (gpu["id"] for gpu in json.loads(env["COMPOSE_GPUS"]))
        host = hub.server_host("student1")

        page.goto(f"{hub.url}/user/student1/lab")
        status = page.locator(".jp-ComposeStatus")
        expect(status).to_contain_text(f"{host} · 2× NVIDIA T4", timeout=120_000)

        # The notebook closes its hold on one GPU: it is detached, JupyterLab says so.
        set_activity(hub, {unheld: NOTHING})
        expect(page.get_by_text("went back to the pool")).to_have_count(1, timeout=SECONDS)
        expect(status).to_contain_text("1× NVIDIA T4", timeout=SECONDS)
        assert unheld not in hub.attached(host)
        assert page.url.endswith("/user/student1/lab")  # the same page, never reloaded

        # The other is held without work: the reclaimer's warning, when it goes and how
        # to keep it first (a toast shows 140 characters; the portal's words follow).
        warning = page.locator(".Toastify__toast", has_text="goes back to the pool")
        expect(warning).to_have_count(1, timeout=SECONDS)
        expect(warning).to_contain_text(f"Idle NVIDIA T4 ({kept}) goes back to the pool at")
        expect(warning).to_contain_text("To keep it, use it or press Keep.")
        shot(page, "lab-reclaim-warning")
        (warned,) = ledger.reclaims.watches().values()
        assert warned.warned_at is not None
        warning.get_by_role("button", name="Keep").click()
        expect(page.get_by_text("Kept your NVIDIA T4").first).to_be_visible(timeout=SECONDS)
        expect(warning).to_have_count(0, timeout=SECONDS)
        (watch,) = ledger.reclaims.watches().values()
        assert watch.keeps_used == 1
        assert watch.kept_until is not None
        # Kept: the reclaimer reads it on past the moment it would have taken it.
        taken_at = warned.warned_at + NOTICE_S

        def read_past_it() -> bool:
            (now,) = ledger.reclaims.watches().values()
            return now.last_at > taken_at + 3

        wait_for(read_past_it, 90, "readings past the moment the GPU would have gone")
        assert kept in hub.attached(host)
        assert ledger.live_machines("student1")[0].block_ids == (kept,)
        given = ledger.reclaims.givebacks(*_all_time())
        assert [(g.block_id, g.action) for g in given] == [(unheld, "detach")]
    finally:
        if hub.server("student1") is not None:
            hub.stop("student1")
        ledger.close()


def _all_time() -> tuple[datetime, datetime]:
    return datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
