"""What a storm measured, and its report: per user, per side, per round, over rounds.

:mod:`benchmarks.spawn_storm` runs the storms (and :mod:`benchmarks.course_storm`
its class-sized one); this holds their figures and how they are summed up.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchmarks.hubload import FabricSize, HolderCheck, percentile, ratio

OPTIONS: dict[str, Any] = {"gpu_model": "t4", "gpu_count": 1, "network": "shared", "scratch_gb": 0}


@dataclass
class UserRun:
    user: str
    options: dict[str, Any] = field(default_factory=lambda: dict(OPTIONS))  # user_options
    posted: float = 0.0  # perf_counter of the first POST
    answered: float | None = None  # when the POST was accepted (201/202)
    ready: float | None = None  # the listing that first showed it ready
    stop_sent: float | None = None
    gone: float | None = None
    throttled: int = 0  # 429 answers
    error: str | None = None

    @property
    def ready_s(self) -> float | None:
        return None if self.ready is None else self.ready - self.posted


@dataclass
class Side:
    spawner: str
    runs: list[UserRun]
    stop_all_s: float
    hub_log: dict[str, int]
    listings: list[float]  # seconds each admin listing took while waiting for the stops
    peak: HolderCheck | None = None
    after: HolderCheck | None = None
    stop_errors: list[str] = field(default_factory=list)
    ssh_traffic: dict[str, float] = field(default_factory=dict)  # compose-ssh's, from the hub

    @property
    def ready_times(self) -> list[float]:
        return sorted(r.ready_s for r in self.runs if r.ready_s is not None)

    @property
    def failures(self) -> int:
        return sum(r.error is not None for r in self.runs)

    @property
    def http_429(self) -> int:
        return sum(r.throttled for r in self.runs)

    def summary(self) -> dict[str, Any]:
        times = self.ready_times
        stops = [r.gone - r.stop_sent for r in self.runs if r.gone and r.stop_sent]
        reasons = Counter((r.error or "")[:160] for r in self.runs if r.error)
        return {
            "ready": len(times),
            "failures": self.failures,
            "http_429": self.http_429,
            "p50_s": percentile(times, 50),
            "p95_s": percentile(times, 95),
            "max_s": max(times, default=float("nan")),
            "stop_p50_s": percentile(stops, 50),
            "stop_p95_s": percentile(stops, 95),
            "stop_all_s": self.stop_all_s,
            "failure_reasons": dict(reasons.most_common(5)),
            "stop_errors": self.stop_errors[:5],
            "hub_log": self.hub_log,
            "stop_listing_p50_ms": 1000 * percentile(self.listings, 50),
            "stop_listing_p95_ms": 1000 * percentile(self.listings, 95),
            "stop_listings": len(self.listings),
            **self.ssh_traffic,
        }


# -- one storm ----------------------------------------------------------------------


def result(users: int, spawn_limit: int, size: FabricSize, rounds: list[Round]) -> dict[str, Any]:
    """Ratios are medians over rounds; failures, 429s, double holders and leaks are totals."""
    per_round = [round_.summary() for round_ in rounds]
    middle = sorted(per_round, key=lambda r: r["p95_ratio"])[len(per_round) // 2]
    return {
        "users": users,
        "spawn_limit": spawn_limit,
        "rounds": len(rounds),
        "fabric": {"zones": size.zones, "hosts": size.hosts, "gpus": size.gpus},
        "p50_ratio": statistics.median(r["p50_ratio"] for r in per_round),
        "p95_ratio": statistics.median(r["p95_ratio"] for r in per_round),
        "failures": sum(r["failures"] for r in per_round),
        "http_429": sum(r["http_429"] for r in per_round),
        "double_holders": sum(r["double_holders"] for r in per_round),
        "leaked_devices": sum(r["leaked_devices"] for r in per_round),
        "stock_failures": sum(r["stock_failures"] for r in per_round),
        "stock_http_429": sum(r["stock_http_429"] for r in per_round),
        "peak_live_machines": min(r["peak_live_machines"] for r in per_round),
        "peak_hosts_composed": max(r["peak_hosts_composed"] for r in per_round),
        "hosts_over_capacity": sum(r["hosts_over_capacity"] for r in per_round),
        **(_ssh_result(per_round) if "ssh" in per_round[0] else {}),
        "compose": middle["compose"],
        "stock": middle["stock"],
        "per_round": per_round,
    }


def _ssh_result(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """compose-ssh's figures over the rounds: ratios as medians, the rest as totals."""
    starts = sum(r["ssh"]["ready"] for r in per_round)
    return {
        "ssh_p50_ratio": statistics.median(r["ssh_p50_ratio"] for r in per_round),
        "ssh_p95_ratio": statistics.median(r["ssh_p95_ratio"] for r in per_round),
        "ssh_vs_local_p95_ratio": statistics.median(r["ssh_vs_local_p95_ratio"] for r in per_round),
        **{
            figure: sum(r[figure] for r in per_round)
            for figure in (
                "ssh_failures",
                "ssh_double_holders",
                "ssh_leaked_devices",
                "ssh_hosts_over_capacity",
            )
        },
        # The hub's SSH traffic, from its log (goal: one connection per host, reused).
        "ssh_connections_per_start": sum(r["ssh"]["ssh_connections"] for r in per_round)
        / max(starts, 1),
        "ssh_channels_per_start": sum(r["ssh"]["ssh_channels"] for r in per_round) / max(starts, 1),
    }


