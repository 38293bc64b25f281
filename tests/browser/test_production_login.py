"""The production config's campus login, in Chromium, against a real OpenID Connect provider.

hub_config/production_config.py runs as deployed (HTTPS with the test CA's
certificate, PostgreSQL for the hub and the ledger, the fabric simulator as
the fabric manager) and logs users in through panva's oidc-provider on
127.0.0.1 (tests/support/oidc.py): authorization code with PKCE, RS256-signed
ID tokens, groups in a claim. The provider's groups become JupyterHub groups,
so co-located devices follow the provider.
"""

from __future__ import annotations

import base64
import hashlib
import pwd
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import pytest
import requests
from playwright.sync_api import Browser, Page, Request, Route, expect

from harness.hub import (
    FABRIC_AUTH,
    Hub,
    fabric_on_its_own,
    free_port,
    notebook_pid,
    running_production_hub,
    wait_for,
)
from harness.paths import HUB_CONFIG, ROOT
from harness.postgres import connectable_admin_engine, scratch_database
from harness.tls import TLSFiles, make_tls_files, served_certificate_der
from tests.support.accounts import user_accounts
from tests.support.oidc import Account, OIDCProvider, campus_login, hub_user, oidc_provider

pytestmark = pytest.mark.timeout(300)

USERS = {
    "researcher1": Account("r1-secret", "researcher1@campus.example.edu", ("vision-lab",)),
    "student1": Account("s1-secret", "student1@campus.example.edu", ("cs-101",)),
    "alumna": Account("a-secret", "alumna@campus.example.edu"),  # no group: by domain
    "guest": Account("g-secret", "guest@elsewhere.example.org"),  # neither
    "gpuadmin": Account("ga-secret", "gpuadmin@elsewhere.example.org", ("gpu-admins",)),
}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def public_url() -> str:
    return f"https://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def provider(
    tmp_path_factory: pytest.TempPathFactory, tls: TLSFiles, public_url: str
) -> Iterator[OIDCProvider]:
    folder = tmp_path_factory.mktemp("idp")
    with oidc_provider(folder, tls, USERS, [f"{public_url}/hub/oauth_callback"]) as provider:
        yield provider


@pytest.fixture(scope="module")
def hub(
    tmp_path_factory: pytest.TempPathFactory,
    tls: TLSFiles,
    public_url: str,
    provider: OIDCProvider,
) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("hub")
    homes = Path(tempfile.mkdtemp(prefix="composespawner-homes-"))  # pytest's tmp is 0700
    homes.chmod(0o755)
    secrets_dir = tmp / "secrets"
    secrets_dir.mkdir(mode=0o700)
    (secrets_dir / "oidc-client-secret").write_text(provider.client_secret + "\n")
    (secrets_dir / "fabric-password").write_text(FABRIC_AUTH[1] + "\n")
    server = connectable_admin_engine()
    try:
        with (
            scratch_database(server) as hub_db,
            scratch_database(server) as ledger_db,
            fabric_on_its_own(tmp) as fabric,
            # The hub gives each user an account at first login; the users who start
            # notebooks get theirs first, let in to this machine's Python.
            user_accounts(homes, ["researcher1"], [Path(sys.executable)]),
        ):
            settings = {
                "COMPOSE_PUBLIC_URL": public_url,
                "COMPOSE_TLS_CERT": str(tls.cert),
                "COMPOSE_TLS_KEY": str(tls.key),
                "COMPOSE_HUB_DB_URL": hub_db,
                "COMPOSE_LEDGER_URL": ledger_db,
                "COMPOSE_OIDC_ISSUER": provider.issuer,
                "COMPOSE_OIDC_CLIENT_ID": provider.client_id,
                "COMPOSE_OIDC_CLIENT_SECRET_FILE": str(secrets_dir / "oidc-client-secret"),
                "COMPOSE_OIDC_CA_BUNDLE": str(tls.ca_bundle),
                "COMPOSE_ALLOWED_GROUPS": "cs-101,vision-lab",
                "COMPOSE_ALLOWED_DOMAINS": "campus.example.edu",
                "COMPOSE_ADMIN_GROUPS": "gpu-admins",
                "COMPOSE_FABRIC_URL": fabric.url,
                "COMPOSE_FABRIC_USERNAME": FABRIC_AUTH[0],
                "COMPOSE_FABRIC_PASSWORD_FILE": str(secrets_dir / "fabric-password"),
                "COMPOSE_CATALOG_FILE": str(HUB_CONFIG / "catalog.toml"),
                "COMPOSE_HUB_ID": "composespawner-production-test",
                "COMPOSE_HOMES_DIR": str(homes),
                "COMPOSE_PROXY_COMMAND": str(
                    ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
                ),
            }
            with running_production_hub(tmp, settings, tls.ca_bundle) as hub:
                yield hub
    finally:
        server[0].dispose()
        shutil.rmtree(homes)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    # The hub's and the provider's certificates come from the test CA, which this
    # Chromium does not know; the hub itself checks the provider's against it.
    context = browser.new_context(ignore_https_errors=True)
    page = context.new_page()
    yield page
    context.close()


