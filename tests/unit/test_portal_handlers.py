"""The portal's handlers in this process: its real routes, service and ledger, no hub.

The app is the one ``composespawner portal`` serves (``PortalApp.make_app``), over
a real SQLite ledger upgraded with the project's migrations and a composer on a
strict in-process fabric. Only the hub is faked, at its two boundaries: who a
token or cookie belongs to (:class:`StrictHubOAuth`, JupyterHub's own HubOAuth
answering from a table instead of the hub's ``/user``, so its cookie, XSRF and
scope checks are JupyterHub's) and the hub's REST API (the real ``HubClient``
against :class:`FakeHubAPI`). Statuses and messages are those the e2e tests
(``tests/e2e/test_portal.py``, ``test_notebook_client.py``) assert of a real hub.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from datetime import UTC
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado.httpclient import HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.simple_httpclient import SimpleAsyncHTTPClient
from tornado.web import Application, create_signed_value

from composespawner.domain.catalog import Catalog
from composespawner.domain.request import MachineRequest
from composespawner.ledger import Ledger
from composespawner.portal.app import PortalApp
from composespawner.services.composer import Composer
from composespawner.services.hub_api import HubClient
from harness.paths import HUB_CONFIG
from tests.support.fake_hub_api import TOKEN, FakeHubAPI, FakeHubAPIServer, Reply
from tests.support.faulty import FaultyFabric

pytestmark = pytest.mark.timeout(30)

PREFIX = "/services/compose/"
SERVICE = "compose"
ACCESS = f"access:services!service={SERVICE}"  # what the hub grants a user of the portal
ONE_T4 = MachineRequest(gpu_model="t4", gpu_count=1, network="shared", scratch_gb=0)
USERS: dict[str, dict[str, Any]] = {
    "admin": {"name": "admin", "groups": [], "scopes": [ACCESS, "custom:compose:admin"]},
    "student1": {"name": "student1", "groups": ["cs-101"], "scopes": [ACCESS]},
    "student2": {"name": "student2", "groups": ["cs-101"], "scopes": [ACCESS]},
}


class StrictHubOAuth(HubOAuth):
    """HubOAuth asking a table, not the hub, whose a token is: a token not in it is nobody's.

    Everything else (reading the token from the header or the signed cookie, the
    XSRF check on a cookie-authenticated change, scope checks) is JupyterHub's.
    """

    def user_for_token(
        self, token: str, use_cache: bool = True, session_id: str = "", *, sync: bool = True
    ) -> Any:
        model = USERS.get(token.removeprefix("token-for-"))
        found = None if model is None else json.loads(json.dumps(model))  # a fresh copy
        if sync:
            return found

        async def answer() -> dict[str, Any] | None:
            return found

        return answer()


def token(user: str) -> str:
    return f"token-for-{user}"


class Portal:
    """The portal served on a free port, and a client for it."""

    def __init__(self, app: Application, hub: FakeHubAPI, composer: Composer) -> None:
        self.app, self.hub, self.composer = app, hub, composer
        sockets = bind_sockets(0, "127.0.0.1")
        self.server = HTTPServer(app)
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}{PREFIX}"
        self.client = SimpleAsyncHTTPClient(force_instance=True)

    def call(
        self,
        method: str,
        path: str,
        *,
        user: str | None = None,
        body: object = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Awaitable[HTTPResponse]:
        sent = dict(headers or {})
        if user is not None:
            sent["Authorization"] = f"token {token(user)}"
        data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
        if data is None and method in ("POST", "PUT"):
            data = b""
        return self.client.fetch(
            self.url + path,
            method=method,
            body=data,
            headers=sent,
            raise_error=False,
            follow_redirects=False,
        )

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.call(method, path, **kwargs)
        assert response.headers["Content-Type"].startswith("application/json"), response.body
        return response.code, json.loads(response.body)

    def cookie_of(self, user: str) -> str:
        """The login cookie HubOAuth sets for ``user`` after OAuth, signed as it signs it."""
        auth = StrictHubOAuth.instance()
        secret = self.app.settings["cookie_secret"]
        signed = create_signed_value(secret, auth.cookie_name, token(user)).decode()
        return f"{auth.cookie_name}={signed}"

    async def close(self) -> None:
        self.client.close()
        self.server.stop()
        await self.server.close_all_connections()


@pytest.fixture
def hub_auth() -> Any:
    StrictHubOAuth.clear_instance()
    auth = StrictHubOAuth.instance(
        api_url="http://127.0.0.1:1/hub/api",  # never asked: tokens are looked up
        api_token="unused",
        oauth_client_id=f"service-{SERVICE}",
        base_url=PREFIX,
        access_scopes={ACCESS},
    )
    yield auth
    StrictHubOAuth.clear_instance()
    # HubAuth answers a handler's current_user on an event loop in a thread of its own;
    # a portal process keeps it for its life, a test closes it.
    loop = getattr(auth, "_thread_loop", None)
    if loop is not None:
        auth._pool.shutdown()
        loop.close()


@pytest.fixture
async def portal(tmp_path: Path, hub_auth: Any) -> AsyncIterator[Portal]:
    del hub_auth  # installed as HubOAuth's instance, which the handlers use
    api = FakeHubAPI()
    for user in USERS.values():
        api.add_user(user["name"], *user["groups"])
    hub_server = FakeHubAPIServer(api)
    hub_server.start()
    hub = HubClient(hub_server.url, TOKEN, timeout=5.0)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.upgrade()
    composer = Composer(
        ledger=ledger,
        fabric=FaultyFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml"),
        catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
        hub_id="test-hub",
        snapshot_ttl=0,
    )
    maker = PortalApp(
        service_prefix=PREFIX,
        scoring_secret_file=str(tmp_path / "scoring_secret"),
        stack_environments_dir=str(tmp_path / "environments"),
    )
    app = maker.make_app(composer=composer, hub=hub, timezone=UTC)
    served = Portal(app, api, composer)
    yield served
    await served.close()
    await hub.close()
    await hub_server.stop()
    await composer.close()


async def running(portal: Portal, user: str, gpus: int = 1) -> list[str]:
    """Start ``user``'s default server on ``gpus`` T4s; the GPUs its machine holds."""
    composer = portal.composer
    composed = await composer.compose(
        user=user,
        groups=frozenset(),
        server="",
        request=replace(ONE_T4, gpu_count=gpus),
        progress=lambda message: None,
        then=("launching", "starting notebook"),
    )
    await composer.record(composed.machine_id, "running", "notebook up")
    status, server = await portal.json("GET", "api/me/server/gpus", user=user)
    assert status == 200, server
    return [gpu["id"] for gpu in server["gpus"]]


