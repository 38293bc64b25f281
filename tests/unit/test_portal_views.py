"""The portal's pure views: what a form or a body becomes, and what is refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime

import pytest

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import Cohort, InvalidCohort
from composespawner.domain.quotas import InvalidQuota, QuotaRule, effective_quota
from composespawner.domain.rooms import HostUse, Room
from composespawner.domain.usage import DayUse
from composespawner.ledger import DeviceRecord, Holding, HostRecord, Machine
from composespawner.ledger.records import ShareHolding
from composespawner.portal import usage_views, views
from composespawner.portal.machine_views import inventory, my_machine
from composespawner.portal.views import rule_from_form, rule_from_json, rule_json
from harness.paths import HUB_CONFIG

MODELS = ["t4", "a100"]
CATALOG = Catalog.from_file(HUB_CONFIG / "catalog.toml")  # its T4 comes in halves and quarters


def test_a_form_becomes_a_rule_and_empty_fields_stay_unset() -> None:
    form = {"gpus_held": " 2 ", "models": "t4, a100", "gpu_hours_week": "7.5", "servers": ""}
    rule = rule_from_form("cohort", " cs-101 ", form, MODELS)
    assert rule == QuotaRule(
        "cohort", "cs-101", gpus_held=2, models=frozenset(MODELS), gpu_hours_week=7.5
    )
    assert rule_json(rule)["models"] == ["a100", "t4"]
    assert rule_json(rule)["servers"] is None


@pytest.mark.parametrize(
    ("level", "subject", "form", "message"),
    [
        ("cohort", "x", {"gpus_held": "two"}, "gpus_held must be a number, not 'two'"),
        ("cohort", "x", {"gpus_held": "1.5"}, "gpus_held must be a whole number"),
        ("cohort", "", {"gpus_held": "1"}, "name the cohort: 1 to 255 characters"),
        ("site", "x", {}, "the site default names no subject"),
        ("planet", "x", {}, "choose the site default, a cohort or a user"),
        ("user", "x", {"models": "t4, tpu"}, "unknown GPU model 'tpu'; the catalog has: a100, t4"),
        ("user", "a\tb", {}, "the user's name has a control character"),
    ],
)
def test_a_bad_form_says_what_to_change(
    level: str, subject: str, form: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidQuota, match=message):
        rule_from_form(level, subject, form, MODELS)


def test_a_body_with_models_not_a_list_is_refused() -> None:
    with pytest.raises(InvalidQuota, match="models must be a list"):
        rule_from_json("site", "", {"models": "t4"}, MODELS)


def test_my_machine_lists_gpus_and_other_devices_of_each_server() -> None:
    at = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
    machine = Machine(
        id="m1",
        user_name="u",
        server_name="",
        state="running",
        host_id="host-01",
        zone="rack-1",
        request={},
        failure=None,
        created_at=at,
        updated_at=at,
        ended_at=None,
        block_ids=("gpu-1", "host-01-block", "nic-1"),
    )
    devices = {
        "gpu-1": DeviceRecord("gpu-1", "gpu", "NVIDIA T4", frozenset({"rack-1"}), "c1"),
        "nic-1": DeviceRecord("nic-1", "nic", "25GbE", frozenset({"rack-1"}), "c1"),
    }
    quota = effective_quota([QuotaRule("site", gpus_held=4)], "u", ())
    view = my_machine("u", ["b", "a"], quota, [machine], devices, 1.23456)
    assert view["groups"] == ["a", "b"]
    # A machine from before hosts were shared (no cores recorded) holds no share.
    assert view["use"] == {
        "gpus_held": 1,
        "gpus_held_text": "1 of 4 GPUs",
        "servers": 1,
        "gpu_hours_week": 1.235,
        "cores_held": 0,
        "memory_gib_held": 0,
    }
    [server] = view["servers"]
    assert server["gpus"] == [{"id": "gpu-1", "model": "NVIDIA T4"}]
    assert [d["kind"] for d in server["devices"]] == [
        "gpu",
        "nic",
    ]  # the host block is not a device
    assert server["since"] == "2026-11-24T09:00:00+00:00"
    sized = replace(machine, id="m2", server_name="cpu", cores=4, memory_gib=32, block_ids=())
    bigger = replace(sized, id="m3", server_name="big", cores=8, memory_gib=64)
    view = my_machine("u", [], quota, [machine, sized, bigger], devices, 0.0)
    assert (view["use"]["cores_held"], view["use"]["memory_gib_held"]) == (12, 96)
    assert view["quota"]["cores_held"] == {"value": None, "source": "no rule"}


def test_usage_rows_add_a_running_machines_share_to_its_day() -> None:
    ended = DayUse(date(2026, 3, 2), "alice", "t4", 3600.0)
    running = DayUse(date(2026, 3, 2), "alice", "t4", 1800.0)
    other = DayUse(date(2026, 3, 1), "=cmd", "t4", 36.0)
    used = DayUse(date(2026, 3, 2), "alice", "t4", 900.0, "used")
    back = DayUse(date(2026, 3, 2), "alice", "t4", 1800.0, "given_back")
    none = {"used_gpu_hours": 0.0, "given_back_gpu_hours": 0.0}
    assert usage_views.usage_rows([ended, other, running, used, back]) == [
        {"day": "2026-03-01", "user": "=cmd", "model": "t4", "gpu_hours": 0.01, **none},
        {
            "day": "2026-03-02",
            "user": "alice",
            "model": "t4",
            "gpu_hours": 1.5,
            "used_gpu_hours": 0.25,
            "given_back_gpu_hours": 0.5,
        },
    ]
    assert list(usage_views.usage_rows([ended])[0]) == list(usage_views.USAGE_COLUMNS)


def test_staff_keep_the_stored_reservation_when_they_leave_it_out() -> None:
    stored = Cohort("cs-101", reserved_model="t4", reserved_gpus=2)
    body = views.staff_change({"title": "DL", "reserved_gpus": 2}, stored)
    assert body == {"title": "DL", "reserved_model": "t4", "reserved_gpus": 2, "reserved_share": 1}
    unreserved = {"reserved_model": None, "reserved_gpus": 0, "reserved_share": 1}
    assert views.staff_change({}, None) == unreserved


@pytest.mark.parametrize(
    "body",
    [
        {"reserved_gpus": 3},
        {"reserved_model": "a100"},
        {"reserved_model": None},
        {"reserved_share": 4},
    ],
)
def test_staff_may_not_change_a_reservation(body: dict[str, object]) -> None:
    stored = Cohort("cs-101", reserved_model="t4", reserved_gpus=2)
    with pytest.raises(views.NotStaffsToChange, match="only the GPU pool's admins"):
        views.staff_change(body, stored)


def test_a_staff_form_leaves_out_what_is_empty() -> None:
    form = {"title": " DL ", "sessions": "Mon 09:00-11:00\n\n", "stacks": "a, b", "starts_on": ""}
    assert views.cohort_body_from_form(form) == {
        "title": "DL",
        "sessions": ["Mon 09:00-11:00"],
        "stacks": ["a", "b"],
    }


@pytest.mark.parametrize(
    ("asked", "shown", "number"),
    [
        (None, [0, 1], 1),
        ("2", [2, 3], 2),
        ("3", [4], 3),
        ("9", [4], 3),
        ("0", [0, 1], 1),
        ("x", [0, 1], 1),
    ],
)
def test_a_long_table_is_shown_a_page_at_a_time(
    asked: str | None, shown: list[int], number: int
) -> None:
    rows, paging = views.page_of(list(range(5)), asked, per_page=2)
    assert list(rows) == shown
    assert (paging.number, paging.pages, paging.total) == (number, 3, 5)


def test_the_inventory_shows_each_host_with_its_machines_and_room_left() -> None:
    now = datetime(2026, 11, 27, 9, tzinfo=UTC)
    gpu = DeviceRecord("r1-t4-1", "gpu", "NVIDIA T4", frozenset({"rack-1"}), "rack-1")
    host = DeviceRecord("host-01-block", "host", "64 cores", frozenset({"rack-1"}), "rack-1")
    holdings = [Holding(gpu, now, "m1", now, "ada", "", "running", "host-01"), Holding(host, now)]
    shared = Machine(
        "m1",
        "ada",
        "",
        "running",
        "host-01",
        "rack-1",
        {"size": "medium"},
        None,
        now,
        now,
        None,
        ("r1-t4-1",),
        cores=4,
        memory_gib=32,
    )
    whole = Machine(
        "m2", "bob", "big", "running", "host-02", "rack-1", {}, None, now, now, None, ()
    )
    rooms = [
        (HostRecord("host-01", "host-01-block", Room(64, 512, 16)), HostUse(4, 32, 1, 1)),
        (HostRecord("host-02", "host-02-block", Room(64, 512, 16)), HostUse(0, 0, 0, 0)),
    ]
    view = inventory(holdings, [shared, whole], rooms)
    first, second = view["hosts"]
    assert first["free"] == {"cores": 60, "memory_gib": 480, "slots": 15}
    assert first["machines"] == [
        {
            "machine": "m1",
            "user": "ada",
            "server": "",
            "state": "running",
            "share": {"cores": 4, "memory_gib": 32},
            "devices": ["r1-t4-1"],
            "since": "2026-11-27T09:00:00+00:00",
        }
    ]
    assert second["machines"][0]["share"] is None  # a machine from before: the whole host
    assert view["summary"] == [
        {"kind": "gpu", "model": "NVIDIA T4", "free": 0, "held": 1, "shared": 0},
        {"kind": "host", "model": "64 cores", "free": 1, "held": 0, "shared": 0},
    ]


def test_a_reservation_in_quarters_is_stored_and_shown_with_the_gpus_it_keeps() -> None:
    body = {"sessions": ["Tue 14:00-16:00"], "reserved_model": "t4", "reserved_gpus": 48}
    cohort = views.cohort_from_json("cs-101", {**body, "reserved_share": 4}, CATALOG)
    assert (cohort.reserved_gpus, cohort.reserved_share, cohort.reserved_whole) == (48, 4, 12)
    shown = views.cohort_json(cohort, CATALOG)
    assert shown["reserved_share"] == 4
    assert shown["reservation"] == "48 × ¼ NVIDIA T4 16GB (12 GPUs)"
    whole = views.cohort_from_json("cs-101", body, CATALOG)
    assert whole.reserved_share == 1
    assert views.cohort_json(whole, CATALOG)["reservation"] == "48 × NVIDIA T4 16GB"
    assert views.cohort_json(Cohort("lab"), CATALOG)["reservation"] == ""


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"reserved_share": 3},
            r"NVIDIA T4 16GB is offered in halves and quarters \(reserved_share 2 or 4",
        ),
        ({"reserved_share": 4, "reserved_model": "a100"}, "NVIDIA A100 80GB is offered only whole"),
        ({"reserved_share": 0.25}, "reserved_share must be a whole number, not 0.25"),
        ({"reserved_share": "4"}, "reserved_share must be a whole number, not '4'"),
        ({"reserved_share": True}, "reserved_share must be a whole number"),
        (
            {"reserved_share": 4, "reserved_model": None, "reserved_gpus": 0},
            "name its reserved_model",
        ),
    ],
)
def test_a_reservation_in_shares_the_model_is_not_offered_in_is_refused(
    changes: dict[str, object], message: str
) -> None:
    body = {"reserved_model": "t4", "reserved_gpus": 8, **changes}
    with pytest.raises(InvalidCohort, match=message):
        views.cohort_from_json("cs-101", body, CATALOG)


def test_a_cohort_form_posts_its_share_size_as_a_number() -> None:
    form = {"reserved_model": "t4", "reserved_gpus": "48", "reserved_share": "4"}
    body = views.cohort_body_from_form(form)
    assert (body["reserved_gpus"], body["reserved_share"]) == (48, 4)
    with pytest.raises(InvalidCohort, match="reserved_share must be a whole number"):
        views.cohort_from_json(
            "cs-101", views.cohort_body_from_form({**form, "reserved_share": "0.5"}), CATALOG
        )


def _split_t4(now: datetime) -> Holding:
    """A T4 in quarters: ada and bob hold one each (bob twice), cy's is being released."""
    t4 = DeviceRecord("r1-t4-2", "gpu", "NVIDIA T4", frozenset({"rack-1"}), "rack-1")
    holders = [
        ShareHolding("m3", "ada", "", "running", "host-01", "cs-101", now, False),
        ShareHolding("m4", "bob", "", "running", "host-01", None, now, False),
        ShareHolding("m5", "bob", "two", "running", "host-01", None, now, False),
        ShareHolding("m6", "cy", "", "stopping", "host-01", None, now, True),
    ]
    return Holding(t4, now, share_size=4, shares=tuple(holders))


