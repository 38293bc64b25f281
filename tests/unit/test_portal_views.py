"""The portal's pure views: what a form or a body becomes, and what is refused."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime

import pytest

from composespawner.domain.cohorts import Cohort
from composespawner.domain.quotas import InvalidQuota, QuotaRule, effective_quota
from composespawner.domain.rooms import HostUse, Room
from composespawner.domain.usage import DayUse
from composespawner.ledger import DeviceRecord, Holding, HostRecord, Machine
from composespawner.portal import views
from composespawner.portal.machine_views import inventory, my_machine
from composespawner.portal.views import rule_from_form, rule_from_json, rule_json

MODELS = ["t4", "a100"]


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
    assert views.usage_rows([ended, other, running]) == [
        {"day": "2026-03-01", "user": "=cmd", "model": "t4", "gpu_hours": 0.01},
        {"day": "2026-03-02", "user": "alice", "model": "t4", "gpu_hours": 1.5},
    ]


def test_staff_keep_the_stored_reservation_when_they_leave_it_out() -> None:
    stored = Cohort("cs-101", reserved_model="t4", reserved_gpus=2)
    body = views.staff_change({"title": "DL", "reserved_gpus": 2}, stored)
    assert body == {"title": "DL", "reserved_model": "t4", "reserved_gpus": 2}
    assert views.staff_change({}, None) == {"reserved_model": None, "reserved_gpus": 0}


@pytest.mark.parametrize(
    "body",
    [{"reserved_gpus": 3}, {"reserved_model": "a100"}, {"reserved_model": None}],
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
        {"kind": "gpu", "model": "NVIDIA T4", "free": 0, "held": 1},
        {"kind": "host", "model": "64 cores", "free": 1, "held": 0},
    ]