async def test_nobody_gives_back_anothers_gpu(portal: Portal) -> None:
    await running(portal, "student1")
    theirs = await running(portal, "student2")

    status, body = await portal.json("DELETE", f"api/me/server/gpus/{theirs[0]}", user="student1")

    assert status == 404, body
    assert body == {"status": 404, "message": body["message"]}
    assert f"holds no GPU {theirs[0]!r}" in body["message"]
    status, mine = await portal.json("GET", "api/me", user="student2")
    assert status == 200
    assert [g["id"] for g in mine["servers"][0]["gpus"]] == theirs


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("api/me/server/gpus", {"count": "1"}, "count must be a whole number from 1 to"),
        ("api/me/server/gpus", {"count": -1}, "count must be a whole number from 1 to"),
        ("api/me/server/gpus", [1], 'Send {"count": N}'),
    ],
)
async def test_a_bad_grow_is_refused_saying_what_to_send(
    portal: Portal, path: str, body: object, message: str
) -> None:
    held = await running(portal, "student1")

    status, answer = await portal.json("POST", path, user="student1", body=body)

    assert (status, answer["status"]) == (400, 400), answer
    assert message in answer["message"]
    status, now = await portal.json("GET", "api/me/server/gpus", user="student1")
    assert status == 200
    assert [g["id"] for g in now["gpus"]] == held


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("api/quotas/site", {"gpus_held": "2"}, "gpus_held must be a number, not str"),
        ("api/quotas/site", {"gpus_held": -1}, "gpus_held must be from 0 to 10000, not -1"),
        ("api/quotas/cohort/%3Cscript%3E", {"gpus_held": 1}, "No group '<script>' in the hub"),
        ("api/quotas/user/a%00b", {"servers": 1}, "the user's name has a control character"),
        ("api/quotas/site", {"cores_held": -8}, "cores_held must be from 0 to 1e+06, not -8"),
        ("api/quotas/site", {"cores_held": 10**9}, "cores_held must be from 0 to 1e+06"),
        ("api/quotas/site", {"cores_held": 2.5}, "cores_held must be a whole number, not 2.5"),
        ("api/quotas/site", {"memory_gib_held": "64"}, "memory_gib_held must be a number, not"),
        ("api/quotas/site", {"memory_gib_held": 10**12}, "memory_gib_held must be from 0 to 1e+07"),
        (
            "api/quotas/site",
            {"memory_gib_held": True},
            "memory_gib_held must be a number, not bool",
        ),
        ("api/quotas/site", {"memory": 64}, "unknown limit 'memory'; the limits are"),
    ],
)
async def test_bad_quota_input_is_refused_with_a_message_and_nothing_stored(
    portal: Portal, path: str, body: object, message: str
) -> None:
    status, answer = await portal.json("PUT", path, user="admin", body=body)

    assert (status, answer["status"]) == (400, 400), answer
    assert message in answer["message"]
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})
    assert await portal.json("GET", "api/audit", user="admin") == (200, {"entries": []})


