"""Placement on shared hosts: many machines per host, packed, never over a host's room."""

from hypothesis import given, settings
from hypothesis import strategies as st

from composespawner.domain.hardware import (
    CompositionTag,
    Device,
    Host,
    HostMark,
    Inventory,
    Share,
)
from composespawner.domain.offers import sizes_free
from composespawner.domain.placement import (
    DeviceAsk,
    NoFit,
    Plan,
    place,
    place_more,
    pool_for,
)
from composespawner.domain.rooms import HostUse, Room

T4 = "NVIDIA T4"
HUB = "hub-1"
SMALL = Share(2, 8)
LARGE = Share(16, 128)


def gpu(block: str, zone: str = "r1", uuid: str | None = "") -> Device:
    named = f"uuid-{block}" if uuid == "" else uuid
    return Device(block, "gpu", T4, frozenset({zone}), f"{zone}-drawer", "free", uuid=named)


def host(system: str, zone: str = "r1", *, machines: int = 0, cores: int = 64) -> Host:
    mark = (
        HostMark(HUB, tuple(CompositionTag(HUB, f"m{i}", "u/") for i in range(machines)))
        if machines
        else None
    )
    return Host(system, f"{system}-block", frozenset({zone}), cores, 512, "enabled", mark=mark)


def ask(count: int, share: Share | None = SMALL) -> DeviceAsk:
    return DeviceAsk(frozenset({T4}) if count else frozenset(), count, T4, share=share)


def test_a_composed_host_with_room_wins_over_a_fresh_one() -> None:
    inventory = Inventory(
        hosts=(host("h1"), host("h2", machines=1)), devices=(gpu("g1"),), zones=("r1",)
    )
    use = {"h2": HostUse(cores=8, memory_gib=64, slots=1, machines=1)}
    plan = place(pool_for(inventory, held=(), owners={}, groups=(), hub=HUB, use=use), ask(1))
    assert isinstance(plan, Plan)
    assert (plan.host.system_id, plan.fresh, plan.share) == ("h2", False, SMALL)


def test_the_tightest_composed_host_wins() -> None:
    inventory = Inventory(
        hosts=(host("h1", machines=1), host("h2", machines=1), host("h3", machines=1)),
        zones=("r1",),
    )
    use = {
        "h1": HostUse(8, 64, 0, 1),
        "h2": HostUse(60, 480, 0, 1),  # tightest that still takes 2 cores / 8 GiB
        "h3": HostUse(63, 510, 0, 1),  # too full for 8 GiB
    }
    plan = place(pool_for(inventory, held=(), owners={}, groups=(), hub=HUB, use=use), ask(0))
    assert isinstance(plan, Plan)
    assert plan.host.system_id == "h2"
    assert plan.gpus == ()


def test_a_gpu_without_a_uuid_goes_only_to_a_machine_with_a_host_of_its_own() -> None:
    """A shared host's notebook is limited to its GPUs by UUID: none, no limit."""
    inventory = Inventory(hosts=(host("h1"),), devices=(gpu("g1", uuid=None),), zones=("r1",))
    pool = pool_for(inventory, held=(), owners={}, groups=(), hub=HUB)
    assert isinstance(place(pool, ask(1)), NoFit)
    whole = place(pool, ask(1, None))
    assert isinstance(whole, Plan)
    assert [g.block_id for g in whole.gpus] == ["g1"]


def test_another_hubs_or_clients_host_is_never_shared() -> None:
    theirs = Host(
        "h1",
        "h1-block",
        frozenset({"r1"}),
        64,
        512,
        "enabled",
        mark=HostMark("other-hub", (CompositionTag("other-hub", "m", "u/"),)),
    )
    unmarked_busy = Host("h2", "h2-block", frozenset({"r1"}), 64, 512, "enabled", attached=("x",))
    inventory = Inventory(hosts=(theirs, unmarked_busy), zones=("r1",))
    result = place(pool_for(inventory, held=(), owners={}, groups=(), hub=HUB), ask(0))
    assert isinstance(result, NoFit)


