"""Placement: one zone per machine, models and counts as asked, co-located only for owners."""

from composespawner.domain.hardware import CompositionTag, Device, Host, HostMark, Inventory
from composespawner.domain.offers import Availability, availability, visible_models
from composespawner.domain.placement import (
    DeviceAsk,
    NoFit,
    Plan,
    Pool,
    place,
    place_more,
    pool_for,
)

T4 = "NVIDIA T4"
A100 = "NVIDIA A100 80GB PCIe"
RTX = "NVIDIA RTX 6000 Ada Generation"


def gpu(block: str, model: str, zones: str, chassis: str = "drawer", state: str = "free") -> Device:
    return Device(block, "gpu", model, frozenset(zones.split(",")), chassis, state)  # type: ignore[arg-type]


def host(system: str, zone: str, **kw: object) -> Host:
    return Host(system, f"{system}-block", frozenset({zone}), 64, 512, "enabled", **kw)  # type: ignore[arg-type]


def nic(block: str, speed: int, zone: str) -> Device:
    return Device(block, "nic", f"{speed}GbE", frozenset({zone}), "r", "free", speed_gbps=speed)


def drive(block: str, gb: int, zone: str) -> Device:
    return Device(block, "nvme", "nvme", frozenset({zone}), "r", "free", capacity_gb=gb)


def ask(models: str, count: int, **kw: int) -> DeviceAsk:
    return DeviceAsk(frozenset({models}), count, label=models, **kw)


def everyone(inventory: Inventory, held: frozenset[str] = frozenset()) -> Pool:
    return pool_for(inventory, held=held, owners={}, groups=())


def test_picks_devices_of_one_zone() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2")),
        devices=(gpu("a", T4, "r1"), gpu("b", T4, "r2"), gpu("c", T4, "r2")),
        zones=("r1", "r2"),
    )
    plan = place(pool_for(inventory, held=(), owners={}, groups=()), ask(T4, 2))
    assert isinstance(plan, Plan)
    assert (plan.zone, plan.host.system_id) == ("r2", "h2")
    assert {d.block_id for d in plan.gpus} == {"b", "c"}


def test_best_fit_keeps_the_big_pool_whole() -> None:
    small = [gpu(f"s{i}", T4, "r1") for i in range(2)]
    big = [gpu(f"b{i}", T4, "r2") for i in range(8)]
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2")), devices=(*small, *big), zones=("r1", "r2")
    )
    plan = place(pool_for(inventory, held=(), owners={}, groups=()), ask(T4, 1))
    assert isinstance(plan, Plan)
    assert plan.zone == "r1"


def test_prefers_one_chassis_for_multi_gpu() -> None:
    devices = (
        gpu("x1", T4, "r1", chassis="left"),
        gpu("y1", T4, "r1", chassis="right"),
        gpu("y2", T4, "r1", chassis="right"),
        gpu("z1", T4, "r1", chassis="third"),
        gpu("z2", T4, "r1", chassis="third"),
        gpu("z3", T4, "r1", chassis="third"),
    )
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=devices, zones=("r1",))
    plan = place(pool_for(inventory, held=(), owners={}, groups=()), ask(T4, 2))
    assert isinstance(plan, Plan)
    assert {d.chassis for d in plan.gpus} == {"right"}


def test_held_busy_and_foreign_things_are_not_offered() -> None:
    inventory = Inventory(
        hosts=(
            host("h1", "r1"),
            host("h2", "r1", attached=("someone-elses",)),
            host("h3", "r1", mark=HostMark.of(CompositionTag("hub", "m", "u/"))),
        ),
        devices=(
            gpu("a", T4, "r1"),
            gpu("b", T4, "r1", state="attached"),
            gpu("c", T4, "r1", state="unavailable"),
            gpu("d", T4, "r1"),
        ),
        zones=("r1",),
    )
    pool = pool_for(inventory, held={"d"}, owners={}, groups=())
    assert [h.host.system_id for h in pool.hosts] == ["h1"]
    assert [d.block_id for d in pool.devices] == ["a"]
    refusal = place(pool, ask(T4, 2))
    assert isinstance(refusal, NoFit)
    assert "Only 1 × NVIDIA T4" in refusal.reason
    assert "Ask for 1" in refusal.reason


def test_colocated_devices_only_for_their_owners() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"),),
        devices=(gpu("x1", RTX, "r1,r2", chassis="expansion-1"), gpu("a", T4, "r1")),
        zones=("r1", "r2"),
    )
    owners = {"x1": "vision-lab"}
    outsider = pool_for(inventory, held=(), owners=owners, groups=("cs-101",))
    owner = pool_for(inventory, held=(), owners=owners, groups=("vision-lab",))
    assert "x1" not in {d.block_id for d in outsider.devices}
    assert visible_models(inventory, owners, ["cs-101"]) == {T4}
    assert visible_models(inventory, owners, ["vision-lab"]) == {T4, RTX}
    assert isinstance(place(outsider, ask(RTX, 1)), NoFit)
    plan = place(owner, ask(RTX, 1))
    assert isinstance(plan, Plan)
    assert plan.gpus[0].block_id == "x1"