def test_a_split_gpu_shows_as_shared_with_its_holders_not_as_free() -> None:
    now = datetime(2026, 11, 27, 9, tzinfo=UTC)
    view = inventory([_split_t4(now)])
    [device] = view["devices"]
    assert device["holder"] is None
    assert device["share"]["text"] == "in quarters: 3 of 4 held by ada, bob"
    assert [h["machine"] for h in device["share"]["holders"]] == ["m3", "m4", "m5", "m6"]
    assert device["share"]["holders"][3]["leaving"] is True
    assert view["summary"] == [
        {"kind": "gpu", "model": "NVIDIA T4", "free": 0, "held": 1, "shared": 1}
    ]


def test_running_lists_share_holders_with_their_fraction() -> None:
    now = datetime(2026, 11, 27, 9, tzinfo=UTC)
    gpu = DeviceRecord("r1-t4-1", "gpu", "NVIDIA T4", frozenset({"rack-1"}), "rack-1")
    whole = Holding(gpu, now, "m1", now, "ada", "", "running", "host-01")
    rows = {r["machine"]: r for r in views.running([whole, _split_t4(now)])}
    assert (rows["m1"]["gpus"], rows["m1"]["shares"]) == (1, [])
    assert rows["m3"]["gpus"] == 0.25
    assert rows["m3"]["shares"] == ["¼ of NVIDIA T4"]
    assert (rows["m3"]["user"], rows["m3"]["cohort"], rows["m3"]["models"]) == (
        "ada",
        "cs-101",
        ["NVIDIA T4"],
    )
    assert len(rows) == 5