@dataclass
class Round:
    """One storm on each side, run back to back."""

    ours: Side
    stock: Side
    ssh: Side | None = None  # compose-ssh, where the round ran it too

    def summary(self) -> dict[str, Any]:
        mine, theirs = self.ours.summary(), self.stock.summary()
        peak = self.ours.peak or HolderCheck()
        after = self.ours.after or HolderCheck()
        leaked = set(after.ledger_held) | set(after.fabric_attached)
        doubled = set(peak.double_holders) | set(after.double_holders)
        return {
            **(self._ssh_summary(mine, theirs) if self.ssh is not None else {}),
            "p50_ratio": ratio(mine["p50_s"], theirs["p50_s"]),
            "p95_ratio": ratio(mine["p95_s"], theirs["p95_s"]),
            "failures": self.ours.failures,
            "http_429": self.ours.http_429,
            "double_holders": len(doubled),
            "leaked_devices": len(leaked),
            "stock_failures": self.stock.failures,
            "stock_http_429": self.stock.http_429,
            "peak_live_machines": peak.live_machines,
            "peak_hosts_composed": len(peak.tagged_hosts),
            "hosts_over_capacity": len(set(peak.over_capacity) | set(after.over_capacity)),
            "leaked_hosts": after.tagged_hosts,
            "leaked_device_ids": sorted(leaked)[:20],
            "double_holder_ids": sorted(doubled)[:20],
            "compose": mine,
            "stock": theirs,
        }

    def _ssh_summary(self, mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
        assert self.ssh is not None
        ssh = self.ssh.summary()
        peak = self.ssh.peak or HolderCheck()
        after = self.ssh.after or HolderCheck()
        return {
            "ssh_p50_ratio": ratio(ssh["p50_s"], theirs["p50_s"]),
            "ssh_p95_ratio": ratio(ssh["p95_s"], theirs["p95_s"]),
            "ssh_vs_local_p95_ratio": ratio(ssh["p95_s"], mine["p95_s"]),
            "ssh_failures": self.ssh.failures,
            "ssh_double_holders": len(set(peak.double_holders) | set(after.double_holders)),
            "ssh_leaked_devices": len(set(after.ledger_held) | set(after.fabric_attached)),
            "ssh_hosts_over_capacity": len(set(peak.over_capacity) | set(after.over_capacity)),
            "ssh": ssh,
        }


def print_table(r: dict[str, Any]) -> None:
    print(
        f"spawn storm: {r['users']} users at once, concurrent_spawn_limit {r['spawn_limit']},"
        f" {r['rounds']} rounds (sides alternate which goes first)"
    )
    print(f"{'':28}{'ready':>7}{'fail':>6}{'429':>6}{'p50 s':>8}{'p95 s':>8}{'stop all s':>12}")
    for n, one in enumerate(r["per_round"], 1):
        sides = [(f"{n}: composespawner", one["compose"]), (f"{n}: stock", one["stock"])]
        if "ssh" in one:
            sides.insert(1, (f"{n}: compose-ssh", one["ssh"]))
        for label, side in sides:
            print(
                f"{label:28}{side['ready']:>7}{side['failures']:>6}{side['http_429']:>6}"
                f"{side['p50_s']:>8.2f}{side['p95_s']:>8.2f}{side['stop_all_s']:>12.1f}"
            )
        print(f"{f'{n}: ratio':28}{'':19}{one['p50_ratio']:>8.2f}{one['p95_ratio']:>8.2f}")
        if "ssh" in one:
            print(
                f"{f'{n}: compose-ssh ratio':28}{'':19}"
                f"{one['ssh_p50_ratio']:>8.2f}{one['ssh_p95_ratio']:>8.2f}"
            )
    print(f"{'median ratio':28}{'':19}{r['p50_ratio']:>8.2f}{r['p95_ratio']:>8.2f}")
    if "ssh_p95_ratio" in r:
        print(
            f"{'compose-ssh median ratio':28}{'':19}"
            f"{r['ssh_p50_ratio']:>8.2f}{r['ssh_p95_ratio']:>8.2f}"
            f"  (p95 against the local launcher {r['ssh_vs_local_p95_ratio']:.2f});"
            f" failures {r['ssh_failures']}, double holders {r['ssh_double_holders']},"
            f" leaked devices {r['ssh_leaked_devices']},"
            f" hosts over capacity {r['ssh_hosts_over_capacity']},"
            f" SSH connections per start {r['ssh_connections_per_start']:.2f},"
            f" channels per start {r['ssh_channels_per_start']:.2f}"
        )
    print(
        f"failures {r['failures']}, 429s {r['http_429']}, double holders {r['double_holders']},"
        f" leaked devices {r['leaked_devices']}, hosts over capacity {r['hosts_over_capacity']},"
        f" peak hosts composed {r['peak_hosts_composed']} of {r['fabric']['hosts']}"
    )