def test_no_free_host_says_so() -> None:
    inventory = Inventory(hosts=(), devices=(gpu("a", T4, "r1"),), zones=("r1",))
    refusal = place(pool_for(inventory, held=(), owners={}, groups=()), ask(T4, 1))
    assert isinstance(refusal, NoFit)
    assert "Every compute host is in use" in refusal.reason


def test_unknown_model_refused_with_advice() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=(gpu("a", T4, "r1"),), zones=("r1",))
    refusal = place(pool_for(inventory, held=(), owners={}, groups=()), ask(A100, 1))
    assert isinstance(refusal, NoFit)
    assert refusal.reason.startswith(f"No {A100} is free right now")


def test_nic_and_drives_come_from_the_same_zone() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2")),
        devices=(
            gpu("a", T4, "r1"),
            gpu("b", T4, "r2"),
            nic("n25", 25, "r1"),
            nic("n100", 100, "r2"),
            drive("d1", 1920, "r2"),
            drive("d2", 1920, "r2"),
            drive("d3", 3840, "r2"),
        ),
        zones=("r1", "r2"),
    )
    pool = pool_for(inventory, held=(), owners={}, groups=())
    plan = place(pool, ask(T4, 1, nic_speed_gbps=100, scratch_gb=3840))
    assert isinstance(plan, Plan)
    assert plan.zone == "r2"
    assert plan.nic is not None
    assert plan.nic.block_id == "n100"
    assert [d.block_id for d in plan.drives] == ["d3"]
    assert plan.block_ids == ("b", "n100", "d3")
    refusal = place(pool, ask(T4, 1, nic_speed_gbps=25, scratch_gb=1920))
    assert isinstance(refusal, NoFit)
    assert "network card" in refusal.reason


def t4_availability(pool: Pool, cap: int = 4, quota_left: int | None = None) -> Availability:
    return availability(
        pool, frozenset({T4}), label="T4", per_machine_cap=cap, quota_left=quota_left
    )


def test_availability_counts_what_one_machine_could_get() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2")),
        devices=(*(gpu(f"a{i}", T4, "r1") for i in range(3)), gpu("b", T4, "r2")),
        zones=("r1", "r2"),
    )
    pool = pool_for(inventory, held={"a0"}, owners={}, groups=())
    result = t4_availability(pool)
    assert (result.free, result.most_per_machine, result.most_to_ask) == (3, 2, 2)
    assert result.why_none == ""
    assert t4_availability(pool, cap=1).most_per_machine == 1


def test_gpus_in_a_rack_without_a_free_host_are_not_counted_free() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2", attached=("someone-elses",))),
        devices=(gpu("a", T4, "r1"), *(gpu(f"b{i}", T4, "r2") for i in range(6))),
        zones=("r1", "r2"),
    )
    result = t4_availability(everyone(inventory))
    assert (result.free, result.most_per_machine, result.most_to_ask) == (1, 1, 1)


def test_no_free_host_near_free_gpus_offers_none_and_says_why() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1", attached=("someone-elses",)),),
        devices=tuple(gpu(f"a{i}", T4, "r1") for i in range(8)),
        zones=("r1",),
    )
    result = t4_availability(everyone(inventory))
    assert (result.free, result.most_per_machine, result.most_to_ask) == (0, 0, 0)
    assert result.why_none.startswith("No free host in a rack with free T4 GPUs")


def test_no_gpu_of_the_model_free_says_so() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"),), devices=(gpu("a", T4, "r1", state="attached"),), zones=("r1",)
    )
    result = t4_availability(everyone(inventory))
    assert (result.free, result.most_to_ask) == (0, 0)
    assert result.why_none.startswith("No T4 is free right now")


def test_the_quota_left_caps_what_may_be_asked() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"),),
        devices=tuple(gpu(f"a{i}", T4, "r1") for i in range(8)),
        zones=("r1",),
    )
    pool = everyone(inventory)
    one_left = t4_availability(pool, quota_left=1)
    assert (one_left.free, one_left.most_per_machine, one_left.most_to_ask) == (8, 4, 1)
    used_up = t4_availability(pool, quota_left=0)
    assert (used_up.free, used_up.most_to_ask) == (8, 0)
    assert used_up.why_none.startswith("Your GPU quota is used up: stop one of your servers")
    assert t4_availability(pool, quota_left=None).most_to_ask == 4


def test_a_grow_takes_gpus_of_the_machines_own_zone_only() -> None:
    pool = Pool(
        hosts=(),  # a grow needs no free host: its machine has one
        devices=(gpu("a", T4, "r1"), gpu("b", T4, "r2"), gpu("c", T4, "r2"), gpu("d", A100, "r1")),
        zones=("r1", "r2"),
    )
    picked = place_more(pool, "r2", ask(T4, 2), slots=4)
    assert not isinstance(picked, NoFit)
    assert [d.block_id for d in picked] == ["b", "c"]
    short = place_more(pool, "r1", ask(T4, 2), slots=4)
    assert isinstance(short, NoFit)
    assert f"Only 1 more {T4} is free in your machine's rack (r1)" in short.reason
