"""How long one placement decision takes over fabrics of 2,000 and 20,000 devices.

A synthetic inventory (per zone: 160 GPUs of four models in 10 drawers, 20
NICs, 20 NVMe drives, a quarter of the GPUs attached or held; 16 hosts per zone
over 10 zones, or 20 per zone over 100 zones: 2,000 hosts) whose hosts are
shared: a third already carry machines of this hub, holding some of their
cores, memory and slots. A fixed mix of requests (none, 1, 2, 4 or 8 GPUs in a
share of a host or a whole one, with and without a NIC and scratch space, plus
two that cannot fit). Timed: ``place`` alone on a pool whose index is built
(what one decision costs), and ``pool_for`` + ``place`` (what the spawner does
per request, the pool built afresh). Side by side, in the same run: a naive
first fit that scans every host and device for every zone it tries. Writes
``benchmarks/results/placement_speed.json``; the gate is ``place``'s p99 at
20,000 devices, at most 1 ms.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from benchmarks.interrupt import interrupt_on_sigterm
from composespawner.domain.hardware import CompositionTag, Device, Host, HostMark, Inventory, Share
from composespawner.domain.placement import (
    DeviceAsk,
    NoFit,
    Plan,
    Pool,
    place,
    pool_for,
)
from composespawner.domain.rooms import HostUse, Room, room_for

RESULTS = Path(__file__).with_name("results")
MODELS = ("NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe", "NVIDIA L40S", "NVIDIA T4")
NIC_SPEEDS = (100, 200)
DRIVE_SIZES = (960, 1920, 3840, 7680)
ZONES = 10
HOSTS_PER_ZONE = 16
LARGE_ZONES = 100  # 20,000 devices
LARGE_HOSTS_PER_ZONE = 20  # 2,000 hosts
HUB = "hub-bench"
SHARES = (Share(2, 8), Share(4, 32), Share(8, 64), Share(16, 128))
DRAWERS_PER_ZONE = 10
GPUS_PER_DRAWER = 16
NICS_PER_ZONE = 20
DRIVES_PER_ZONE = 20
REPEATS = 5  # passes over the request mix
SEED = 2023


@dataclass(frozen=True, slots=True)
class Fabric:
    """A synthetic snapshot and the ledger's holds on it."""

    inventory: Inventory
    held: frozenset[str]
    use: dict[str, HostUse]  # room our machines hold on shared hosts

    def pool(self) -> Pool:
        return pool_for(self.inventory, held=self.held, owners={}, groups=(), hub=HUB, use=self.use)


def synthetic_fabric(
    zones: int = ZONES, seed: int = SEED, hosts_per_zone: int = HOSTS_PER_ZONE
) -> Fabric:
    """200 devices a zone; some attached on the fabric, some held in the ledger; a third of
    the hosts shared by machines of ours, a tenth composed by another client."""
    rng = random.Random(seed)
    hosts: list[Host] = []
    devices: list[Device] = []
    held: set[str] = set()
    use: dict[str, HostUse] = {}
    for z in range(zones):
        zone = f"rack-{z + 1:02d}"
        in_zone = frozenset({zone})
        for h in range(hosts_per_zone):
            system = f"{zone}-host-{h:02d}"
            roll = rng.random()
            mark = None
            attached: tuple[str, ...] = ()
            if roll < 0.1:
                attached = (f"{zone}-busy-{h}",)  # another client's composition
            elif roll < 0.43:
                machines = rng.randint(1, 6)
                mark = HostMark(
                    HUB, tuple(CompositionTag(HUB, f"{system}-m{i}", "u/") for i in range(machines))
                )
                slots = rng.randint(0, machines)
                attached = tuple(f"{system}-dev-{i}" for i in range(slots))
                use[system] = HostUse(
                    rng.randint(machines * 2, 60), rng.randint(machines * 8, 480), slots, machines
                )
            hosts.append(
                Host(system, f"{system}-block", in_zone, 64, 512, "enabled", attached, mark)
            )
        for c in range(DRAWERS_PER_ZONE):
            model = MODELS[c % len(MODELS)]
            for g in range(GPUS_PER_DRAWER):
                block = f"{zone}-drawer-{c:02d}-gpu-{g:02d}"
                roll = rng.random()
                state = "attached" if roll < 0.15 else "free"
                if 0.15 <= roll < 0.25:
                    held.add(block)
                devices.append(
                    Device(
                        block,
                        "gpu",
                        model,
                        in_zone,
                        f"{zone}-drawer-{c:02d}",
                        state,  # type: ignore[arg-type]
                        uuid=f"uuid-{block}",  # as fabrics name GPUs: shared hosts need it
                    )
                )
        for n in range(NICS_PER_ZONE):
            speed = NIC_SPEEDS[n % len(NIC_SPEEDS)]
            devices.append(
                Device(
                    f"{zone}-nic-{n:02d}",
                    "nic",
                    f"{speed}GbE",
                    in_zone,
                    zone,
                    "free",
                    speed_gbps=speed,
                )
            )
        for d in range(DRIVES_PER_ZONE):
            size = DRIVE_SIZES[d % len(DRIVE_SIZES)]
            devices.append(
                Device(
                    f"{zone}-nvme-{d:02d}",
                    "nvme",
                    "NVMe",
                    in_zone,
                    zone,
                    "free",
                    capacity_gb=size,
                )
            )
    zone_ids = tuple(f"rack-{z + 1:02d}" for z in range(zones))
    inventory = Inventory(hosts=tuple(hosts), devices=tuple(devices), zones=zone_ids)
    return Fabric(inventory, frozenset(held), use)


