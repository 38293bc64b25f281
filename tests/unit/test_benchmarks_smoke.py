"""The benchmarks' core functions on tiny inputs: seconds, and invariants that must hold."""

import json
import random
import tomllib
from datetime import date, timedelta
from pathlib import Path

import pytest

from benchmarks import (
    alibaba_trace,
    course_storm,
    fgd,
    gpu_reclaim,
    hubload,
    ledger_claims,
    placement_speed,
    portal_latency,
    release_latency,
    spawn_storm,
    trace_replay,
)
from benchmarks.alibaba_trace import Node, Task
from benchmarks.gates import unmet
from benchmarks.trace_replay import Cluster, DoubleAllocation
from composespawner.domain.catalog import Catalog
from composespawner.domain.placement import Plan
from composespawner.domain.rooms import HostUse
from composespawner.domain.usage import Period
from composespawner.ledger import Ledger
from fabricsim.inventory import parse_inventory
from harness.hub import wait_for
from harness.paths import HUB_CONFIG, SHARED


def task(name: str, gpus: int, cores: int, arrival: int = 0, duration: int = 10) -> Task:
    return Task(name, cores * 1000, 1024, gpus, 1000 if gpus else 0, frozenset(), arrival, duration)


# Two 2-GPU servers of one model, one of them short of CPU. Three tasks that
# fit the rack's four GPUs only if a task may use GPUs of the server next door:
# the first task uses up node-a's CPU and strands its second GPU.
STRANDING_NODES = (Node("node-a", 4000, 65536, 2, "T4"), Node("node-b", 64000, 65536, 2, "T4"))
STRANDING_TASKS = (
    task("one", 1, 4, arrival=0, duration=100),
    task("two", 2, 4, arrival=0, duration=100),
    task("three", 1, 4, arrival=1, duration=10),
)


def test_placement_speed_times_valid_decisions() -> None:
    fabric = placement_speed.synthetic_fabric(zones=2)
    mix = placement_speed.request_mix()
    asks = mix[:-2][::7] + mix[-2:]  # every seventh that fits, and the two that cannot
    timings = placement_speed.measure(fabric, asks, repeats=1)
    result = placement_speed.summary(fabric, timings)
    assert result["devices"] == 400
    assert len(timings.decide_us) == len(asks)
    assert all(t > 0 for t in timings.decide_us + timings.place_us + timings.baseline_us)
    assert sum(isinstance(p, Plan) for p in timings.plans) >= len(asks) - 2
    for ask, plan in zip(asks, timings.plans, strict=True):
        if not isinstance(plan, Plan):
            continue
        ids = plan.block_ids
        assert len(set(ids)) == len(ids)
        assert not set(ids) & fabric.held
        assert all(fabric.inventory.device(i).state == "free" for i in ids)  # type: ignore[union-attr]
        assert len(plan.gpus) == ask.gpu_count
        assert all(plan.zone in d.zones for d in plan.devices)
        assert placement_speed.plan_fits(fabric, plan)
    assert result["p99_us"] >= result["median_us"] > 0  # type: ignore[operator]


def test_trace_files_are_the_ones_described() -> None:
    nodes, tasks = alibaba_trace.load_nodes(), alibaba_trace.load_tasks()
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    assert len(tasks) == 8152
    assert sum(t.duration is None for t in tasks) == 897  # Pending: never ran
    assert alibaba_trace.TRACE == SHARED / "data" / "alibaba-openb-2023"


def test_inflation_on_a_slice_keeps_the_books() -> None:
    nodes, tasks = trace_replay.load_nodes()[:24], trace_replay.load_tasks()[:400]
    capacity = sum(n.gpus for n in nodes)
    workload = trace_replay.inflated(
        tasks, 1.3 * capacity, lambda t: t.whole_gpus, random.Random(7)
    )
    assert sum(t.whole_gpus for t in workload) <= 1.3 * capacity
    for zones in (trace_replay.static_zones(nodes), trace_replay.composable_zones(nodes)):
        cluster = Cluster(nodes, zones)
        filled = trace_replay.fill(cluster, workload)
        free = sum(len(pool) for pool in cluster.free_gpus.values())
        assert cluster.allocated_gpus + free == capacity
        assert 0 <= filled.allocated_share <= 1
        assert 0 <= filled.failed <= filled.tasks == len(workload)
        assert min(cluster.free_cpu.values()) >= 0
        assert min(cluster.free_memory.values()) >= 0
    shared = trace_replay.sharing_best_fit(nodes, workload, random.Random(7))
    assert 0 <= shared <= 1