async def test_a_body_that_is_not_json_is_refused(portal: Portal) -> None:
    status, answer = await portal.json("PUT", "api/quotas/site", user="admin", raw=b"{gpus")

    assert (status, answer) == (400, {"status": 400, "message": "The body is not JSON."})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "api/quotas", None),
        ("PUT", "api/quotas/site", {"gpus_held": 1}),
        ("GET", "api/users/student2/quota", None),
        ("GET", "api/inventory", None),
        ("GET", "api/audit", None),
        ("GET", "api/usage", None),
        ("DELETE", "api/cohorts/cs-101", None),
    ],
)
async def test_a_student_gets_403_on_an_admin_call(
    portal: Portal, method: str, path: str, body: object
) -> None:
    status, answer = await portal.json(method, path, user="student1", body=body)

    assert (status, answer) == (
        403,
        {"status": 403, "message": "Only the GPU pool's admins may do this."},
    )
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})


async def test_a_student_gets_an_error_page_on_an_admin_page(portal: Portal) -> None:
    response = await portal.call("GET", "quotas", user="student1")

    assert response.code == 403
    assert response.headers["Content-Type"].startswith("text/html")
    assert b"Only the GPU pool&#39;s admins may do this." in response.body


async def test_a_request_nobody_is_logged_in_for_is_refused(portal: Portal) -> None:
    status, answer = await portal.json("GET", "api/me", headers={"Authorization": "token x"})

    assert (status, answer) == (403, {"status": 403, "message": "Log in to the hub first."})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "api/users/student1/quota", None),
        ("PUT", "api/quotas/cohort/cs-101", {"gpus_held": 1}),
        ("PUT", "api/devices/x1-rtx6000-2/owner", {"owner_group": "vision-lab"}),
    ],
)
async def test_a_hub_that_does_not_answer_is_a_503_to_try_again(
    portal: Portal, method: str, path: str, body: object
) -> None:
    portal.hub.answer_all = Reply(500, "<html>500: Internal Server Error</html>", "text/html")

    status, answer = await portal.json(method, path, user="admin", body=body)

    assert (status, answer) == (
        503,
        {"status": 503, "message": "The hub did not answer; try again."},
    )
    portal.hub.answer_all = None
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})


async def test_a_hub_that_does_not_answer_is_a_503_page(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    portal.hub.answer_all = Reply(502, "Bad Gateway", "text/plain")

    response = await portal.call("GET", "usage", user="admin")

    assert response.code == 503
    assert b"The hub did not answer; try again." in response.body


async def test_a_cross_site_form_post_is_refused_and_the_same_with_the_token_accepted(
    portal: Portal,
) -> None:
    cookie = portal.cookie_of("admin")
    page = await portal.call("GET", "quotas", headers={"Cookie": cookie})
    assert page.code == 200, page.body
    xsrf = SimpleCookie(page.headers["Set-Cookie"])["_xsrf"].value
    form = {"level": "site", "subject": "", "gpus_held": "1"}
    cross_site = {
        "Cookie": f"{cookie}; _xsrf={xsrf}",
        "Content-Type": "application/x-www-form-urlencoded",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Site": "cross-site",
    }

    refused = await portal.call("POST", "quotas", headers=cross_site, raw=urlencode(form).encode())

    assert refused.code == 403
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})
    with_token = urlencode({**form, "_xsrf": xsrf}).encode()
    accepted = await portal.call("POST", "quotas", headers=cross_site, raw=with_token)
    assert (accepted.code, accepted.headers["Location"]) == (302, f"{PREFIX}quotas")
    status, rules = await portal.json("GET", "api/quotas", user="admin")
    assert status == 200
    assert [(r["level"], r["gpus_held"]) for r in rules["rules"]] == [("site", 1)]


