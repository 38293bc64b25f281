"""What the portal tells users of their idle GPUs, *Keep*, and cohorts' reclaim policies:
its real routes, service and SQLite ledger (``test_portal_handlers``'s portal), the
reclaimer's memory written as the reclaimer writes it (``ledger.reclaims.save_watches``)."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import pytest

from composespawner.domain.reclaim import GpuWatch, ReclaimPolicy
from tests.unit.test_portal_handlers import Portal, hub_auth, portal, running

__all__ = ["hub_auth", "portal"]  # the fixtures, used by name

pytestmark = pytest.mark.timeout(30)


def machine_of(p: Portal, user: str) -> str:
    (machine,) = p.composer.ledger.live_machines(user)
    return machine.id


def idle_and_warned(p: Portal, user: str, gpu: str, idle_s: float, warned_ago: float) -> float:
    """The reclaimer's watch of a GPU a kernel holds without work for ``idle_s``, warned
    ``warned_ago`` seconds ago; the time it was read."""
    now = time.time()
    watch = GpuWatch(
        since=now - idle_s,
        last_at=now,
        last_held_at=now,
        idle_from=now - idle_s,
        memory_used_mib=2000.0,
        warned_at=now - warned_ago,
    )
    p.composer.ledger.reclaims.save_watches({(machine_of(p, user), gpu): watch})
    return now


def set_site_policy(p: Portal, policy: ReclaimPolicy) -> None:
    p.app.settings["portal"].reclaims.site = policy


def only_gpu(answer: dict[str, Any]) -> dict[str, Any]:
    (gpu,) = answer["gpus"]
    return gpu


async def test_a_gpu_nobody_watches_yet_says_unknown_not_idle(portal: Portal) -> None:
    await running(portal, "student1")

    status, server = await portal.json("GET", "api/me/server/gpus", user="student1")

    assert status == 200, server
    gpu = only_gpu(server)
    assert (gpu["idle_s"], gpu["warning"], gpu["kept_until"]) == (None, None, None)
    assert server["reclaim_policy"]["reclaim_after"] == 3600.0


async def test_a_warned_gpu_says_when_it_goes_and_keep_holds_it_off(portal: Portal) -> None:
    (gpu_id,) = await running(portal, "student1")
    read_at = idle_and_warned(portal, "student1", gpu_id, idle_s=2000, warned_ago=600)

    status, server = await portal.json("GET", "api/me/server/gpus", user="student1")
    assert status == 200, server
    gpu = only_gpu(server)
    assert 2000 <= gpu["idle_s"] <= 2000 + 30
    warning = gpu["warning"]
    # Warned 600 s ago with a site's 3600 - 1800 s of notice: taken in 1200 s.
    reclaim_at = warning["reclaim_at"]
    assert abs(_epoch(reclaim_at) - (read_at - 600 + 1800)) <= 1
    assert "has done no work for 33 min" in warning["message"]
    assert "press Keep (holds it 60 min)" in warning["message"]
    assert (warning["keep_allowed"], warning["keeps_left"]) == (True, None)
    status, mine = await portal.json("GET", "api/me", user="student1")
    assert only_gpu(mine["servers"][0])["warning"] == warning
    page = await portal.call("GET", "", user="student1")
    assert b"gpu-warning" in page.body
    assert b'value="keep"' in page.body

    status, kept = await portal.json("POST", f"api/me/server/gpus/{gpu_id}/keep", user="student1")

    assert status == 200, kept
    assert kept["message"].startswith("Kept your ")
    assert abs(_epoch(kept["kept_until"]) - (time.time() + 3600)) <= 5
    status, server = await portal.json("GET", "api/me/server/gpus", user="student1")
    gpu = only_gpu(server)
    assert gpu["warning"] is None
    assert gpu["kept_until"] == kept["kept_until"]
    (watch,) = portal.composer.ledger.reclaims.watches().values()
    assert (watch.keeps_used, watch.warned_at) == (1, None)


async def test_keep_is_refused_once_the_policy_allows_no_more(portal: Portal) -> None:
    set_site_policy(portal, ReclaimPolicy(keeps_allowed=1))
    (gpu_id,) = await running(portal, "student1")
    idle_and_warned(portal, "student1", gpu_id, idle_s=2000, warned_ago=60)
    assert (
        only_gpu((await portal.json("GET", "api/me/server/gpus", user="student1"))[1])["warning"][
            "keeps_left"
        ]
        == 1
    )
    status, kept = await portal.json("POST", f"api/me/server/gpus/{gpu_id}/keep", user="student1")
    assert (status, kept["keeps_left"]) == (200, 0)
    assert "Keep presses left on this GPU: 0" in kept["message"]

    status, answer = await portal.json(
        "POST", f"api/me/server/gpus/{gpu_id}/keep", user="student1", body={}
    )

    assert (status, answer["status"]) == (409, 409), answer
    assert "all the policy allows (1): use the GPU to keep it" in answer["message"]
    (watch,) = portal.composer.ledger.reclaims.watches().values()
    assert watch.keeps_used == 1


async def test_keep_is_off_where_the_policy_allows_none(portal: Portal) -> None:
    set_site_policy(portal, ReclaimPolicy(keeps_allowed=0))
    (gpu_id,) = await running(portal, "student1")
    idle_and_warned(portal, "student1", gpu_id, idle_s=2000, warned_ago=60)

    status, server = await portal.json("GET", "api/me/server/gpus", user="student1")
    warning = only_gpu(server)["warning"]
    assert (warning["keep_allowed"], warning["keeps_left"]) == (False, 0)
    assert "unless you use it." in warning["message"]
    assert "Keep" not in warning["message"]
    page = await portal.call("GET", "", user="student1")
    assert b"gpu-warning" in page.body
    assert b'value="keep"' not in page.body
    status, answer = await portal.json("POST", f"api/me/server/gpus/{gpu_id}/keep", user="student1")
    assert status == 409
    assert "Keep is turned off here" in answer["message"]


async def test_a_stale_reading_shows_no_figures_and_no_warning(portal: Portal) -> None:
    (gpu_id,) = await running(portal, "student1")
    idle_and_warned(portal, "student1", gpu_id, idle_s=2000, warned_ago=60)
    stale = {k: replace(w, last_at=w.last_at - 600) for k, w in _watches(portal).items()}
    portal.composer.ledger.reclaims.save_watches(stale)

    _status, server = await portal.json("GET", "api/me/server/gpus", user="student1")

    gpu = only_gpu(server)
    assert (gpu["idle_s"], gpu["warning"]) == (None, None)


@pytest.mark.parametrize(
    ("whose", "path_gpu", "body", "status", "said"),
    [
        ("student2", "theirs", None, 404, "Your default server holds no GPU"),
        ("student1", "no-such-gpu", None, 404, "Your default server holds no GPU 'no-such-gpu'"),
        ("student1", "mine", {"until": "forever"}, 400, "Keep takes no fields"),
        ("student1", "mine", [1], 400, "Keep takes no fields"),
    ],
)
async def test_a_keep_on_a_gpu_not_yours_or_with_fields_is_refused_and_changes_nothing(
    portal: Portal, whose: str, path_gpu: str, body: object, status: int, said: str
) -> None:
    (mine,) = await running(portal, "student1")
    (theirs,) = await running(portal, "student2")
    gpu = {"mine": mine, "theirs": theirs}.get(path_gpu, path_gpu)

    code, answer = await portal.json(
        "POST", f"api/me/server/gpus/{gpu}/keep", user="student1", body=body
    )

    assert (code, answer["status"]) == (status, status), answer
    assert said in answer["message"]
    assert portal.composer.ledger.reclaims.watches() == {}


async def test_a_keep_on_a_server_that_is_not_running_is_a_404(portal: Portal) -> None:
    (gpu_id,) = await running(portal, "student1")

    status, answer = await portal.json(
        "POST", f"api/me/servers/other/gpus/{gpu_id}/keep", user="student1"
    )

    assert status == 404, answer
    assert "Your server 'other' is not running" in answer["message"]


async def test_the_my_machine_page_keeps_a_warned_gpu(portal: Portal) -> None:
    (gpu_id,) = await running(portal, "student1")
    idle_and_warned(portal, "student1", gpu_id, idle_s=2000, warned_ago=60)
    form = {"action": "keep", "server": "", "gpu": gpu_id}

    page = await portal.call(
        "POST",
        "",
        user="student1",
        raw=_form(form),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )

    assert page.code == 200, page.body
    assert b"Kept your " in page.body
    assert b"gpu-kept" in page.body
    assert b"gpu-warning" not in page.body


# -- cohorts' policies ------------------------------------------------------------------


async def test_admins_set_a_cohorts_policy_and_give_it_back_to_the_sites(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    overrides = {"warn_after": 600, "reclaim_after": 1200}

    status, answer = await portal.json(
        "PUT", "api/cohorts/cs-101/reclaim-policy", user="admin", body=overrides
    )

    assert status == 200, answer
    assert answer["overrides"] == overrides
    assert (answer["policy"]["warn_after"], answer["policy"]["detach_after"]) == (600, 600.0)
    assert answer["site"]["warn_after"] == 1800.0
    assert portal.composer.ledger.reclaims.cohort_policy("cs-101") == overrides
    assert await portal.json("GET", "api/cohorts/cs-101/reclaim-policy", user="admin") == (
        200,
        answer,
    )
    deleted = await portal.call("DELETE", "api/cohorts/cs-101/reclaim-policy", user="admin")
    assert deleted.code == 204
    assert portal.composer.ledger.reclaims.cohort_policy("cs-101") is None


@pytest.mark.parametrize(
    ("user", "cohort", "body", "status", "said"),
    [
        ("admin", "cs-101", {"detach_after": -5}, 400, "detach_after must be a number"),
        ("admin", "cs-101", {"warn_after": 3600}, 400, "must be less than reclaim_after (3600 s)"),
        ("admin", "cs-101", {"reclaim_after": None}, 400, "go together"),
        ("admin", "cs-101", {"warn_after": "10m"}, 400, "warn_after must be a number"),
        ("admin", "cs-101", {"detach_after": 1e12}, 400, "at most 604800 (a week)"),
        ("admin", "cs-101", {"warn_after": 10**400}, 400, "at most 604800 (a week)"),
        ("admin", "cs-101", {"idle": 5}, 400, "unknown field 'idle'"),
        ("admin", "cs-101", {"max_gap": 30}, 400, "more than the reclaimer's interval (60 s)"),
        ("admin", "cs-101", [600], 400, "Send the fields to change"),
        ("admin", "no-such", {"detach_after": 300}, 404, "No cohort 'no-such'"),
        ("student1", "cs-101", {"detach_after": 99999}, 403, "Only the GPU pool's admins"),
    ],
)
async def test_a_bad_cohort_policy_is_refused_and_nothing_stored(
    portal: Portal, user: str, cohort: str, body: object, status: int, said: str
) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})

    code, answer = await portal.json(
        "PUT", f"api/cohorts/{cohort}/reclaim-policy", user=user, body=body
    )

    assert (code, answer["status"]) == (status, status), answer
    assert said in answer["message"]
    assert portal.composer.ledger.reclaims.cohort_policies() == {}


def _watches(p: Portal) -> dict[tuple[str, str], GpuWatch]:
    return p.composer.ledger.reclaims.watches()


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _form(fields: dict[str, str]) -> bytes:
    return urlencode(fields).encode()


async def test_admins_set_a_cohorts_policy_on_the_cohorts_page_in_minutes(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    form = {"action": "reclaim-policy", "name": "cs-101", "warn_after_min": "15"}
    form["reclaim_after_min"] = "soon"
    refused = await portal.call("POST", "cohorts", user="admin", headers=headers, raw=_form(form))
    assert refused.code == 400
    assert b"reclaim_after: minutes as a number (or seconds, as 90s), &#39;off&#39;" in refused.body
    assert portal.composer.ledger.reclaims.cohort_policies() == {}
    form["reclaim_after_min"] = "10"  # before the warning
    refused = await portal.call("POST", "cohorts", user="admin", headers=headers, raw=_form(form))
    assert refused.code == 400
    assert b"warn_after (900 s) must be less than reclaim_after (600 s)" in refused.body
    assert portal.composer.ledger.reclaims.cohort_policies() == {}

    form.update(reclaim_after_min="30", detach_after_min="off", keeps_allowed="1")
    saved = await portal.call("POST", "cohorts", user="admin", headers=headers, raw=_form(form))

    assert saved.code == 302
    assert portal.composer.ledger.reclaims.cohort_policy("cs-101") == {
        "warn_after": 900.0,
        "reclaim_after": 1800.0,
        "detach_after": None,
        "keeps_allowed": 1,
    }
    page = await portal.call("GET", "cohorts", user="admin")
    assert b"detach after off unheld \xc2\xb7 warn after 15 min idle" in page.body
    staff = await portal.call("POST", "cohorts", user="student1", headers=headers, raw=_form(form))
    assert staff.code == 403


async def test_a_warned_gpu_beside_a_busy_one_waits_for_it_and_says_so(portal: Portal) -> None:
    idle_gpu, busy_gpu = await running(portal, "student1", gpus=2)
    now = idle_and_warned(portal, "student1", idle_gpu, idle_s=2000, warned_ago=600)
    busy = GpuWatch(since=now - 2000, last_at=now, last_work_at=now, last_held_at=now)
    portal.composer.ledger.reclaims.save_watches({(machine_of(portal, "student1"), busy_gpu): busy})

    status, server = await portal.json("GET", "api/me/server/gpus", user="student1")

    assert status == 200, server
    warned, working = server["gpus"]
    assert warned["warning"]["reclaim_at"] is None
    assert "once your server's other GPUs have been idle as long" in warned["warning"]["message"]
    assert "Your server's kernels are shut down then." in warned["warning"]["message"]
    assert (working["idle_s"], working["warning"]) == (0, None)


async def test_where_holders_are_known_a_warned_gpu_waits_only_for_its_own_kernels(
    portal: Portal,
) -> None:
    idle_gpu, busy_gpu = await running(portal, "student1", gpus=2)
    machine = machine_of(portal, "student1")
    now = idle_and_warned(portal, "student1", idle_gpu, idle_s=2000, warned_ago=600)
    (idle,) = portal.composer.ledger.reclaims.watches([machine]).values()
    busy = GpuWatch(since=now - 2000, last_at=now, last_work_at=now, last_held_at=now)

    async def told(idle_holders: tuple[str, ...], busy_holders: tuple[str, ...]) -> str:
        portal.composer.ledger.reclaims.save_watches(
            {
                (machine, idle_gpu): replace(idle, holders=idle_holders),
                (machine, busy_gpu): replace(busy, holders=busy_holders),
            }
        )
        status, server = await portal.json("GET", "api/me/server/gpus", user="student1")
        assert status == 200, server
        warning: dict[str, Any] = server["gpus"][0]["warning"]
        waits = "once the other GPUs its kernels may be using" in warning["message"]
        assert (warning["reclaim_at"] is None) == waits
        return str(warning["message"])

    # Another kernel trains on the busy GPU: the idle one goes on time, with its kernel.
    apart = await told(("kernel:k1",), ("kernel:k2",))
    assert "The kernel holding it is shut down then; your other kernels stay." in apart
    assert "once the other GPUs" not in apart
    # The same kernel holds both: it waits for that kernel to let the busy one go.
    assert "once the other GPUs its kernels may be using have been idle as long" in await told(
        ("kernel:k1",), ("kernel:k1",)
    )
    # A terminal's program holds it: no kernel ends, the program loses the GPU.
    assert "The program holding it (no notebook kernel) loses it then." in await told(
        ("pid:77",), ("kernel:k2",)
    )
    # Nothing holds it any more: nothing but the GPU goes.
    alone = await told((), ("kernel:k2",))
    assert "shut down" not in alone
    assert "loses it" not in alone


async def test_the_cohorts_form_sent_back_unchanged_keeps_every_override(portal: Portal) -> None:
    await portal.json("PUT", "api/cohorts/cs-101", user="admin", body={"title": "DL"})
    overrides = {"busy_percent": 5, "max_gap": 90, "warn_after": 1000, "reclaim_after": 2000}
    status, _ = await portal.json(
        "PUT", "api/cohorts/cs-101/reclaim-policy", user="admin", body=overrides
    )
    assert status == 200
    page = (await portal.call("GET", "cohorts", user="admin")).body.decode()
    shown = {
        name: re.search(rf'name="{name}" [^>]*value="([^"]*)"', page, re.S).group(1)  # type: ignore[union-attr]
        for name in ("detach_after_min", "warn_after_min", "reclaim_after_min", "keep_for_min")
    }
    assert shown == {
        "detach_after_min": "",
        "warn_after_min": "1000s",  # not a whole minute: shown in seconds, not rounded
        "reclaim_after_min": "2000s",
        "keep_for_min": "",
    }

    form = {"action": "reclaim-policy", "name": "cs-101", "keeps_allowed": "", **shown}
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    saved = await portal.call("POST", "cohorts", user="admin", headers=headers, raw=_form(form))

    assert saved.code == 302
    assert portal.composer.ledger.reclaims.cohort_policy("cs-101") == overrides