def request_mix() -> list[DeviceAsk]:
    """None, 1, 2, 4 and 8 GPUs of one model or either of two, with and without NIC and
    scratch, each in a share of a host (bigger for more GPUs) or, for 8, a whole host."""
    asks = []
    for count in (0, 1, 2, 4, 8):
        share = None if count == 8 else SHARES[min(count, 3) if count < 4 else 3]
        for models in ((MODELS[0],), (MODELS[3],), (MODELS[1], MODELS[2])):
            for nic in (0, 100):
                for scratch in (0, 1920, 3840):
                    asks.append(
                        DeviceAsk(
                            frozenset(models) if count else frozenset(),
                            count,
                            " or ".join(models),
                            nic_speed_gbps=nic,
                            scratch_gb=scratch,
                            share=share,
                        )
                    )
    # Two refusals, as users see them: a model nobody has, more GPUs than a zone holds.
    asks.append(DeviceAsk(frozenset({"NVIDIA B200"}), 1, "NVIDIA B200"))
    asks.append(DeviceAsk(frozenset({MODELS[0]}), 48, MODELS[0]))
    return asks


@dataclass(frozen=True, slots=True)
class FirstFit:
    """The baseline's answer: enough to check it decided the same thing was possible."""

    zone: str
    host: Host
    devices: tuple[Device, ...]


def naive_first_fit(fabric: Fabric, ask: DeviceAsk) -> FirstFit | None:
    """Baseline: zones in order, and for each one scan every host and device for usable ones."""
    inventory, held = fabric.inventory, fabric.held
    for zone in inventory.zones:
        usable = [
            d
            for d in inventory.devices
            if zone in d.zones and d.state == "free" and d.block_id not in held
        ]
        gpus = [d for d in usable if d.kind == "gpu" and d.model in ask.gpu_models]
        nics = [d for d in usable if d.kind == "nic" and d.speed_gbps == ask.nic_speed_gbps]
        drives = _first_drives([d for d in usable if d.kind == "nvme"], ask.scratch_gb)
        if len(gpus) < ask.gpu_count or (ask.nic_speed_gbps and not nics) or drives is None:
            continue
        nic = tuple(nics[:1]) if ask.nic_speed_gbps else ()
        slots = ask.gpu_count + len(nic) + len(drives)
        host = next((h for h in inventory.hosts if _room(fabric, h, zone, ask, slots)), None)
        if host is not None:
            return FirstFit(zone, host, (*gpus[: ask.gpu_count], *nic, *drives))
    return None


def _room(fabric: Fabric, host: Host, zone: str, ask: DeviceAsk, slots: int) -> bool:
    """Whether ``host`` is in ``zone``, ours to compose on, and has room for the ask."""
    if zone not in host.zones or host.state != "enabled" or host.block_id in fabric.held:
        return False
    if (host.mark is None and host.attached) or (host.mark and host.mark.hub != HUB):
        return False
    used = fabric.use.get(host.system_id, HostUse(0, 0, 0, 0))
    free = Room(host.cpus - used.cores, host.memory_gib - used.memory_gib, 16 - used.slots)
    if ask.share is None:
        return used.machines == 0 and free.slots >= slots
    return free.fits(Room(ask.share.cores, ask.share.memory_gib, slots))


def _first_drives(drives: Sequence[Device], size_gb: int) -> tuple[Device, ...] | None:
    """Drives in order until they cover the size (at most four, as placement allows)."""
    picked: list[Device] = []
    for drive in drives:
        if sum(d.capacity_gb or 0 for d in picked) >= size_gb or len(picked) == 4:
            break
        picked.append(drive)
    return tuple(picked) if sum(d.capacity_gb or 0 for d in picked) >= size_gb else None


