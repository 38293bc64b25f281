"""The pure state model and its helpers (no HTTP)."""

from __future__ import annotations

import json

import pytest

from fabricsim import errors
from fabricsim.composed import CompositionRequest
from fabricsim.faults import FaultSettings, FaultSwitch
from fabricsim.inventory import load_inventory
from fabricsim.sessions import SessionStore
from fabricsim.state import (
    FabricState,
    StateFileError,
    if_match_allows,
)
from fabricsim.tasks import Outcome, TaskStore
from fabricsim.wire import CompositionTag, MachineRef, SharedMark
from harness.simulator import INVENTORY

TAG = CompositionTag(hub="hub", machine="m-1", owner="carol/")
SHARED = SharedMark(hub="hub", machines=(MachineRef("m-1", "carol/"), MachineRef("m-2", "dan/x")))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state() -> FabricState:
    return FabricState(load_inventory(INVENTORY), epoch="e1")


@pytest.fixture
def inventory_state() -> FabricState:
    """The same fabric under specific composition: systems exist while composed."""
    return FabricState(load_inventory(INVENTORY), epoch="e1", composition="specific")


def test_attach_detach_and_what_they_touch(state: FabricState) -> None:
    before = (state.block_etag("r1-t4-1"), state.block_etag("host-01-block"))
    system_before = state.system_etag("host-01")
    assert state.add_resource_block("host-01", "r1-t4-1") is True
    assert state.holder("r1-t4-1") == "host-01"
    assert state.holder("host-01-block") == "host-01"
    assert state.attached("host-01") == ("r1-t4-1",)
    after = (state.block_etag("r1-t4-1"), state.block_etag("host-01-block"))
    assert all(b != a for b, a in zip(before, after, strict=True))
    assert state.system_etag("host-01") != system_before
    assert state.add_resource_block("host-01", "r1-t4-1") is False
    assert state.remove_resource_block("host-01", "r1-t4-1") is True
    assert state.remove_resource_block("host-01", "r1-t4-1") is False
    assert state.holder("host-01-block") is None


def test_etags_are_checked_after_idempotency(state: FabricState) -> None:
    current = state.block_etag("r1-t4-1")
    with pytest.raises(errors.ETagMismatch):
        state.add_resource_block("host-01", "r1-t4-1", block_etag='"e1-99"')
    with pytest.raises(errors.ETagMismatch):  # a weak ETag never guards a write
        state.add_resource_block("host-01", "r1-t4-1", block_etag=f"W/{current}")
    assert state.add_resource_block("host-01", "r1-t4-1", block_etag=current)
    # The retry carries the ETag the first attempt made stale: still fine.
    assert not state.add_resource_block("host-01", "r1-t4-1", block_etag=current)


def test_tag_needs_if_match(state: FabricState) -> None:
    with pytest.raises(errors.ETagRequired):
        state.set_tag("host-02", TAG, if_match=None)
    with pytest.raises(errors.ETagMismatch):
        state.set_tag("host-02", TAG, if_match='"other"')
    state.set_tag("host-02", TAG, if_match=f'"x", {state.system_etag("host-02")}')
    assert state.tag("host-02") == TAG
    with pytest.raises(errors.ResourceMissing):
        state.set_tag("host-42", None, if_match="*")


def test_if_match_forms() -> None:
    assert if_match_allows("*", '"a-1"')
    assert not if_match_allows('W/"a-1"', '"a-1"')  # If-Match compares strongly
    assert if_match_allows('"b-2", "a-1"', '"a-1"')
    assert not if_match_allows('"a-2"', '"a-1"')
    assert not if_match_allows("", '"a-1"')


def test_disabling_blocks(state: FabricState) -> None:
    etag = state.block_etag("r2-t4-1")
    state.set_disabled(["r2-t4-1"])
    assert not state.is_enabled("r2-t4-1")
    assert state.block_etag("r2-t4-1") != etag
    assert state.disabled() == ["r2-t4-1"]
    with pytest.raises(errors.BlockNotFound):
        state.set_disabled(["nope"])
    assert state.disabled() == ["r2-t4-1"]  # a refused switch changes nothing