def test_a_device_is_never_handed_out_twice() -> None:
    cluster = Cluster(STRANDING_NODES, trace_replay.composable_zones(STRANDING_NODES))
    plan = cluster.decide(STRANDING_TASKS[0])
    assert isinstance(plan, Plan)
    cluster.allocate(STRANDING_TASKS[0], plan)
    with pytest.raises(DoubleAllocation):
        cluster.allocate(STRANDING_TASKS[0], plan)


def test_pooled_gpus_are_not_stranded_by_a_full_host() -> None:
    static = trace_replay.fill(
        Cluster(STRANDING_NODES, trace_replay.static_zones(STRANDING_NODES)), STRANDING_TASKS
    )
    composable = trace_replay.fill(
        Cluster(STRANDING_NODES, trace_replay.composable_zones(STRANDING_NODES)),
        STRANDING_TASKS,
    )
    assert (static.allocated_share, static.failed) == (0.75, 1)
    assert (composable.allocated_share, composable.failed) == (1.0, 0)


def test_replay_makes_the_stranded_task_wait_only_on_static() -> None:
    static = trace_replay.replay(
        Cluster(STRANDING_NODES, trace_replay.static_zones(STRANDING_NODES)), STRANDING_TASKS
    )
    composable = trace_replay.replay(
        Cluster(STRANDING_NODES, trace_replay.composable_zones(STRANDING_NODES)),
        STRANDING_TASKS,
    )
    assert (static.waited, static.mean_wait_of_waiting_s, static.never_started) == (1, 99, 0)
    assert 0 < static.waiting_share <= 1
    assert (composable.waited, composable.mean_wait_s) == (0, 0)


def share_task(name: str, milli: int, cores: int = 1) -> Task:
    return Task(name, cores * 1000, 1024, 1, milli, frozenset(), 0, 10)


def test_share_sizes_round_a_task_up_to_the_next_share() -> None:
    sizes = trace_replay.SHARE_SIZES
    assert [trace_replay.share_for(share_task("t", m), sizes) for m in (250, 320, 470, 810)] == [
        4, 3, 2, 1,
    ]  # fmt: skip
    assert trace_replay.share_for(task("whole", 1, 1), sizes) == 1


def test_quarters_pack_onto_one_gpu_and_it_is_freed_by_the_last_holder() -> None:
    cluster = Cluster(STRANDING_NODES, trace_replay.composable_zones(STRANDING_NODES), (2, 4))
    quarters = [cluster.try_start(share_task(f"q{i}", 250)) for i in range(5)]
    assert all(q is not None for q in quarters)
    assert cluster.allocated_gpus == 2  # four quarters on one GPU, the fifth splits another
    assert len({q.gpus[0].block_id for q in quarters[:4] if q}) == 1
    assert (cluster.asked_milli, cluster.held_milli) == (1250, 1250)
    for q in quarters:
        assert q is not None
        cluster.release(q)
    assert (cluster.allocated_gpus, cluster.split, cluster.held_milli) == (0, {}, 0)
    assert sum(len(p) for p in cluster.free_gpus.values()) == 4


def test_sized_shares_join_only_on_a_host_with_room_and_the_books_clear() -> None:
    zones = trace_replay.composable_zones(STRANDING_NODES)
    cluster = Cluster(STRANDING_NODES, zones, (4,), sized=True)
    held = [cluster.try_start(share_task(f"q{i}", 250, cores=2)) for i in range(3)]
    # Best fit puts the first quarter on the short host; the second joins it and takes
    # its last cores; the third cannot join there, so it splits a GPU on the other host.
    assert [a.node if a else None for a in held] == ["node-a", "node-a", "node-b"]
    assert cluster.allocated_gpus == 2
    assert cluster.use["node-a"] == HostUse(4000, 2048, 1, 2)
    assert cluster.use["node-b"] == HostUse(2000, 1024, 1, 1)
    for allocation in held:
        assert allocation is not None
        cluster.release(allocation)
    assert (cluster.use, cluster.split, cluster.allocated_gpus) == ({}, {}, 0)