def test_usage_rows_show_a_quarters_fractional_gpu_hours() -> None:
    quarter_hour = DayUse(date(2026, 3, 2), "ada", "t4", 3600 * 0.25)  # an hour of a quarter
    assert usage_views.usage_rows([quarter_hour, quarter_hour]) == [
        {
            "day": "2026-03-02",
            "user": "ada",
            "model": "t4",
            "gpu_hours": 0.5,
            "used_gpu_hours": 0.0,
            "given_back_gpu_hours": 0.0,
        }
    ]


def test_my_machine_counts_a_quarter_as_a_quarter_of_a_gpu() -> None:
    at = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)
    devices = {
        f"gpu-{n}": DeviceRecord(f"gpu-{n}", "gpu", "NVIDIA T4", frozenset(), "c1") for n in (1, 2)
    }
    whole = Machine("m1", "u", "", "running", "h", "r", {}, None, at, at, None, ("gpu-1",))
    quarter = replace(
        whole, id="m2", server_name="q", block_ids=("gpu-2",), shared=("gpu-2",), gpu_share=4
    )
    quota = effective_quota([QuotaRule("site", gpus_held=2)], "u", ())
    view = my_machine("u", [], quota, [whole, quarter], devices, 0.0)
    assert (view["use"]["gpus_held"], view["use"]["gpus_held_text"]) == (1.25, "1.25 of 2 GPUs")
    assert [s["gpu_share"] for s in view["servers"]] == [1, 4]
    alone = my_machine("u", [], effective_quota([], "u", ()), [quarter], devices, 0.0)
    assert alone["use"]["gpus_held_text"] == "0.25 GPUs"