def test_a_whole_host_takes_a_fresh_host_only() -> None:
    inventory = Inventory(
        hosts=(host("h1", machines=1), host("h2")), devices=(gpu("g1"),), zones=("r1",)
    )
    use = {"h1": HostUse(2, 8, 0, 1)}
    plan = place(pool_for(inventory, held=(), owners={}, groups=(), hub=HUB, use=use), ask(1, None))
    assert isinstance(plan, Plan)
    assert (plan.host.system_id, plan.share) == ("h2", None)


def test_slots_bound_the_devices_on_a_host() -> None:
    full = Host(
        "h1",
        "h1-block",
        frozenset({"r1"}),
        64,
        512,
        "enabled",
        mark=HostMark(HUB, (CompositionTag(HUB, "m0", "u/"),)),
        max_devices=2,
    )
    inventory = Inventory(hosts=(full,), devices=(gpu("g1"), gpu("g2"), gpu("g3")), zones=("r1",))
    use = {"h1": HostUse(2, 8, 1, 1)}
    pool = pool_for(inventory, held=(), owners={}, groups=(), hub=HUB, use=use)
    assert isinstance(place(pool, ask(1)), Plan)
    refused = place(pool, ask(2))
    assert isinstance(refused, NoFit)
    assert "room" in refused.reason
    grow = place_more(pool, "r1", ask(2), slots=1)
    assert isinstance(grow, NoFit)
    assert "room for 1 more device only" in grow.reason


def test_a_size_bigger_than_any_host_says_so() -> None:
    inventory = Inventory(hosts=(host("h1", cores=8),), zones=("r1",))
    result = place(
        pool_for(inventory, held=(), owners={}, groups=(), hub=HUB),
        DeviceAsk(frozenset(), 0, "", share=LARGE, size_label="16 cores, 128 GiB"),
    )
    assert isinstance(result, NoFit)
    assert "more than any host here has" in result.reason
    assert "8 cores" in result.reason


def test_sizes_free_counts_what_fits_on_every_host() -> None:
    inventory = Inventory(hosts=(host("h1", machines=1), host("h2")), zones=("r1",))
    use = {"h1": HostUse(60, 8, 0, 1)}  # 4 cores left there
    pool = pool_for(inventory, held=(), owners={}, groups=(), hub=HUB, use=use)
    assert sizes_free(pool, {"small": SMALL, "large": LARGE, "whole": None}) == {
        "small": 2 + 32,
        "large": 4,
        "whole": 1,
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([SMALL, Share(4, 32), LARGE, None])),
        min_size=1,
        max_size=40,
    )
)
def test_placing_one_after_another_never_overfills_a_host(
    asks: list[tuple[int, Share | None]],
) -> None:
    """Apply every plan to the use it was placed on: no host ever holds more than it has."""
    hosts = tuple(
        Host(f"h{i}", f"h{i}-block", frozenset({"r1"}), 32, 256, "enabled", max_devices=4)
        for i in range(3)
    )
    gpus = tuple(gpu(f"g{i}") for i in range(8))
    use: dict[str, HostUse] = {}
    taken: set[str] = set()
    marks: dict[str, HostMark] = {}
    for count, share in asks:
        inventory = Inventory(
            hosts=tuple(
                Host(
                    h.system_id,
                    h.block_id,
                    h.zones,
                    32,
                    256,
                    "enabled",
                    mark=marks.get(h.system_id),
                    max_devices=4,
                )
                for h in hosts
            ),
            devices=gpus,
            zones=("r1",),
        )
        pool = pool_for(inventory, held=taken, owners={}, groups=(), hub=HUB, use=use)
        plan = place(pool, ask(count, share))
        if isinstance(plan, NoFit):
            continue
        system = plan.host.system_id
        before = use.get(system, HostUse(0, 0, 0, 0))
        cores, memory = (share.cores, share.memory_gib) if share else (32, 256)
        after = HostUse(
            before.cores + cores,
            before.memory_gib + memory,
            before.slots + len(plan.block_ids),
            before.machines + 1,
        )
        assert Room(32, 256, 4).fits(Room(after.cores, after.memory_gib, after.slots))
        assert share is not None or before.machines == 0
        assert not taken & set(plan.block_ids)
        use[system] = after
        taken |= set(plan.block_ids)
        tag = CompositionTag(HUB, f"m{len(taken)}-{after.machines}", "u/")
        marks[system] = marks[system].joined(tag) if system in marks else HostMark.of(tag)