def test_fgd_and_best_fit_keep_the_books_on_a_slice() -> None:
    nodes, tasks = trace_replay.load_nodes()[:24], trace_replay.load_tasks()[:400]
    capacity = sum(n.gpus for n in nodes) * 1000
    workload = trace_replay.inflated(
        tasks, 1.3 * capacity, lambda t: t.gpu_demand_milli, random.Random(7)
    )
    for schedule in fgd.SCHEDULERS.values():
        cluster = schedule(nodes, workload, random.Random(7))
        assert min(min(g, default=0) for g in cluster.gpus) >= 0
        assert min(cluster.cpu) >= 0
        assert min(cluster.memory) >= 0
        free = sum(sum(g) for g in cluster.gpus)
        assert cluster.asked_milli + free == capacity
        assert 0.5 < cluster.allocated_share <= 1
    run = trace_replay.inflation_run(7, nodes, tasks[:200])
    assert run.composable_shares is not None
    assert run.static_fgd is not None
    assert run.composable_shares.asked_share <= run.composable_shares.held_share <= 1


def test_fgd_puts_a_share_where_fragmentation_grows_least() -> None:
    nodes = (Node("half-used", 64000, 65536, 2, "T4"), Node("fresh", 64000, 65536, 2, "T4"))
    types = [(fgd.TaskType(1000, 1000, 1, frozenset()), 0.5),
             (fgd.TaskType(1000, 500, 1, frozenset()), 0.5)]  # fmt: skip
    half, quarter = share_task("half", 500), share_task("quarter", 250)
    cluster = fgd.fgd(nodes, [half, quarter], random.Random(1), types)
    # The quarter goes beside the half: on the fresh node it would break a whole GPU.
    assert sorted(cluster.gpus[0] + cluster.gpus[1]) in ([250, 1000, 1000, 1000],)


def test_storm_fabric_has_a_host_and_a_catalog_t4_for_every_user() -> None:
    size = hubload.fabric_for(200)
    spec = parse_inventory(tomllib.loads(hubload.inventory_toml(size)))
    t4 = Catalog.from_file(HUB_CONFIG / "catalog.toml").gpu_model("t4")
    assert t4 is not None
    gpus = [d for d in spec.devices if d.kind == "gpu"]
    assert (len(spec.zones), len(spec.hosts), len(gpus)) == (25, 250, 250)
    assert {d.model for d in gpus} <= t4.fabric_models
    for zone in spec.zones:
        hosts = [h for h in spec.hosts if zone.id in h.zones]
        assert len(hosts) == sum(zone.id in d.zones for d in gpus) == 10


def test_release_fabric_offers_what_the_release_request_asks_for() -> None:
    spec = parse_inventory(tomllib.loads(hubload.inventory_toml(release_latency.fabric(1))))
    catalog = Catalog.from_file(HUB_CONFIG / "catalog.toml")
    network = catalog.network(str(release_latency.OPTIONS["network"]))
    assert network is not None
    assert release_latency.OPTIONS["scratch_gb"] in catalog.scratch_gb
    kinds = {d.kind: d for d in spec.devices}
    assert kinds["nic"].speed_gbps == network.speed_gbps
    assert kinds["nvme"].capacity_gb == release_latency.OPTIONS["scratch_gb"]


def test_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert hubload.percentile(values, 50) == pytest.approx(50.5)
    assert hubload.percentile(values, 95) == pytest.approx(95.05)
    assert hubload.percentile([3.0], 95) == 3.0


def errors_in(log: Path) -> list[str]:
    """The log's error lines and the traceback lines after them."""
    found, inside = [], False
    for line in log.read_text(errors="replace").splitlines():
        inside = line.startswith("[E ") or (inside and not line.startswith("["))
        if inside:
            found.append(f"{log.name}: {line}")
    return found