async def test_a_cookie_change_without_the_xsrf_token_is_refused(portal: Portal) -> None:
    headers = {"Cookie": portal.cookie_of("admin"), "Content-Type": "application/json"}

    response = await portal.call("PUT", "api/quotas/site", headers=headers, body={"gpus_held": 1})

    assert response.code == 403
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})


async def test_cores_and_memory_held_are_set_per_cohort_and_shown_with_their_source(
    portal: Portal,
) -> None:
    limits = {"cores_held": 16, "memory_gib_held": 64}
    status, rule = await portal.json("PUT", "api/quotas/cohort/cs-101", user="admin", body=limits)
    assert status == 200, rule
    assert (rule["cores_held"], rule["memory_gib_held"], rule["gpus_held"]) == (16, 64, None)
    status, rules = await portal.json("GET", "api/quotas", user="admin")
    assert [(r["subject"], r["cores_held"]) for r in rules["rules"]] == [("cs-101", 16)]

    status, mine = await portal.json("GET", "api/me", user="student1")
    assert status == 200, mine
    assert mine["quota"]["cores_held"] == {"value": 16, "source": "cohort cs-101"}
    assert mine["quota"]["memory_gib_held"] == {"value": 64, "source": "cohort cs-101"}
    assert (mine["use"]["cores_held"], mine["use"]["memory_gib_held"]) == (0, 0)
    page = await portal.call("GET", "", user="student1")
    assert page.code == 200
    assert b'<tr data-limit="cores_held">' in page.body
    assert b"CPU cores held at once" in page.body


async def test_the_quota_page_takes_the_share_limits_and_refuses_a_bad_one(portal: Portal) -> None:
    form = {"level": "user", "subject": "student1", "cores_held": "4", "memory_gib_held": "x"}
    headers = {"Content-Type": "application/x-www-form-urlencoded"}

    refused = await portal.call(
        "POST", "quotas", user="admin", headers=headers, raw=urlencode(form).encode()
    )

    assert refused.code == 400
    assert b"memory_gib_held must be a number, not &#39;x&#39;" in refused.body
    assert await portal.json("GET", "api/quotas", user="admin") == (200, {"rules": []})
    form["memory_gib_held"] = "32"
    stored = await portal.call(
        "POST", "quotas", user="admin", headers=headers, raw=urlencode(form).encode()
    )
    assert stored.code == 302
    status, rule = await portal.json("GET", "api/quotas/user/student1", user="admin")
    assert status == 200, rule
    assert (rule["cores_held"], rule["memory_gib_held"]) == (4, 32)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (["small", "huge"], "unknown size 'huge'; the catalog has: small, medium, large"),
        ("small", "sizes must be a list of strings"),
        ([4], "sizes must be a list of strings"),
        ([], "sizes: name at least one size, or null for any size"),
    ],
)
async def test_bad_cohort_sizes_are_refused_with_a_message_and_nothing_stored(
    portal: Portal, sizes: object, message: str
) -> None:
    body = {"sessions": ["Mon 09:00-11:00"], "sizes": sizes}

    status, answer = await portal.json("PUT", "api/cohorts/cs-101", user="admin", body=body)

    assert (status, answer["status"]) == (400, 400), answer
    assert message in answer["message"]
    assert await portal.json("GET", "api/cohorts", user="admin") == (200, {"cohorts": []})


async def test_a_cohort_limits_its_members_sizes_through_the_api_and_the_page(
    portal: Portal,
) -> None:
    body = {"sizes": ["medium", "small"]}
    status, cohort = await portal.json("PUT", "api/cohorts/cs-101", user="admin", body=body)
    assert status == 200, cohort
    assert cohort["sizes"] == ["medium", "small"]
    status, mine = await portal.json("GET", "api/me", user="student1")
    assert [c["sizes"] for c in mine["cohorts"]] == [["medium", "small"]]

    form = {"name": "cs-101", "sizes": "large, xlarge"}
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    saved = await portal.call(
        "POST", "cohorts", user="admin", headers=headers, raw=urlencode(form).encode()
    )
    assert saved.code == 302
    status, cohort = await portal.json("GET", "api/cohorts/cs-101", user="admin")
    assert cohort["sizes"] == ["large", "xlarge"]
    page = await portal.call("GET", "cohorts", user="admin")
    assert b"<td>large, xlarge</td>" in page.body
    form["sizes"] = ""  # an empty field: any size again
    await portal.call(
        "POST", "cohorts", user="admin", headers=headers, raw=urlencode(form).encode()
    )
    status, cohort = await portal.json("GET", "api/cohorts/cs-101", user="admin")
    assert cohort["sizes"] is None