def test_vision_lab_member_logs_in_with_pkce_and_sees_the_labs_gpus(
    hub: Hub, provider: OIDCProvider, page: Page
) -> None:
    authorize: list[str] = []
    page.on(
        "request",
        lambda r: authorize.append(r.url) if r.url.startswith(f"{provider.issuer}/auth?") else None,
    )
    campus_login(page, hub, USERS, "researcher1")
    page.wait_for_url("**/hub/spawn**")

    asked = parse_qs(urlsplit(authorize[0]).query)
    assert asked["code_challenge_method"] == ["S256"]
    assert len(asked["code_challenge"][0]) == 43  # base64url of a SHA-256
    assert "client_secret" not in asked
    user = hub_user(hub, "researcher1")
    assert user is not None
    assert user["groups"] == ["vision-lab"]
    assert user["admin"] is False
    expect(page.locator('[data-model="rtx6000"]')).to_have_count(1)
    expect(page.locator('[data-model="t4"]')).to_contain_text("free")


@pytest.mark.timeout(400)
def test_a_lab_member_starts_jupyterlab_on_the_labs_gpu_over_https(hub: Hub, page: Page) -> None:
    campus_login(page, hub, USERS, "researcher1")
    page.wait_for_url("**/hub/spawn**")
    page.check("#gpu-rtx6000")
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/user/researcher1/lab**", timeout=180_000)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=60_000)
    host = hub.server_host("researcher1")  # the ledger, on PostgreSQL
    attached = hub.attached(host)  # the fabric manager
    assert len(attached) == 1
    assert attached[0].startswith("x1-rtx6000-")
    notebook = Path(f"/proc/{notebook_pid(hub, 'researcher1')}")
    assert notebook.stat().st_uid == pwd.getpwnam("researcher1").pw_uid  # their own account

    stopped = hub.api.delete(f"{hub.url}/hub/api/users/researcher1/server", timeout=60)
    assert stopped.status_code in (202, 204)
    wait_for(lambda: hub.attached(host) == [], 60, "the lab's GPU to go back to the pool")


def test_a_group_removed_at_the_provider_is_gone_at_the_next_login(
    hub: Hub, provider: OIDCProvider, page: Page
) -> None:
    campus_login(page, hub, USERS, "researcher1")
    page.wait_for_url("**/hub/spawn**")
    expect(page.locator('[data-model="rtx6000"]')).to_have_count(1)

    provider.set_groups("researcher1", [])
    try:
        page.goto(f"{hub.url}/hub/logout")
        page.goto(f"{hub.url}/hub/login")
        # Still logged in at the provider: the hub's login goes straight through.
        page.get_by_text("Sign in with your campus account").click()
        page.wait_for_url("**/hub/spawn**")
        user = hub_user(hub, "researcher1")
        assert user is not None
        assert user["groups"] == []  # allowed still, by domain
        expect(page.locator('[data-model="t4"]')).to_contain_text("free")
        expect(page.locator('[data-model="rtx6000"]')).to_have_count(0)
    finally:
        provider.set_groups("researcher1", ["vision-lab"])