def test_a_disabled_device_can_still_be_detached(state: FabricState) -> None:
    state.add_resource_block("host-05", "r2-t4-1")
    state.set_disabled(["r2-t4-1"])
    assert state.remove_resource_block("host-05", "r2-t4-1")


def test_a_patch_of_blocks_and_mark_is_one_write(state: FabricState) -> None:
    state.add_resource_block("host-01", "r1-t4-1")
    etag = state.system_etag("host-01")
    state.patch_system(
        "host-01",
        if_match=etag,
        blocks=("host-01-block", "r1-a100-1", "r1-t4-2"),
        mark=SHARED,
        writes_mark=True,
    )
    assert state.attached("host-01") == ("r1-a100-1", "r1-t4-2")
    assert (state.holder("r1-t4-1"), state.holder("r1-a100-1")) == (None, "host-01")
    assert state.tag("host-01") == SHARED
    assert write_count(state.system_etag("host-01")) == write_count(etag) + 1


def write_count(etag: str) -> int:
    """The counter in the simulator's ETags (``"<epoch>-<n>"``)."""
    return int(etag.strip('"').rsplit("-", 1)[1])


def test_a_refused_patch_leaves_blocks_and_mark_alone(state: FabricState) -> None:
    state.add_resource_block("host-02", "r1-t4-1")
    document = state.to_json()
    for blocks, refusal in (
        (("host-01-block", "r1-a100-1", "r1-t4-1"), errors.BlockInUse),
        (("r1-a100-1",), errors.OwnBlockRequired),
        (("host-01-block", "r2-t4-1"), errors.ZoneMismatch),
    ):
        with pytest.raises(refusal):
            state.patch_system("host-01", if_match="*", blocks=blocks, mark=SHARED,
                               writes_mark=True)  # fmt: skip
    assert state.to_json() == document


def test_a_composed_system_keeps_its_compute_block_first(inventory_state: FabricState) -> None:
    state = inventory_state
    request = CompositionRequest("s", ("host-01-block", "r1-t4-1", "r1-t4-2"))
    system_id = state.compose_system(request)
    state.patch_system(system_id, if_match="*", blocks=("r1-a100-1", "host-01-block", "r1-t4-2"))
    assert state.system_blocks(system_id) == ("host-01-block", "r1-t4-2", "r1-a100-1")
    assert (state.holder("r1-t4-1"), state.holder("r1-a100-1")) == (None, system_id)
    etag = state.system_etag(system_id)
    with pytest.raises(errors.ETagMismatch):
        state.decompose_system(system_id, if_match='"e1-0"')
    state.decompose_system(system_id, if_match=etag)
    assert state.holder("r1-a100-1") is None


def test_shared_marks_survive_a_restore(state: FabricState) -> None:
    state.set_tag("host-05", SHARED, if_match="*")
    state.set_tag("host-06", TAG, if_match="*")
    document = json.loads(json.dumps(state.to_json()))
    assert document["hosts"]["host-05"]["tag"] == {
        "Hub": "hub",
        "Machines": [{"Machine": "m-1", "Owner": "carol/"}, {"Machine": "m-2", "Owner": "dan/x"}],
    }
    restored = FabricState(state.inventory, epoch="fresh")
    assert restored.restore(document) == []
    assert (restored.tag("host-05"), restored.tag("host-06")) == (SHARED, TAG)