@pytest.mark.e2e
def test_spawn_storm_on_three_users(tmp_path: Path) -> None:
    """Both hubs at toy size, two rounds (~20 s): everyone ready, nothing double-held or left."""
    logs = tmp_path / "logs"
    spawn_storm.main(
        [
            "--users",
            "3",
            "--rounds",
            "2",
            "--out",
            str(tmp_path / "storm.json"),
            "--logs",
            str(logs),
        ]
    )
    storm = json.loads((tmp_path / "storm.json").read_text())
    assert storm["rounds"] == len(storm["per_round"]) == 2
    # A spawn that failed says why in its hub's log: shown with the failure.
    errors = [line for log in sorted(logs.rglob("*.log")) for line in errors_in(log)]
    assert all(r["compose"]["ready"] == r["stock"]["ready"] == 3 for r in storm["per_round"]), (
        "\n".join(errors)
    )
    ratios = sorted(r["p95_ratio"] for r in storm["per_round"])
    assert storm["p95_ratio"] == pytest.approx(sum(ratios) / 2)  # the median of two
    assert storm["failures"] == storm["stock_failures"] == storm["http_429"] == 0
    assert storm["double_holders"] == storm["leaked_devices"] == 0
    assert storm["peak_live_machines"] == 3
    assert storm["hosts_over_capacity"] == 0
    assert storm["peak_hosts_composed"] == 1  # three one-T4 servers share one host


@pytest.mark.e2e
def test_course_storm_packs_a_small_class(tmp_path: Path) -> None:
    """One round of 5 students, 2 with a T4 (~25 s), locally and through compose-ssh: all on
    shared hosts, none over capacity."""
    out = tmp_path / "course.json"
    course_storm.main(
        ["--students", "5", "--with-gpu", "2", "--rounds", "1", "--out", str(out), "--no-shares"]
    )
    course = json.loads(out.read_text())
    assert course["failures"] == course["stock_failures"] == 0
    assert course["per_round"][0]["compose"]["ready"] == 5
    assert course["hosts_over_capacity"] == course["double_holders"] == 0
    assert course["leaked_devices"] == 0
    # Packed: the CPU-only servers join a host the GPU servers' rack composed.
    assert course["peak_hosts_composed"] <= 2
    assert course["class"] == {"students": 5, "one_t4": 2}
    # compose-ssh, beside them: every notebook started on its host by the agent, nothing
    # left, and the hub's SSH traffic counted (one connection per host, reused).
    assert course["per_round"][0]["ssh"]["ready"] == 5
    assert course["ssh_failures"] == course["ssh_leaked_devices"] == 0
    assert course["ssh_hosts_over_capacity"] == course["ssh_double_holders"] == 0
    assert 0 < course["ssh_connections_per_start"] <= 1
    assert course["ssh_channels_per_start"] >= 1


@pytest.mark.e2e
def test_course_storm_share_variant_packs_quarters(tmp_path: Path) -> None:
    """Seven students, a quarter T4 each, then stock beside it (~35 s): two T4s attached at
    the peak (one full, one with three), none over-held, none attached or split after."""
    out = tmp_path / "shares.json"
    args = ["--shares-only", "--share-students", "7", "--share-gpus-per-rack", "2"]
    course_storm.main([*args, "--shares-out", str(out)])
    shares = json.loads(out.read_text())
    one = shares["per_round"][0]
    assert one["started"] == 7
    assert one["share"] == 4
    assert one["peak_holders"] == 7
    assert one["peak_gpus_attached"] == one["peak_gpus_needed"] == 2
    assert one["peak"]["servers_told"] == 7
    assert one["after"]["gpus_attached"] == one["after"]["gpus_split"] == 0
    assert not unmet("course_storm_shares", shares)
    assert one["stock"]["ready"] == 7  # the stock spawner beside it
    assert shares["stock_failures"] == 0


