"""make bench says which gate a run did not meet."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gates import GATES, check, unmet

STORM = {
    "p95_ratio": 1.18,
    "failures": 0,
    "double_holders": 0,
    "leaked_devices": 0,
    "hosts_over_capacity": 0,
}
COURSE = {
    **STORM,
    "ssh_failures": 0,
    "ssh_double_holders": 0,
    "ssh_leaked_devices": 0,
    "ssh_hosts_over_capacity": 0,
    "ssh_connections_per_start": 0.05,
    "ssh_p95_ratio": 1.45,
}


def test_a_storm_within_its_gates_meets_them() -> None:
    assert unmet("spawn_storm", STORM) == []


def test_each_gate_a_result_misses_is_named() -> None:
    result = {**STORM, "p95_ratio": 1.21, "failures": 1}
    assert unmet("spawn_storm", result) == [
        "spawn_storm: p95_ratio is 1.21, the gate is at most 1.2",
        "spawn_storm: failures is 1, the gate is at most 0",
    ]
    assert unmet("spawn_storm_kubernetes", STORM) == [
        "spawn_storm_kubernetes: p95_ratio is 1.18, the gate is at most 1"
    ]
    assert unmet("spawn_to_lab", {}) == [
        "spawn_to_lab: median_ratio is missing, the gate is at most 1.1"
    ]


def test_the_written_result_is_checked(tmp_path: Path) -> None:
    (tmp_path / "spawn_to_lab.json").write_text(json.dumps({"median_ratio": 1.12}))
    assert check("spawn_to_lab", tmp_path) == [
        "spawn_to_lab: median_ratio is 1.12, the gate is at most 1.1"
    ]
    assert check("trace_replay", tmp_path) == []  # no gate


def test_placement_is_gated_at_twenty_thousand_devices(tmp_path: Path) -> None:
    assert unmet("placement_speed", {"large_place_p99_us": 1000}) == []
    assert unmet("placement_speed", {"large_place_p99_us": 1200.0}) == [
        "placement_speed: large_place_p99_us is 1200.0, the gate is at most 1000"
    ]
    assert unmet("course_storm", {**COURSE, "hosts_over_capacity": 1}) == [
        "course_storm: hosts_over_capacity is 1, the gate is at most 0"
    ]


def test_a_course_storm_holds_compose_ssh_to_its_gates_too() -> None:
    assert unmet("course_storm", COURSE) == []
    assert unmet("course_storm", {**COURSE, "ssh_leaked_devices": 2}) == [
        "course_storm: ssh_leaked_devices is 2, the gate is at most 0"
    ]
    assert unmet("course_storm", {**COURSE, "ssh_connections_per_start": 1.5}) == [
        "course_storm: ssh_connections_per_start is 1.5, the gate is at most 1"
    ]
    assert unmet("course_storm", {**COURSE, "ssh_p95_ratio": 1.93}) == [
        "course_storm: ssh_p95_ratio is 1.93, the gate is at most 1.5"
    ]
    assert "course_storm: ssh_failures is missing, the gate is at most 0" in unmet(
        "course_storm", STORM
    )


def test_course_storm_checks_its_share_variant_too(tmp_path: Path) -> None:
    shares = {figure: 0 for figure, _ in GATES["course_storm_shares"]}
    (tmp_path / "course_storm.json").write_text(json.dumps(COURSE))
    (tmp_path / "course_storm_shares.json").write_text(json.dumps(shares))
    assert check("course_storm", tmp_path) == []
    (tmp_path / "course_storm_shares.json").write_text(
        json.dumps({**shares, "share_extra_gpus": 1})
    )
    assert check("course_storm", tmp_path) == [
        "course_storm_shares: share_extra_gpus is 1, the gate is at most 0"
    ]
