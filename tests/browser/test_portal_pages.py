"""The GPU portal's pages in Chromium: reached from the hub's bar, quotas set by an admin."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from harness.browser import log_in, shot
from harness.hub import Hub

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


@pytest.mark.timeout(120)
def test_the_hubs_bar_leads_to_my_machine_with_my_quota(hub: Hub, page: Page) -> None:
    log_in(page, hub, "student1")
    page.goto(f"{hub.url}/hub/home")
    page.click("#portal-link")
    page.wait_for_url(re.compile(r"/services/compose/$"))
    expect(page.locator("#no-servers")).to_contain_text("You have no server running")
    held = page.locator('#quota [data-limit="gpus_held"]')
    expect(held).to_contain_text("4")
    expect(held).to_contain_text("the site default")
    expect(page.get_by_role("link", name="Quotas")).to_have_count(0)  # not an admin
    shot(page, "portal-my-machine")


@pytest.mark.timeout(120)
def test_an_admin_sets_a_cohort_quota_that_the_students_form_then_names(
    hub: Hub, page: Page
) -> None:
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/services/compose/quotas")
    page.select_option("#level", "cohort")
    page.fill("#subject", "cs-101")
    page.fill("#gpus_held", "1")
    page.fill("#models", "t4")
    page.click("#set-quota button[type=submit]")
    row = page.locator('#quota-rules tr[data-level="cohort"][data-subject="cs-101"]')
    expect(row).to_contain_text("t4")
    shot(page, "portal-quotas")

    page.fill("#gpus_held", "-2")
    page.click("#set-quota button[type=submit]")
    expect(page.locator("#quota-error")).to_have_text("gpus_held must be from 0 to 10000, not -2")

    student = page.context.browser.new_context()  # type: ignore[union-attr]
    try:
        form = student.new_page()
        log_in(form, hub, "student2")
        form.goto(f"{hub.url}/hub/spawn")
        expect(form.locator("#compose-quota")).to_contain_text("of 1 GPUs left")
        expect(form.locator("#compose-quota")).to_contain_text("from cohort cs-101")
        expect(form.locator('[data-model="a100"]')).to_have_count(0)  # the course allows T4s
        shot(form, "spawn-form-cohort-quota")
    finally:
        student.close()

    page.goto(f"{hub.url}/services/compose/quotas")
    row.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)
    page.goto(f"{hub.url}/services/compose/audit")
    expect(page.locator("#audit-entries tbody tr").first).to_contain_text("quota.delete")


@pytest.mark.timeout(120)
def test_a_student_opening_the_quotas_page_is_told_it_is_for_admins(hub: Hub, page: Page) -> None:
    log_in(page, hub, "student2")
    response = page.goto(f"{hub.url}/services/compose/quotas")
    assert response is not None
    assert response.status == 403
    expect(page.locator("#portal-error")).to_contain_text("Only the GPU pool's admins may do this.")
    shot(page, "portal-forbidden")


@pytest.mark.timeout(180)
def test_an_admin_releases_a_machine_from_the_inventory_and_its_user_reads_why(
    hub: Hub, page: Page
) -> None:
    hub.spawn("researcher1", {"gpu_model": "a100", "gpu_count": 1, "network": "shared"})
    hub.wait_ready("researcher1")
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/services/compose/inventory")
    held = page.locator("#inventory-devices tr", has_text="researcher1")
    expect(held.first).to_contain_text("running")
    host = page.locator("#inventory-hosts tr", has_text="researcher1")
    expect(host).to_contain_text("4 cores, 32 GiB")  # its share of the host it shares
    expect(host).to_contain_text("60 of 64")  # the cores the host has left
    shot(page, "portal-inventory")

    release = host.locator("form.release").first
    release.locator('input[name="reason"]').fill("Rack 2 goes down for maintenance at noon")
    page.once("dialog", lambda dialog: dialog.accept())
    release.locator("button").click()
    hub.wait_gone("researcher1")

    researcher = page.context.browser.new_context()  # type: ignore[union-attr]
    try:
        mine = researcher.new_page()
        log_in(mine, hub, "researcher1")
        mine.goto(f"{hub.url}/services/compose/")
        expect(mine.locator(".notice")).to_contain_text(
            "An admin (admin) stopped your default server"
        )
        expect(mine.locator(".notice")).to_contain_text("Rack 2 goes down for maintenance at noon")
        shot(mine, "portal-notice")
    finally:
        researcher.close()


@pytest.mark.timeout(180)
def test_the_usage_chart_shows_the_hours_just_used(hub: Hub, page: Page) -> None:
    hub.spawn("researcher1", {"gpu_model": "a100", "gpu_count": 1, "network": "shared"})
    hub.wait_ready("researcher1")
    hub.stop("researcher1")
    hub.wait_gone("researcher1")
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/services/compose/")
    page.get_by_role("link", name="Usage").click()
    page.wait_for_url(re.compile(r"/services/compose/usage$"))
    expect(page.locator("#usage-charts")).to_have_attribute("data-drawn", "true")
    # The bar chart's legend and axis come from plotly, drawn from the hours just used.
    expect(page.locator("#usage-by-day .legend")).to_contain_text("NVIDIA A100")
    expect(page.locator("#usage-by-user .ytick", has_text="researcher1")).to_have_count(1)
    expect(page.locator("#usage-users")).to_contain_text("researcher1")
    # Held, used and given back: in all, and a row per day of the range (30 by default).
    expect(page.locator("#usage-total-used")).to_contain_text("used")
    expect(page.locator("#usage-total-given-back")).to_contain_text("given back")
    expect(page.locator("#usage-days tbody tr")).to_have_count(30)
    shot(page, "portal-usage")

    page.fill("#since", "2020-01-01")
    page.click("#usage-range button[type=submit]")
    expect(page.locator("#usage-error")).to_contain_text("more than 366 days")


@pytest.mark.timeout(180)
def test_a_gpu_registered_to_a_group_shows_in_its_members_form_only_and_is_lent_from_the_page(
    hub: Hub, page: Page
) -> None:
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/services/compose/colocated")
    row = page.locator('#colocated-devices tr[data-device="x1-rtx6000-1"]')
    row.locator('input[name="owner_group"]').fill("cs-101")
    row.locator("form.register button").click()
    expect(row).to_contain_text("cs-101")
    shot(page, "portal-colocated")

    member = page.context.browser.new_context()  # type: ignore[union-attr]
    other = page.context.browser.new_context()  # type: ignore[union-attr]
    try:
        form = member.new_page()
        log_in(form, hub, "student1")
        form.goto(f"{hub.url}/hub/spawn")
        expect(form.locator('[data-model="rtx6000"]')).to_contain_text("1 free is cs-101's own")
        shot(form, "spawn-form-colocated")

        # The owner lends it to researcher1 from the portal, and takes it back.
        form.goto(f"{hub.url}/services/compose/colocated")
        mine = form.locator('#colocated-devices tr[data-device="x1-rtx6000-1"]')
        mine.locator('input[name="to"]').fill("researcher1")
        mine.locator('input[name="until"]').fill(tomorrow())
        mine.locator("form.lend button").click()
        expect(mine).to_contain_text("researcher1 until")

        theirs = other.new_page()
        log_in(theirs, hub, "researcher1")
        theirs.goto(f"{hub.url}/hub/spawn")
        expect(theirs.locator('[data-model="rtx6000"]')).to_contain_text(
            "x1-rtx6000-1 is lent to you"
        )

        mine.locator("form.take-back button").click()
        expect(mine).not_to_contain_text("researcher1 until")
        theirs.goto(f"{hub.url}/hub/spawn")
        expect(theirs.locator('[data-model="rtx6000"]')).not_to_contain_text("lent to you")
    finally:
        member.close()
        other.close()
    page.goto(f"{hub.url}/services/compose/colocated")
    page.locator('#colocated-devices tr[data-device="x1-rtx6000-1"] form').nth(1).locator(
        "button"
    ).click()
    given_back = page.locator('#colocated-devices tr[data-device="x1-rtx6000-1"]')
    expect(given_back).to_contain_text("vision-lab (catalog)")  # its chassis owner's again
    expect(given_back).not_to_contain_text("cs-101")


def tomorrow() -> str:
    return (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
