"""The spawn form's script, in Chromium, on the form as rendered (no hub needed): choosing
a model offers its counts and its shares of one GPU, and the post carries the choice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from playwright.sync_api import Page, expect

from composespawner.domain.hardware import Inventory
from composespawner.domain.request import parse_form
from composespawner.spawners.form import render_form
from tests.unit.test_form import A100, CATALOG, T4, gpus, host, shared_offer

pytestmark = [pytest.mark.browser]

INVENTORY = Inventory(
    hosts=(host("h1", "r1"), host("h2", "r2")),
    devices=(*gpus(T4, "r1", 2), *gpus(A100, "r2", 3)),
    zones=("r1", "r2"),
)


def options(page: Page) -> list[str]:
    return page.eval_on_selector_all("#gpu_count option", "os => os.map(o => o.value)")


@pytest.mark.timeout(60)
def test_choosing_a_model_offers_its_shares_and_a_share_is_posted(page: Page) -> None:
    sizes = {s.id: 5 for s in CATALOG.sizes}
    offer = replace(shared_offer(INVENTORY, {2: 0, 4: 13}), sizes=CATALOG.sizes, sizes_free=sizes)
    body = render_form(CATALOG, offer, {"gpu_model": "a100", "size": "small"})
    page.set_content(f"<form method='post'>{body}<input type='submit'></form>")
    assert options(page) == ["1", "2", "3"]
    page.select_option("#gpu_count", "3")
    page.check("#gpu-t4")
    assert options(page) == ["1", "2", "1/2", "1/4"]
    expect(page.locator("#gpu_count")).to_have_value("2")  # the nearest count the T4 has
    expect(page.locator("#gpu_count option[value='1/2']")).to_be_disabled()
    page.select_option("#gpu_count", "1/4")
    expect(page.locator("#size")).to_have_value("medium")  # the default for one GPU
    posted = page.evaluate(
        "() => [...new FormData(document.querySelector('form')).entries()]"
        ".reduce((o, [k, v]) => ({...o, [k]: [v]}), {})"
    )
    request = parse_form(posted, CATALOG, {"t4", "a100"})
    assert (request.gpu_model, request.gpu_count, request.gpu_share) == ("t4", 1, 4)
    page.check("#gpu-a100")
    assert options(page) == ["1", "2", "3"]
    expect(page.locator("#gpu_count")).to_have_value("1")