@pytest.mark.e2e
def test_release_latency_times_two_stops() -> None:
    """composespawner's side only (~5 s): each stop frees the machine's four devices."""
    side = release_latency.run_side(2, stock=False, size=release_latency.fabric(1))
    assert [len(stop.devices) for stop in side.stops] == [4, 4]
    for stop in side.stops:
        assert stop.devices_free_s is not None
        assert stop.gone_s is not None
        # A stop gives the devices back before it returns (the fabric is healthy here).
        assert 0 < stop.devices_free_s <= stop.gone_s + release_latency.POLL_EVERY
    assert side.leaked_devices == []


def test_portal_latency_fills_a_ledger_the_portal_can_read(tmp_path: Path) -> None:
    scale = portal_latency.Scale(
        users=100, cohorts=5, devices=40, running=10, usage_records=1_000, user_rules=5
    )
    today = date(2026, 11, 24)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert portal_latency.fill_ledger(url, today, scale)["usage_records"] == 1_000
    ledger = Ledger(url)
    try:
        assert len(ledger.usage()) == 1_000
        assert sum(h.machine_id is not None for h in ledger.holdings()) == 10
        assert len(ledger.policy.cohorts()) == 5
        assert len(ledger.policy.quota_rules()) == 5 + 5 + 1
        recorded = sum((r.ended_at - r.started_at).total_seconds() for r in ledger.usage()) / 3600
        period = Period.parse(str(today - timedelta(days=200)), str(today), today=today)
        daily = sum(seconds for _, _, seconds in ledger.usage_sums(period).days) / 3600
        assert daily == pytest.approx(recorded)
    finally:
        ledger.close()


@pytest.mark.timeout(60)
def test_portal_latency_churn_stops_and_starts_servers_beside_the_timing(tmp_path: Path) -> None:
    scale = portal_latency.Scale(
        users=20, cohorts=2, devices=10, running=5, usage_records=50, user_rules=2
    )
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    portal_latency.fill_ledger(url, date(2026, 11, 24), scale)
    with portal_latency.churning(url, scale.running, every=0.05) as ended:
        wait_for(lambda: ended() >= 3, 30, "three servers to stop")
    ledger = Ledger(url)
    try:
        assert len(ledger.live_machines()) == scale.running  # each started again
        assert sum(h.machine_id is not None for h in ledger.holdings()) == scale.running
        assert len(ledger.usage()) == 50 + ended()
    finally:
        ledger.close()


def test_ledger_claims_two_connections_claim_without_colliding(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger_claims.stocked(url)
    row = ledger_claims.run_connections(url, 2, 0.5)
    assert row["claims_per_s"] > 0
    assert row["collisions"] == 0
    ledger = Ledger(url)
    try:
        assert ledger.live_machines() == []  # every machine claimed was released
        assert ledger.holders() == {}
    finally:
        ledger.close()


@pytest.mark.timeout(60)
def test_gpu_reclaim_gives_idle_gpus_back_and_takes_no_busy_one(tmp_path: Path) -> None:
    """Six students, three T4s, a three-hour day, on two simulators (~10 s): the reclaim
    side gives idle GPUs back, the baseline none, and no GPU is taken while it works."""
    out = tmp_path / "gpu_reclaim.json"
    small = ["--students", "6", "--minutes", "180", "--racks", "1", "--hosts-per-rack", "2"]
    gpu_reclaim.main([*small, "--t4s-per-rack", "3", "--out", str(out)])
    report = json.loads(out.read_text())
    baseline, reclaim = report["baseline"], report["reclaim"]
    assert baseline["actions"] == {}
    assert baseline["given_back_gpu_h"] == 0
    assert reclaim["given_back_gpu_h"] > 0
    assert reclaim["actions"].get("detach/done", 0) + reclaim["actions"].get("reclaim/done", 0)
    assert reclaim["idle_held_gpu_h"] < baseline["idle_held_gpu_h"]
    for side in (baseline, reclaim):
        assert side["held_gpu_h"] >= side["busy_gpu_h"] > 0
    assert report["busy_taken"] == report["held_detached"] == report["errors"] == 0
    assert 0 < report["given_back_share"] <= 1