@dataclass(frozen=True, slots=True)
class Timings:
    """Microseconds per decision, one entry per timed call."""

    place_us: list[float]
    decide_us: list[float]  # pool_for + place
    baseline_us: list[float]
    plans: list[Plan | NoFit]
    baseline_fits: list[bool]


def measure(fabric: Fabric, asks: Sequence[DeviceAsk], repeats: int = REPEATS) -> Timings:
    """Time each ask ``repeats`` times three ways, interleaved so drift hits all alike."""
    timings = Timings([], [], [], [], [])
    pool = fabric.pool()
    for ask in asks:
        place(pool, ask)  # builds the pool's index for the ask's models: not a decision's cost
    for _ in range(repeats):
        for ask in asks:
            timings.place_us.append(_timed(partial(place, pool, ask)))
            timings.decide_us.append(_timed(partial(_decide, fabric, ask)))
            timings.baseline_us.append(_timed(partial(naive_first_fit, fabric, ask)))
    for ask in asks:
        timings.plans.append(place(pool, ask))
        timings.baseline_fits.append(naive_first_fit(fabric, ask) is not None)
    return timings


def _decide(fabric: Fabric, ask: DeviceAsk) -> Plan | NoFit:
    return place(fabric.pool(), ask)


def plan_fits(fabric: Fabric, plan: Plan) -> bool:
    """Whether a plan stays within its host's room and takes only free, unheld devices."""
    open_host = next(h for h in fabric.pool().hosts if h.host.system_id == plan.host.system_id)
    need = room_for(plan.share, open_host, len(plan.block_ids))
    free = {d.block_id for d in fabric.inventory.devices if d.state == "free"} - fabric.held
    return need is not None and set(plan.block_ids) <= free


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - started) / 1000


def p99(values: Collection[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summary(fabric: Fabric, timings: Timings) -> dict[str, object]:
    fits = sum(isinstance(p, Plan) for p in timings.plans)
    return {
        "devices": len(fabric.inventory.devices),
        "hosts": len(fabric.inventory.hosts),
        "zones": len(fabric.inventory.zones),
        "free_unheld_devices": sum(
            d.state == "free" and d.block_id not in fabric.held for d in fabric.inventory.devices
        ),
        "requests": len(timings.plans),
        "decisions_timed": len(timings.decide_us),
        "plans": fits,
        "nofits": len(timings.plans) - fits,
        "baseline_plans": sum(timings.baseline_fits),
        "mean_us": statistics.fmean(timings.decide_us),
        "median_us": statistics.median(timings.decide_us),
        "p99_us": p99(timings.decide_us),
        "place_mean_us": statistics.fmean(timings.place_us),
        "place_median_us": statistics.median(timings.place_us),
        "place_p99_us": p99(timings.place_us),
        "baseline_mean_us": statistics.fmean(timings.baseline_us),
        "baseline_median_us": statistics.median(timings.baseline_us),
        "baseline_p99_us": p99(timings.baseline_us),
        "ratio": statistics.fmean(timings.decide_us) / statistics.fmean(timings.baseline_us),
        "baseline": "naive first fit: zones in order, every host and device scanned per zone",
    }


def main() -> None:
    fabric = synthetic_fabric()
    result = summary(fabric, measure(fabric, request_mix()))
    large_fabric = synthetic_fabric(LARGE_ZONES, hosts_per_zone=LARGE_HOSTS_PER_ZONE)
    large = summary(large_fabric, measure(large_fabric, request_mix()))
    result["large"] = large
    result["large_place_p99_us"] = large["place_p99_us"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "placement_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    for figures in (result, large):
        _print(figures)


def _print(result: dict[str, object]) -> None:
    print(
        f"placement over {result['devices']} devices, {result['hosts']} hosts,"
        f" {result['zones']} zones; {result['requests']} requests x {REPEATS}"
        f" ({result['plans']} fit, {result['nofits']} refused; baseline fits"
        f" {result['baseline_plans']})"
    )
    print(f"{'':34}{'mean us':>10}{'median us':>11}{'p99 us':>10}")
    for label, key in (
        ("place (pool and its index given)", "place_"),
        ("pool_for + place", ""),
        ("baseline: naive first fit", "baseline_"),
    ):
        print(
            f"{label:34}{result[key + 'mean_us']:>10.1f}{result[key + 'median_us']:>11.1f}"
            f"{result[key + 'p99_us']:>10.1f}"
        )
    print(f"{'ratio = ours/baseline (mean)':34}{result['ratio']:>10.2f}")


if __name__ == "__main__":
    interrupt_on_sigterm()
    main()
