"""Claims and releases: all-or-nothing, quota in the same transaction, usage records."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from composespawner.domain.quotas import Quota
from composespawner.ledger import (
    DeviceRecord,
    DevicesTaken,
    IllegalTransition,
    Ledger,
    Machine,
    NotOwner,
    QuotaExceeded,
    ServerBusy,
    ServerUse,
    UnknownDevices,
)

from .support import Clock, MachineMaker


def claim(
    ledger: Ledger,
    machine_id: str,
    blocks: list[str],
    *,
    limit: int | None = None,
    groups: frozenset[str] = frozenset(),
    host_block: str | None = None,
) -> Machine:
    return ledger.claim(
        machine_id,
        host_id="host-1",
        zone="rack-1",
        block_ids=blocks,
        quota=Quota.site_default(limit),
        groups=groups,
        host_block=host_block,
    )


def test_claim_takes_every_block(ledger: Ledger, gpus: list[str], clock: Clock) -> None:
    machine_id = ledger.request_machine("alice", "", {"gpus": 2})
    machine = claim(ledger, machine_id, [gpus[1], gpus[0], "nic-01"], host_block="host-1-block")
    assert machine.state == "claimed"
    assert (machine.host_id, machine.zone) == ("host-1", "rack-1")
    assert machine.block_ids == (gpus[0], gpus[1], "host-1-block", "nic-01")
    assert ledger.held_by(machine_id) == list(machine.block_ids)
    assert {b for b, m in ledger.holders().items() if m == machine_id} == set(machine.block_ids)
    assert not set(machine.block_ids) & ledger.free_blocks()
    assert ledger.gpu_use("alice") == [ServerUse("", 2)]
    assert ledger.live_machine("alice", "") == machine
    assert machine.request == {"gpus": 2}
    assert machine.updated_at == clock.now


def test_quota_counts_every_live_server_of_the_user(ledger: Ledger, gpus: list[str]) -> None:
    claim(ledger, ledger.request_machine("alice", "thesis", {}), gpus[0:2], limit=4)
    claim(ledger, ledger.request_machine("alice", "", {}), gpus[2:3], limit=4)
    claim(ledger, ledger.request_machine("bob", "", {}), gpus[3:5], limit=4)  # not alice's
    third = ledger.request_machine("alice", "big", {})
    with pytest.raises(QuotaExceeded) as refused:
        claim(ledger, third, gpus[5:7], limit=4)
    assert refused.value.user_message == (
        "You asked for 2 GPUs but your limit is 4 GPUs at once (from the site default) and 3"
        " are in use (default server: 1, server 'thesis': 2). Stop a server or ask for fewer."
    )
    assert_unchanged_after_refusal(ledger, third, gpus[5:7])
    assert claim(ledger, third, gpus[5:6], limit=4).state == "claimed"  # within quota


def test_a_cpu_only_claim_passes_at_the_gpu_limit(ledger: Ledger, gpus: list[str]) -> None:
    claim(ledger, ledger.request_machine("alice", "a", {}), gpus[:2], limit=2)
    machine = claim(ledger, ledger.request_machine("alice", "b", {}), ["nic-01"], limit=2)
    assert machine.block_ids == ("nic-01",)


def test_taken_blocks_refuse_the_whole_claim(ledger: Ledger, gpus: list[str]) -> None:
    bobs = claim(ledger, ledger.request_machine("bob", "", {}), gpus[:1])
    alices = ledger.request_machine("alice", "", {})
    with pytest.raises(DevicesTaken) as refused:
        claim(ledger, alices, gpus[:3], host_block="host-1-block")
    assert refused.value.block_ids == (gpus[0],)
    assert ledger.holders() == {gpus[0]: bobs.id}
    assert_unchanged_after_refusal(ledger, alices, [*gpus[:3], "host-1-block"])


def test_unknown_blocks_refuse_the_whole_claim(ledger: Ledger, gpus: list[str]) -> None:
    machine_id = ledger.request_machine("alice", "", {})
    with pytest.raises(UnknownDevices) as refused:
        claim(ledger, machine_id, [gpus[0], "gpu-99"])
    assert isinstance(refused.value, DevicesTaken)  # same remedy: place again
    assert refused.value.block_ids == ("gpu-99",)
    assert_unchanged_after_refusal(ledger, machine_id, gpus[:1])


def test_colocated_devices_only_for_their_group(ledger: Ledger, colocated: list[str]) -> None:
    assert ledger.device_owners() == dict.fromkeys(colocated, "physics")
    outsider = ledger.request_machine("alice", "", {})
    with pytest.raises(NotOwner) as refused:
        claim(ledger, outsider, [colocated[0], "nic-01"], groups=frozenset({"chemistry"}))
    assert refused.value.block_ids == (colocated[0],)
    assert_unchanged_after_refusal(ledger, outsider, [colocated[0], "nic-01"])
    member = ledger.request_machine("pat", "", {})
    held = claim(ledger, member, colocated, groups=frozenset({"physics", "staff"}))
    assert held.block_ids == tuple(colocated)


def test_duplicate_blocks_are_a_caller_bug(ledger: Ledger, gpus: list[str]) -> None:
    machine_id = ledger.request_machine("alice", "", {})
    with pytest.raises(ValueError, match="twice"):
        claim(ledger, machine_id, [gpus[0], gpus[0]])
    assert ledger.holders() == {}


def test_a_machine_is_claimed_once(ledger: Ledger, gpus: list[str]) -> None:
    machine_id = ledger.request_machine("alice", "", {})
    claim(ledger, machine_id, gpus[:1])
    with pytest.raises(IllegalTransition):
        claim(ledger, machine_id, gpus[1:2])
    assert ledger.held_by(machine_id) == gpus[:1]


def test_one_live_machine_per_server(ledger: Ledger, machine_in: MachineMaker) -> None:
    first = machine_in("running", server="thesis")
    with pytest.raises(ServerBusy) as refused:
        ledger.request_machine("alice", "thesis", {})
    assert refused.value.machine_id == first
    assert refused.value.state == "running"
    assert refused.value.user_message.startswith("Your server 'thesis' is already")
    assert ledger.request_machine("alice", "other", {})  # other servers are independent
    assert ledger.request_machine("bob", "thesis", {})  # and other users
    ledger.transition(first, "stopping")
    ledger.release(first)
    second = ledger.request_machine("alice", "thesis", {})  # free again once ended
    assert ledger.live_machine("alice", "thesis") == ledger.machine(second)


def test_release_frees_devices_and_records_usage(
    ledger: Ledger, gpus: list[str], clock: Clock
) -> None:
    machine_id = ledger.request_machine("alice", "thesis", {})
    clock.advance(seconds=3)
    claimed_at = clock.now
    claim(ledger, machine_id, gpus[:2], host_block="host-2-block")
    ledger.transition(machine_id, "composed")
    clock.advance(minutes=90)
    ledger.transition(machine_id, "stopping", "culled: idle")
    clock.advance(seconds=20)
    released = ledger.release(machine_id)
    assert released.state == "released"
    assert released.block_ids == ()
    assert released.ended_at == clock.now
    assert ledger.holders() == {}
    assert ledger.gpu_use("alice") == []
    usage = ledger.usage("alice")
    assert [(u.block_id, u.kind, u.model) for u in usage] == [
        (gpus[0], "gpu", "A100-80GB"),
        (gpus[1], "gpu", "A100-80GB"),
        ("host-2-block", "host", "64 CPUs, 512 GiB"),
    ]
    for record in usage:
        assert (record.machine_id, record.user_name, record.server_name) == (
            machine_id,
            "alice",
            "thesis",
        )
        assert (record.started_at, record.ended_at) == (claimed_at, clock.now)
        assert record.seconds == 90 * 60 + 20
    assert ledger.usage("bob") == []


def test_release_is_idempotent(ledger: Ledger, machine_in: MachineMaker, gpus: list[str]) -> None:
    machine_id = machine_in("stopping", blocks=gpus[:2])
    first = ledger.release(machine_id)
    events, usage = ledger.events(machine_id), ledger.usage()
    assert ledger.release(machine_id) == first
    assert ledger.release(machine_id, to="failed") == first  # already over: stays released
    assert (ledger.events(machine_id), ledger.usage()) == (events, usage)


def test_release_needs_a_stopped_machine(
    ledger: Ledger, machine_in: MachineMaker, gpus: list[str]
) -> None:
    # Devices are still attached on the fabric until 'stopping' has decomposed them.
    machine_id = machine_in("running", blocks=gpus[:2])
    with pytest.raises(IllegalTransition):
        ledger.release(machine_id)
    with pytest.raises(ValueError, match="ends a machine"):
        ledger.release(machine_id, to="stopping")
    assert ledger.held_by(machine_id) == gpus[:2]
    assert ledger.usage() == []


def test_failing_a_stopping_machine_frees_it_too(
    ledger: Ledger, machine_in: MachineMaker, gpus: list[str]
) -> None:
    machine_id = machine_in("stopping", blocks=gpus[:1])
    failed = ledger.release(machine_id, to="failed", failure="The notebook did not start.")
    assert (failed.state, failed.failure) == ("failed", "The notebook did not start.")
    assert ledger.holders() == {}
    assert [u.block_id for u in ledger.usage()] == gpus[:1]


def test_an_unclaimed_request_fails_without_usage(ledger: Ledger) -> None:
    machine_id = ledger.request_machine("alice", "", {})
    failed = ledger.release(machine_id, to="failed", failure="Nothing fits.")
    assert failed.state == "failed"
    assert ledger.usage() == []
    assert ledger.live_machines() == []


def test_live_machines_lists_only_live_ones(ledger: Ledger, machine_in: MachineMaker) -> None:
    running = machine_in("running", user="bob")
    machine_in("released", user="bob")
    machine_in("failed", user="bob")
    claimed = machine_in("claimed", user="carol")
    assert [m.id for m in ledger.live_machines("bob")] == [running]
    assert {m.id for m in ledger.live_machines()} == {running, claimed}


def test_sync_devices_never_touches_holders(ledger: Ledger, gpus: list[str], clock: Clock) -> None:
    machine_id = claim(ledger, ledger.request_machine("alice", "", {}), gpus[:1]).id
    clock.advance(hours=1)
    old = next(d for d in ledger.devices() if d.block_id == gpus[0])
    moved = replace(old, chassis="expansion-1", owner_group="physics", zones=frozenset({"z"}))
    new = DeviceRecord("gpu-new", "gpu", "L40S", frozenset({"rack-1", "rack-2"}), "rack-2")
    ledger.sync_devices([moved, new])
    assert ledger.holders() == {gpus[0]: machine_id}
    devices = {d.block_id: d for d in ledger.devices()}
    assert devices[gpus[0]] == moved
    assert devices["gpu-new"] == new
    assert gpus[1] in devices  # absent from this inventory, but not forgotten
    assert "gpu-new" in ledger.free_blocks()


def test_records_are_detached_values(ledger: Ledger, gpus: list[str]) -> None:
    request = {"gpus": 1, "stack": {"name": "pytorch"}}
    machine_id = ledger.request_machine("alice", "", request)
    request["stack"]["name"] = "changed after the fact"  # type: ignore[index]
    machine = claim(ledger, machine_id, gpus[:1])
    assert machine.request == {"gpus": 1, "stack": {"name": "pytorch"}}
    with pytest.raises(FrozenInstanceError):
        machine.state = "running"  # type: ignore[misc]
    machine.request["gpus"] = 7
    assert ledger.machine(machine_id).request["gpus"] == 1  # type: ignore[union-attr]


def test_the_clock_must_be_timezone_aware(db_url: str) -> None:
    naive = Ledger(db_url, clock=lambda: datetime(2025, 1, 1))
    try:
        naive.upgrade()
        with pytest.raises(ValueError, match="timezone-aware"):
            naive.request_machine("alice", "", {})
        assert naive.live_machines() == []
    finally:
        naive.close()


def test_times_come_back_in_utc(ledger: Ledger, clock: Clock) -> None:
    clock.now = clock.now.astimezone(ZoneInfo("Europe/Berlin"))
    machine = ledger.machine(ledger.request_machine("alice", "", {}))
    assert machine is not None
    assert machine.created_at == clock.now
    assert machine.created_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://x/y"])
def test_unsupported_databases_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="sqlite"):
        Ledger(url)


def assert_unchanged_after_refusal(ledger: Ledger, machine_id: str, blocks: list[str]) -> None:
    """A refused claim leaves its machine requested and every block as free as before."""
    machine = ledger.machine(machine_id)
    assert machine is not None
    assert machine.state == "requested"
    assert ledger.held_by(machine_id) == []
    assert [e.to_state for e in ledger.events(machine_id)] == ["requested"]
    holders = ledger.holders()
    assert not any(holders.get(block) == machine_id for block in blocks)