def test_allowed_by_domain_refused_otherwise_admins_by_group(hub: Hub, page: Page) -> None:
    campus_login(page, hub, USERS, "alumna")
    page.wait_for_url("**/hub/spawn**")
    alumna = hub_user(hub, "alumna")
    assert alumna is not None
    assert alumna["groups"] == []

    page.context.clear_cookies()
    campus_login(page, hub, USERS, "guest")
    expect(page.locator("body")).to_contain_text("403")
    assert hub_user(hub, "guest") is None

    page.context.clear_cookies()
    campus_login(page, hub, USERS, "gpuadmin")
    page.wait_for_url("**/hub/spawn**")
    admin = hub_user(hub, "gpuadmin")
    assert admin is not None
    assert admin["admin"] is True
    assert admin["groups"] == ["gpu-admins"]


def callback_from_provider(page: Page, hub: Hub, login: str) -> str:
    """Log in at the provider and return the callback URL it sends the browser to,
    which the browser then does not follow (a redirect hop cannot be routed, so
    the provider's answers are fetched with the browser's cookies and read)."""
    callbacks: list[str] = []

    def capture(route: Route, request: Request) -> None:
        answer = route.fetch(max_redirects=0)  # the login form's POST, as sent
        while "/hub/oauth_callback?" not in (location := answer.headers["location"]):
            answer = page.context.request.get(urljoin(request.url, location), max_redirects=0)
        callbacks.append(location)
        route.fulfill(status=200, content_type="text/plain", body="callback captured")

    page.route("**/interaction/*/login", capture)
    campus_login(page, hub, USERS, login)
    expect(page.locator("body")).to_contain_text("callback captured")
    page.unroute("**/interaction/*/login")
    assert len(callbacks) == 1
    return callbacks[0]


def test_a_callback_with_another_state_is_refused(hub: Hub, page: Page) -> None:
    callback = urlsplit(callback_from_provider(page, hub, "student1"))
    query = parse_qs(callback.query)
    assert query["state"]
    assert query["code"]
    query["state"] = ["forged-" + secrets.token_urlsafe(8)]
    page.goto(f"{hub.url}/hub/oauth_callback?{urlencode(query, doseq=True)}")
    expect(page.locator("body")).to_contain_text("OAuth state mismatch")
    assert hub_user(hub, "student1") is None


def test_the_hubs_code_is_worth_nothing_without_its_verifier(
    hub: Hub, provider: OIDCProvider, page: Page
) -> None:
    """A code stolen on its way back to the hub: the provider wants the hub's verifier."""
    code = parse_qs(urlsplit(callback_from_provider(page, hub, "student1")).query)["code"][0]
    answer = requests.post(
        provider.discovery()["token_endpoint"],
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": f"{hub.url}/hub/oauth_callback",
            "code_verifier": secrets.token_urlsafe(48),
        },
        auth=(provider.client_id, provider.client_secret),  # even with the hub's secret
        verify=str(provider.tls.ca_bundle),
        timeout=10,
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_grant"
    assert hub_user(hub, "student1") is None


def test_the_provider_refuses_a_redirect_uri_it_was_not_given(
    hub: Hub, provider: OIDCProvider
) -> None:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    answer = requests.get(
        provider.discovery()["authorization_endpoint"],
        params={
            "client_id": provider.client_id,
            "response_type": "code",
            "scope": "openid groups",
            "redirect_uri": "https://attacker.example/hub/oauth_callback",
            "state": "s",
            "code_challenge": challenge.rstrip(b"=").decode(),
            "code_challenge_method": "S256",
        },
        allow_redirects=False,
        verify=str(provider.tls.ca_bundle),
        timeout=10,
    )
    assert answer.status_code == 400
    assert "Location" not in answer.headers
    assert "redirect_uri" in answer.text


def test_the_hub_serves_https_with_the_given_certificate(hub: Hub, tls: TLSFiles) -> None:
    assert served_certificate_der(hub.url) == tls.server_certificate_der()
    assert hub.api.get(f"{hub.url}/hub/health", timeout=10).status_code == 200
