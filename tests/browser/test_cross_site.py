"""A page on another site cannot spawn a server for a logged-in user, in Debian's Chromium.

The hub is at ``http://localhost:PORT``; the other site is a tiny web server on
``127.0.0.1``: another host, so another site to the browser. Its pages send the
logged-in user to a spawn URL that asks for every H100 (a link, a GET form and
a POST form, each sent by script as the page loads).
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Page, expect

from composespawner.ledger import Ledger
from harness.browser import log_in, shot
from harness.hub import PASSWORD, Hub, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
GRAB = {"gpu_model": "h100", "gpu_count": "4", "network": "100g", "scratch_gb": "3840"}
GRAB_PATH = "/hub/spawn/student1/grab"


@pytest.fixture(autouse=True)
def nothing_left_running(hub: Hub) -> Iterator[None]:
    yield
    for name in hub.user("student1").get("servers", {}):
        hub.stop("student1", name)
    wait_for(lambda: hub.composed_hosts() == {}, 30, "every device to be detached")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture(scope="module")
def other_site(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of the other site, serving the three attack pages."""
    root = tmp_path_factory.mktemp("other-site")
    _write_attack_pages(root, f"{hub.url}{GRAB_PATH}")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _write_attack_pages(root: Path, spawn_url: str) -> None:
    query = "&".join(f"{k}={v}" for k, v in GRAB.items())
    fields = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in GRAB.items())
    (root / "link.html").write_text(f'<script>location.href = "{spawn_url}?{query}";</script>')
    for method in ("get", "post"):
        (root / f"{method}-form.html").write_text(
            f'<form method="{method}" action="{spawn_url}">{fields}</form>'
            "<script>document.forms[0].submit();</script>"
        )


def nothing_claimed(hub: Hub) -> None:
    assert hub.composed_hosts() == {}
    assert hub.server("student1", "grab") is None
    ledger = Ledger(hub.ledger_url())
    try:
        assert ledger.live_machines("student1") == []
    finally:
        ledger.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("attack", ["link", "get-form"])
def test_a_spawn_link_from_another_site_only_fills_in_the_form(
    hub: Hub, page: Page, other_site: str, attack: str
) -> None:
    log_in(page, hub, "student1")
    page.goto(f"{other_site}/{attack}.html")

    page.wait_for_url(f"**{GRAB_PATH}?**")
    expect(page.locator("#compose-from-link")).to_contain_text("Nothing has started yet")
    expect(page.locator("#gpu-h100")).to_be_checked()
    expect(page.locator("#gpu_count")).to_have_value("4")
    expect(page.locator("#net-100g")).to_be_checked()
    shot(page, f"cross-site-{attack}")
    nothing_claimed(hub)

    if attack == "link":
        # The user, not the link, decides: confirming the form spawns what it shows.
        page.click("form input[type=submit], form button[type=submit]")
        hub.wait_ready("student1", "grab", timeout=120)
        # 4 GPUs, the 100 Gb/s card and two 1.92 TB drives
        assert sum(len(blocks) for blocks in hub.composed_hosts().values()) == 7


@pytest.mark.timeout(120)
def test_a_form_posted_from_another_site_is_refused(hub: Hub, page: Page, other_site: str) -> None:
    log_in(page, hub, "student1")
    with page.expect_response(lambda r: GRAB_PATH in r.url) as answer:
        page.goto(f"{other_site}/post-form.html")
    assert answer.value.status == 403
    # Without SameSite, Chromium sends a cookie set in the last two minutes with a
    # cross-site POST ("Lax+POST"); the hub's XSRF check is then all that is left.
    sent = answer.value.request.all_headers().get("cookie", "")
    assert "jupyterhub-hub-login" not in sent
    shot(page, "cross-site-post")
    nothing_claimed(hub)


def test_the_hubs_cookies_stay_on_the_hubs_own_site(hub: Hub) -> None:
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=30)
    login = session.post(
        f"{hub.url}/hub/login",
        data={"username": "student1", "password": PASSWORD, "_xsrf": session.cookies["_xsrf"]},
        timeout=30,
        allow_redirects=False,
    )
    assert login.status_code == 302
    cookies = login.raw.headers.getlist("Set-Cookie")
    assert cookies
    assert all("SameSite=Lax" in cookie for cookie in cookies), cookies