def test_persistence_round_trip(state: FabricState) -> None:
    state.add_resource_block("host-05", "r2-h100-1")
    state.add_resource_block("host-05", "x1-rtx6000-1")
    state.set_tag("host-05", TAG, if_match="*")
    document = json.loads(json.dumps(state.to_json()))
    restored = FabricState(state.inventory, epoch="fresh")
    assert restored.restore(document) == []
    assert restored.attached("host-05") == ("r2-h100-1", "x1-rtx6000-1")
    assert restored.tag("host-05") == TAG
    assert restored.system_etag("host-05") == state.system_etag("host-05")
    with pytest.raises(errors.BlockInUse):
        restored.add_resource_block("host-06", "r2-h100-1")


def test_restore_drops_what_the_inventory_no_longer_has(state: FabricState) -> None:
    document = state.to_json()
    document["hosts"]["host-01"]["attached"] = ["r1-t4-1", "gone-1"]
    document["hosts"]["host-02"]["attached"] = ["r1-t4-1"]
    document["hosts"]["host-77"] = {"attached": [], "tag": None}
    problems = state.restore(document)
    assert len(problems) == 3
    assert state.attached("host-01") == ("r1-t4-1",)
    assert state.attached("host-02") == ()


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"format": 99},
        {"format": 1, "epoch": "e", "versions": {}, "hosts": {"host-01": {"attached": "x"}}},
        {"format": 1, "epoch": "e", "versions": {"a": "1"}, "hosts": {}},
        {"format": 1, "epoch": "e", "versions": {}, "hosts": {"host-01": {"attached": [],
                                                                          "tag": {"Hub": 1}}}},
        {"format": 1, "epoch": "e", "versions": {}, "hosts": {"host-01": {"attached": [],
                                                    "tag": {"Hub": "h", "Machines": []}}}},
    ],
)  # fmt: skip
def test_restore_refuses_malformed_documents(state: FabricState, document: object) -> None:
    with pytest.raises(StateFileError):
        state.restore(document)


def test_reset(state: FabricState) -> None:
    state.add_resource_block("host-01", "r1-t4-1")
    state.set_tag("host-01", TAG, if_match="*")
    state.set_disabled(["r1-t4-2"])
    etag = state.system_etag("host-01")
    state.reset()
    assert (state.attached("host-01"), state.tag("host-01"), state.disabled()) == ((), None, [])
    assert state.system_etag("host-01") != etag


def test_fault_switch_counts_and_windows() -> None:
    clock = FakeClock()
    switch = FaultSwitch(clock=clock)
    assert not switch.drops_request()
    switch.replace(FaultSettings(unreachable_for_s=2.0, fail_after_attachments=2))
    assert switch.drops_request()
    clock.now += 2.5
    assert not switch.drops_request()
    assert [switch.attachment_fails() for _ in range(4)] == [False, False, True, True]
    switch.replace(FaultSettings(error_rate=0.5, seed=7))
    first = [switch.write_fails() for _ in range(20)]
    switch.replace(FaultSettings(error_rate=0.5, seed=7))
    assert [switch.write_fails() for _ in range(20)] == first
    assert 0 < sum(first) < 20


def test_sessions_expire_when_idle() -> None:
    clock = FakeClock()
    sessions = SessionStore(timeout_s=60, clock=clock)
    session = sessions.create("admin")
    clock.now += 59
    assert sessions.authenticate(session.token) is session
    clock.now += 59  # used a moment ago: still alive
    assert sessions.get(session.id) is session
    clock.now += 61
    assert sessions.authenticate(session.token) is None
    assert sessions.all() == []


def test_tasks_tell_when_to_poll_again() -> None:
    clock = FakeClock()
    tasks = TaskStore(clock=clock)
    task = tasks.create("AddResourceBlock r1-t4-1", duration_s=2.5)
    assert task.retry_after_s(clock.now) == 3
    assert task.retry_after_s(clock.now + 2.4) == 1
    task.finish(Outcome.refused(errors.BlockInUse("r1-t4-1")))
    assert task.state == "Exception"
    assert task.messages[0]["MessageId"] == "Composition.1.1.3.ResourceBlockInUse"
    assert tasks.get(task.id) is task
