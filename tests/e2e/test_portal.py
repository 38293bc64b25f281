"""The GPU portal as a hub-managed service: who may see and change what, and what it changes.

A real hub starts the portal (``composespawner portal``); clients log in to the
hub and reach the portal through JupyterHub's OAuth, as a browser does.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from harness.hub import PORTAL, Hub, running_hub, wait_for, wait_for_portal
from tests.e2e.test_faults import TWO_T4

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("portal")) as hub:
        wait_for_portal(hub)
        yield hub


class Visitor:
    """A person logged in to the hub, using the portal with the cookie OAuth gave them."""

    def __init__(self, hub: Hub, name: str) -> None:
        self.hub = hub
        self.session = hub.login(name)
        landing = self.session.get(f"{hub.url}{PORTAL}", timeout=30)
        assert landing.status_code in (200, 403), landing.text

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        xsrf = self.session.cookies.get("_xsrf", path=PORTAL)
        headers = {"X-XSRFToken": xsrf} if xsrf and method != "GET" else {}
        return self.session.request(
            method, f"{self.hub.url}{PORTAL}{path}", headers=headers, timeout=30, **kwargs
        )


@pytest.fixture(scope="module")
def admin(hub: Hub) -> Visitor:
    return Visitor(hub, "admin")


@pytest.fixture(scope="module")
def student(hub: Hub) -> Visitor:
    return Visitor(hub, "student1")


@pytest.mark.timeout(120)
def test_my_machine_shows_the_server_its_devices_and_quota(hub: Hub, student: Visitor) -> None:
    me = student.call("GET", "api/me").json()
    assert me["servers"] == []
    assert me["groups"] == ["cs-101"]
    assert me["quota"]["gpus_held"] == {"value": 4, "source": "the site default"}

    hub.spawn("student1", TWO_T4).raise_for_status()
    hub.wait_ready("student1")
    try:
        me = student.call("GET", "api/me").json()
        [server] = me["servers"]
        assert server["state"] == "running"
        assert len(server["gpus"]) == 2
        assert server["host"] in hub.composed_hosts()
        assert me["use"]["gpus_held"] == 2
        page = student.call("GET", "")
        assert page.status_code == 200
        assert server["gpus"][0]["id"] in page.text
    finally:
        hub.stop("student1")
        hub.wait_gone("student1")


@pytest.mark.timeout(120)
def test_an_admin_sets_a_cohort_quota_and_a_spawn_past_it_is_refused_naming_it(
    hub: Hub, admin: Visitor, student: Visitor
) -> None:
    put = admin.call("PUT", "api/quotas/cohort/cs-101", json={"gpus_held": 1})
    assert put.status_code == 200, put.text
    try:
        quota = admin.call("GET", "api/users/student1/quota").json()["quota"]
        assert quota["gpus_held"] == {"value": 1, "source": "cohort cs-101"}
        refused = hub.spawn("student1", TWO_T4)
        assert refused.status_code == 403, refused.text
        assert "from cohort cs-101" in refused.json()["message"]
        assert hub.composed_hosts() == {}
        assert student.call("GET", "api/me").json()["quota"]["gpus_held"]["value"] == 1
    finally:
        assert admin.call("DELETE", "api/quotas/cohort/cs-101").status_code == 204
    entries = admin.call("GET", "api/audit").json()["entries"]
    assert [(e["action"], e["target"], e["actor"]) for e in entries[:2]] == [
        ("quota.delete", "quota cohort cs-101", "admin"),
        ("quota.set", "quota cohort cs-101", "admin"),
    ]
    assert entries[0]["origin"] == "127.0.0.1"


@pytest.mark.timeout(60)
@pytest.mark.timeout(120)
def test_a_quota_that_allows_no_gpu_model_is_shown_and_refuses_gpus_naming_it(
    hub: Hub, admin: Visitor, student: Visitor
) -> None:
    put = admin.call("PUT", "api/quotas/user/student1", json={"models": []})
    assert put.status_code == 200, put.text
    try:
        me = student.call("GET", "api/me")
        assert me.status_code == 200, me.text
        assert me.json()["quota"]["models"] == {"value": [], "source": "student1's own quota"}
        form = student.session.get(f"{hub.url}/hub/spawn", timeout=30)
        assert form.status_code == 200, form.text
        assert "No GPU models are allowed by student1&#39;s own quota for now" in form.text
        refused = hub.spawn("student1", TWO_T4)
        assert refused.status_code == 403, refused.text
        assert "GPU model t4 is not allowed by student1's own quota" in refused.json()["message"]
        assert hub.composed_hosts() == {}
    finally:
        assert admin.call("DELETE", "api/quotas/user/student1").status_code == 204


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "api/quotas", None),
        ("PUT", "api/quotas/site", {"gpus_held": 99}),
        ("DELETE", "api/quotas/user/student1", None),
        ("GET", "api/users/student2/quota", None),
        ("GET", "api/audit", None),
        ("GET", "quotas", None),
        ("GET", "audit", None),
        ("GET", "api/usage", None),
        ("GET", "usage", None),
        ("GET", "api/cohorts", None),
        ("GET", "cohorts", None),
        ("PUT", "api/cohorts/cs-101", {"title": "mine now"}),
    ],
)
def test_a_student_gets_403_on_every_admin_page_and_call(
    admin: Visitor, student: Visitor, method: str, path: str, body: Any
) -> None:
    before = admin.call("GET", "api/quotas").json()
    response = student.call(method, path, json=body)
    assert response.status_code == 403, response.text
    assert "admins" in response.text
    assert admin.call("GET", "api/quotas").json() == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("api/quotas/site", {"gpus_held": -1}, "gpus_held must be from 0 to 10000, not -1"),
        ("api/quotas/site", {"gpus_held": "2"}, "gpus_held must be a number, not str"),
        ("api/quotas/site", {"gpus_held": 10**12}, "gpus_held must be from 0 to 10000"),
        ("api/quotas/site", {"gpu_limit": 1}, "unknown limit 'gpu_limit'"),
        ("api/quotas/site", [1], "send a JSON object of limits"),
        ("api/quotas/user/student1", {"models": ["tpu"]}, "unknown GPU model 'tpu'"),
        ("api/quotas/cohort/no-such-group", {"gpus_held": 1}, "No group 'no-such-group'"),
        ("api/quotas/user/a%00b", {"servers": 1}, "the user's name has a control character"),
        (
            "api/quotas/cohort/%3Cscript%3E",
            {"gpus_held": 1},
            "No group '<script>' in the hub",
        ),
    ],
)
def test_bad_quota_input_is_refused_with_a_message_and_nothing_stored(
    admin: Visitor, path: str, body: Any, message: str
) -> None:
    before = admin.call("GET", "api/quotas").json()
    audit = admin.call("GET", "api/audit").json()
    response = admin.call("PUT", path, json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert admin.call("GET", "api/quotas").json() == before
    assert admin.call("GET", "api/audit").json() == audit


@pytest.mark.timeout(60)
def test_a_change_without_the_xsrf_token_is_refused(hub: Hub, admin: Visitor) -> None:
    response = admin.session.put(
        f"{hub.url}{PORTAL}api/quotas/site", json={"gpus_held": 1}, timeout=30
    )
    assert response.status_code == 403
    assert admin.call("GET", "api/quotas").json() == {"rules": []}


@pytest.mark.timeout(60)
def test_markup_in_a_users_name_is_shown_as_text(admin: Visitor) -> None:
    name = "<img src=x onerror=alert(1)>"
    put = admin.call(
        "PUT", f"api/quotas/user/{requests.utils.quote(name, safe='')}", json={"servers": 1}
    )
    assert put.status_code == 200, put.text
    try:
        page = admin.call("GET", "quotas")
        assert name not in page.text
        assert "&lt;img src=x onerror=alert(1)&gt;" in page.text
        audit = admin.call("GET", "audit")
        assert name not in audit.text
        csv = admin.call("GET", "api/audit", params={"format": "csv"})
        assert csv.headers["Content-Type"].startswith("text/csv")
        assert name in csv.text  # CSV is data, not a page
    finally:
        quoted = requests.utils.quote(name, safe="")
        assert admin.call("DELETE", f"api/quotas/user/{quoted}").status_code == 204


EVERY_DAY = [f"{day} 00:00-24:00" for day in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")]


@pytest.mark.timeout(180)
def test_a_cohort_session_keeps_t4s_for_its_members_and_not_for_others(
    hub: Hub, admin: Visitor, student: Visitor
) -> None:
    cohort = {
        "title": "Intro to DL",
        "sessions": EVERY_DAY,
        "reserved_model": "t4",
        "reserved_gpus": 7,
    }
    put = admin.call("PUT", "api/cohorts/cs-101", json=cohort)
    assert put.status_code == 200, put.text
    try:
        # 8 T4s, 7 kept for cs-101: researcher1 (vision-lab) may take 1, not 2.
        refused = hub.spawn("researcher1", TWO_T4)
        assert refused.status_code == 409, refused.text
        assert "kept for cohort cs-101's session until 24:00" in refused.json()["message"]
        assert hub.composed_hosts() == {}

        hub.spawn("student1", TWO_T4).raise_for_status()  # a member
        hub.wait_ready("student1")
        me = student.call("GET", "api/me").json()
        [mine] = me["cohorts"]
        assert (mine["name"], mine["reserved_gpus"], mine["title"]) == ("cs-101", 7, "Intro to DL")
        assert mine["next_session"] is not None
        assert len(me["servers"][0]["gpus"]) == 2
    finally:
        hub.stop("student1")
        hub.wait_gone("student1")
        assert admin.call("DELETE", "api/cohorts/cs-101").status_code == 204
    assert admin.call("GET", "api/audit").json()["entries"][0]["action"] == "cohort.delete"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "api/cohorts/cs-101",
            {"reserved_model": "tpu", "reserved_gpus": 1},
            "unknown GPU model 'tpu'",
        ),
        (
            "api/cohorts/cs-101",
            {"sessions": ["Monday 9-11"]},
            "write a session as 'Mon 09:00-11:00'",
        ),
        ("api/cohorts/cs-101", {"sessions": "Mon 09:00-11:00"}, "sessions must be a list"),
        ("api/cohorts/cs-101", {"stacks": ["conda"]}, "unknown stack 'conda'"),
        ("api/cohorts/cs-101", {"starter_kit": "mnist"}, "unknown starter kit 'mnist'"),
        (
            "api/cohorts/cs-101",
            {"stacks": ["tensorflow"], "starter_kit": "digits"},
            "runs on the 'pytorch' stack, which the cohort's stacks leave out",
        ),
        ("api/cohorts/cs-101", {"starts_on": "2026-12-01", "ends_on": "2026-09-01"}, "ends before"),
        ("api/cohorts/cs-101", {"starts_on": "next monday"}, "starts_on must be a date"),
        ("api/cohorts/cs-101", {"reserved_gpus": 2}, "a reservation names both a GPU model"),
        (
            "api/cohorts/cs-101",
            {"reserved_model": "t4", "reserved_gpus": -2},
            "reserved_gpus must be",
        ),
        (
            "api/cohorts/cs-101",
            {"reserved_model": "t4", "reserved_gpus": 48, "reserved_share": 3},
            "offered in halves and quarters (reserved_share 2 or 4",
        ),
        (
            "api/cohorts/cs-101",
            {"reserved_model": "a100", "reserved_gpus": 8, "reserved_share": 4},
            "offered only whole",
        ),
        (
            "api/cohorts/cs-101",
            {"reserved_model": "t4", "reserved_gpus": 48, "reserved_share": "1/4"},
            "reserved_share must be a whole number, not '1/4'",
        ),
        ("api/cohorts/cs-101", {"room": "B12"}, "unknown field 'room'"),
        ("api/cohorts/no-such-group", {"title": "x"}, "No group 'no-such-group'"),
    ],
)
def test_bad_cohort_input_is_refused_with_a_message_and_nothing_stored(
    admin: Visitor, path: str, body: Any, message: str
) -> None:
    response = admin.call("PUT", path, json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert admin.call("GET", "api/cohorts").json() == {"cohorts": []}


@pytest.mark.timeout(60)
def test_a_reservation_in_quarters_is_stored_and_shown(admin: Visitor) -> None:
    quarters = {"sessions": ["Tue 14:00-16:00"], "reserved_model": "t4", "reserved_gpus": 48}
    put = admin.call("PUT", "api/cohorts/cs-101", json={**quarters, "reserved_share": 4})
    assert put.status_code == 200, put.text
    try:
        stored = admin.call("GET", "api/cohorts/cs-101").json()
        assert (stored["reserved_gpus"], stored["reserved_share"]) == (48, 4)
        assert stored["reservation"] == "48 × ¼ NVIDIA T4 16GB (12 GPUs)"
        page = admin.call("GET", "cohorts")
        assert "48 × ¼ NVIDIA T4 16GB (12 GPUs)" in page.text
        assert '<option value="4">1/4 of a GPU</option>' in page.text
    finally:
        assert admin.call("DELETE", "api/cohorts/cs-101").status_code == 204


@pytest.mark.timeout(120)
def test_course_staff_manage_their_own_cohort_and_nothing_else(hub: Hub, admin: Visitor) -> None:
    teacher = Visitor(hub, "teacher1")  # custom:compose:staff!group=cs-101 in the demo
    kept = {"sessions": ["Mon 09:00-11:00"], "reserved_model": "t4", "reserved_gpus": 2}
    for group in ("cs-101", "vision-lab"):
        assert admin.call("PUT", f"api/cohorts/{group}", json=kept).status_code == 200
    try:
        assert [c["name"] for c in teacher.call("GET", "api/cohorts").json()["cohorts"]] == [
            "cs-101"
        ]
        change = {
            "title": "Deep learning",
            "sessions": ["Tue 10:00-12:00"],
            "starter_kit": "digits",
        }
        put = teacher.call("PUT", "api/cohorts/cs-101", json=change)
        assert put.status_code == 200, put.text
        stored = admin.call("GET", "api/cohorts/cs-101").json()
        assert (stored["title"], stored["sessions"], stored["starter_kit"]) == (
            "Deep learning",
            ["Tue 10:00-12:00"],
            "digits",
        )
        assert (stored["reserved_model"], stored["reserved_gpus"]) == ("t4", 2)  # the admins'

        grow = teacher.call("PUT", "api/cohorts/cs-101", json={**change, "reserved_gpus": 6})
        assert grow.status_code == 403, grow.text
        assert "only the GPU pool's admins change a cohort's reservation" in grow.json()["message"]
        for method, path in [
            ("PUT", "api/cohorts/vision-lab"),
            ("GET", "api/cohorts/vision-lab"),
            ("DELETE", "api/cohorts/cs-101"),
            ("GET", "api/quotas"),
            ("GET", "api/inventory"),
            ("GET", "quotas"),
        ]:
            response = teacher.call(method, path, json=change if method == "PUT" else None)
            assert response.status_code == 403, (method, path, response.text)
        assert admin.call("GET", "api/cohorts/cs-101").json() == stored
        assert admin.call("GET", "api/cohorts/vision-lab").json()["title"] == ""

        page = teacher.call("GET", "cohorts")
        assert page.status_code == 200
        assert 'data-cohort="cs-101"' in page.text
        assert "vision-lab" not in page.text
        assert "Delete" not in page.text
        assert 'name="reserved_gpus"' not in page.text
        [entry, *_] = admin.call("GET", "api/audit").json()["entries"]
        assert (entry["action"], entry["target"], entry["actor"]) == (
            "cohort.set",
            "cohort cs-101",
            "teacher1",
        )
    finally:
        for group in ("cs-101", "vision-lab"):
            assert admin.call("DELETE", f"api/cohorts/{group}").status_code == 204


@pytest.mark.timeout(180)
def test_an_admin_releases_a_machine_and_its_user_is_told_why(
    hub: Hub, admin: Visitor, student: Visitor
) -> None:
    hub.spawn("student1", TWO_T4).raise_for_status()
    hub.wait_ready("student1")
    inventory = admin.call("GET", "api/inventory").json()
    held = [d for d in inventory["devices"] if d["holder"] and d["holder"]["user"] == "student1"]
    assert {d["kind"] for d in held} == {"gpu"}  # the host is shared: its block is nobody's
    [host] = [h for h in inventory["hosts"] if any(m["user"] == "student1" for m in h["machines"])]
    [mine] = [m for m in host["machines"] if m["user"] == "student1"]
    assert mine["share"] == {"cores": 8, "memory_gib": 64}  # the default size for two GPUs
    assert host["free"]["slots"] <= host["capacity"]["slots"] - 2
    assert {d["holder"]["state"] for d in held} == {"running"}
    machine = held[0]["holder"]["machine"]
    t4 = next(row for row in inventory["summary"] if row["model"] == "NVIDIA T4")
    assert t4["held"] == 2

    assert admin.call("POST", f"api/machines/{machine}/release", json={}).status_code == 400
    assert (
        student.call("POST", f"api/machines/{machine}/release", json={"reason": "x"}).status_code
        == 403
    )
    assert hub.server("student1") is not None  # neither stopped anything

    reason = "<b>Maintenance</b> on rack 1"
    released = admin.call("POST", f"api/machines/{machine}/release", json={"reason": reason})
    assert released.status_code == 202, released.text
    assert released.json() == {
        "machine": machine,
        "user": "student1",
        "server": "",
        "stopping": True,
    }
    hub.wait_gone("student1")
    wait_for(lambda: hub.composed_hosts() == {}, 30, "the released devices to be detached")
    notices = student.call("GET", "api/me").json()["notices"]
    assert notices[0].startswith("An admin (admin) stopped your default server at ")
    assert notices[0].endswith(f": {reason}")
    page = student.call("GET", "")
    assert "&lt;b&gt;Maintenance&lt;/b&gt;" in page.text
    assert (
        admin.call("POST", f"api/machines/{machine}/release", json={"reason": "again"}).status_code
        == 404
    )


RTX = {"gpu_model": "rtx6000", "gpu_count": 1, "network": "shared"}


def tomorrow() -> str:
    return (datetime.now(UTC) + timedelta(days=2)).date().isoformat()


@pytest.mark.timeout(240)
def test_a_registered_gpu_is_its_groups_alone_until_they_lend_it(
    hub: Hub, admin: Visitor, student: Visitor
) -> None:
    # The hub has read the fabric's inventory (a form rendered), so the ledger knows the GPUs.
    assert student.session.get(f"{hub.url}/hub/spawn", timeout=30).status_code == 200
    # x1-rtx6000-1 and -2 are vision-lab's by the catalog; the admin gives -1 to cs-101.
    put = admin.call("PUT", "api/devices/x1-rtx6000-1/owner", json={"owner_group": "cs-101"})
    assert put.status_code == 200, put.text
    researcher = Visitor(hub, "researcher1")
    try:
        mine = [d["id"] for d in student.call("GET", "api/colocated").json()["devices"]]
        assert mine == ["x1-rtx6000-1"]  # a member sees only their groups' own
        hub.spawn("student1", RTX).raise_for_status()
        hub.wait_ready("student1")
        assert "x1-rtx6000-1" in hub.attached(hub.server_host("student1"))
        # researcher1 (vision-lab) gets -2, never -1; with -2 taken there is none for them.
        hub.spawn("researcher1", RTX).raise_for_status()
        hub.wait_ready("researcher1")
        assert "x1-rtx6000-2" in hub.attached(hub.server_host("researcher1"))
        hub.stop("student1")
        hub.wait_gone("student1")
        hub.stop("researcher1")
        hub.wait_gone("researcher1")

        # A member of another group may not lend it; a member of cs-101 lends it to researcher1.
        denied = researcher.call(
            "PUT",
            "api/devices/x1-rtx6000-1/loan",
            json={"user": "researcher1", "until": tomorrow()},
        )
        assert denied.status_code == 403, denied.text
        lent = student.call(
            "PUT",
            "api/devices/x1-rtx6000-1/loan",
            json={"user": "researcher1", "until": tomorrow()},
        )
        assert lent.status_code == 200, lent.text
        hub.spawn("researcher1", {**RTX, "gpu_count": 2}).raise_for_status()  # -1 lent, -2 theirs
        hub.wait_ready("researcher1")
        held = set(hub.attached(hub.server_host("researcher1")))
        assert {"x1-rtx6000-1", "x1-rtx6000-2"} <= held
        hub.stop("researcher1")
        hub.wait_gone("researcher1")
        assert student.call("DELETE", "api/devices/x1-rtx6000-1/loan").status_code == 204
        refused = hub.spawn("researcher1", {**RTX, "gpu_count": 2})
        assert refused.status_code in (403, 409), refused.text  # taken back: -2 alone is theirs
        assert hub.composed_hosts() == {}
    finally:
        assert admin.call("DELETE", "api/devices/x1-rtx6000-1/owner").status_code == 204
    devices = admin.call("GET", "api/colocated").json()["devices"]
    [given_back] = [d for d in devices if d["id"] == "x1-rtx6000-1"]
    assert (given_back["owner_group"], given_back["registered"]) == ("vision-lab", False)
    actions = [e["action"] for e in admin.call("GET", "api/audit").json()["entries"][:4]]
    assert actions == ["device.unregister", "device.take_back", "device.lend", "device.register"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        (
            "PUT",
            "api/devices/no-such-gpu/owner",
            {"owner_group": "cs-101"},
            404,
            "No device 'no-such-gpu'",
        ),
        (
            "PUT",
            "api/devices/x1-rtx6000-2/owner",
            {"owner_group": "nobody"},
            400,
            "No group 'nobody'",
        ),
        ("PUT", "api/devices/x1-rtx6000-2/owner", {}, 400, "Name the owner"),
        (
            "PUT",
            "api/devices/x1-rtx6000-2/loan",
            {"user": "student1", "until": "2026-12-01"},
            404,
            "not a registered",
        ),
        ("DELETE", "api/devices/x1-rtx6000-2/owner", None, 404, "not a registered"),
    ],
)
def test_bad_colocation_input_is_refused_with_a_message(
    hub: Hub, admin: Visitor, method: str, path: str, body: Any, status: int, message: str
) -> None:
    assert admin.session.get(f"{hub.url}/hub/spawn", timeout=30).status_code == 200  # GPUs seen
    response = admin.call(method, path, json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["message"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"user": "student1", "until": "2020-01-01"}, "a loan ends after today"),
        ({"user": "student1", "until": "2099-01-01"}, "within 366 days"),
        ({"user": "student1"}, "say until when"),
        ({"user": "a", "group": "b", "until": "2026-12-01"}, "name one of them"),
        ({"user": "ghost", "until": None}, "say until when"),
        ({"group": "nobody", "until": "tomorrow"}, "until must be a date"),
    ],
)
def test_a_bad_loan_is_refused_and_nothing_lent(
    hub: Hub, admin: Visitor, body: Any, message: str
) -> None:
    assert admin.session.get(f"{hub.url}/hub/spawn", timeout=30).status_code == 200  # GPUs seen
    assert (
        admin.call(
            "PUT", "api/devices/x1-rtx6000-2/owner", json={"owner_group": "vision-lab"}
        ).status_code
        == 200
    )
    try:
        response = admin.call("PUT", "api/devices/x1-rtx6000-2/loan", json=body)
        assert response.status_code == 400, response.text
        assert message in response.json()["message"]
        [device] = [
            d
            for d in admin.call("GET", "api/colocated").json()["devices"]
            if d["id"] == "x1-rtx6000-2"
        ]
        assert device["loan"] is None
    finally:
        assert admin.call("DELETE", "api/devices/x1-rtx6000-2/owner").status_code == 204


@pytest.mark.timeout(180)
def test_usage_counts_the_hours_just_used_by_user_cohort_and_model(
    hub: Hub, admin: Visitor
) -> None:
    assert admin.call("PUT", "api/cohorts/cs-101", json={}).status_code == 200
    try:
        hub.spawn("student1", TWO_T4).raise_for_status()
        hub.wait_ready("student1")
        live = admin.call("GET", "api/usage").json()
        [running] = [m for m in live["running"] if m["user"] == "student1"]
        assert (running["gpus"], running["models"]) == (2, ["NVIDIA T4"])
        hub.stop("student1")
        hub.wait_gone("student1")

        usage = admin.call("GET", "api/usage").json()
        today = datetime.now(UTC).date().isoformat()
        assert usage["until"] == today
        mine = next(u for u in usage["top_users"] if u["user"] == "student1")
        assert mine["gpu_hours"] > 0
        # Earlier tests here ran student1 on other models too.
        assert usage["by_model"]["NVIDIA T4"] > 0
        assert usage["gpu_hours"] == pytest.approx(sum(usage["by_model"].values()), abs=1e-3)
        assert usage["gpu_hours"] >= mine["gpu_hours"]
        assert usage["by_cohort"]["cs-101"] >= mine["gpu_hours"]
        assert usage["by_day"][-1]["day"] == today
        assert usage["by_day"][-1]["gpu_hours"]["NVIDIA T4"] == usage["by_model"]["NVIDIA T4"]

        csv = admin.call("GET", "api/usage", params={"format": "csv", "since": today})
        assert csv.headers["Content-Type"].startswith("text/csv")
        header, *rows = csv.text.splitlines()
        assert header == "day,user,model,gpu_hours,used_gpu_hours,given_back_gpu_hours"
        assert any(row.startswith(f"{today},student1,NVIDIA T4,") for row in rows)

        page = admin.call("GET", "usage")
        assert page.status_code == 200
        assert 'id="usage-by-day"' in page.text
        plotly = admin.session.get(f"{hub.url}{PORTAL}static/plotly.min.js", timeout=30)
        assert plotly.status_code == 200
        assert "plotly.js" in plotly.text[:500]
    finally:
        assert admin.call("DELETE", "api/cohorts/cs-101").status_code == 204


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": "2026-02-30"}, "since: '2026-02-30' is not a date; write it as YYYY-MM-DD."),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "is after until"),
        ({"since": "2020-01-01", "until": "2026-01-01"}, "more than 366 days"),
        ({"until": "<script>"}, "until: '<script>' is not a date"),
    ],
)
def test_a_bad_usage_range_is_refused_with_what_to_fix(
    admin: Visitor, params: dict[str, str], message: str
) -> None:
    response = admin.call("GET", "api/usage", params=params)
    assert response.status_code == 400
    assert message in response.json()["message"]
    page = admin.call("GET", "usage", params=params)
    assert page.status_code == 400
    assert "<script>" not in page.text
