"""Placement: one zone per machine, models and counts as asked, co-located only for owners."""

from composespawner.fabric.base import CompositionTag, Device, Host, Inventory
from composespawner.placement import (
    DeviceAsk,
    NoFit,
    Plan,
    availability,
    place,
    pool_for,
    visible_models,
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


def everyone(inventory: Inventory, held: frozenset[str] = frozenset()) -> object:
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
            host("h3", "r1", tag=CompositionTag("hub", "m", "u/")),
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
    assert [h.system_id for h in pool.hosts] == ["h1"]
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


def test_availability_counts_what_one_machine_could_get() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1"), host("h2", "r2")),
        devices=(*(gpu(f"a{i}", T4, "r1") for i in range(3)), gpu("b", T4, "r2")),
        zones=("r1", "r2"),
    )
    pool = pool_for(inventory, held={"a0"}, owners={}, groups=())
    result = availability(pool, frozenset({T4}), per_machine_cap=4)
    assert (result.free, result.most_per_machine) == (3, 2)
    assert availability(pool, frozenset({T4}), per_machine_cap=1).most_per_machine == 1
