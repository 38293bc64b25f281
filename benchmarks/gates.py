"""What each benchmark's figures must keep, checked against the results it just wrote.

On 2 cores a storm is CPU-bound, and composing does strictly more work than a
spawner that composes nothing (claims, the fabric's requests, the run manifest),
so the local storm's gate allows 1.2x; on Kubernetes the pods' start dominates
and composing must cost nothing measurable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")

# benchmark -> (figure, most it may be); counts of bad outcomes must be 0.
GATES: dict[str, list[tuple[str, float]]] = {
    "spawn_storm": [
        ("p95_ratio", 1.2),
        ("failures", 0),
        ("double_holders", 0),
        ("leaked_devices", 0),
        ("hosts_over_capacity", 0),
    ],
    # Notebooks in containers: no slower than the stock spawner by more than composing's
    # own work, and no slower than stock DockerSpawner running the same image.
    "container_spawn": [
        ("to_lab_vs_stock_ratio", 1.2),
        ("to_lab_vs_dockerspawner_ratio", 1.0),
        ("storm_p95_vs_stock_ratio", 1.2),
        ("storm_p95_vs_dockerspawner_ratio", 1.0),
        ("failures", 0),
    ],
    "course_storm": [
        ("p95_ratio", 1.2),
        ("failures", 0),
        ("double_holders", 0),
        ("leaked_devices", 0),
        ("hosts_over_capacity", 0),
        # compose-ssh beside it: nothing lost or left on the hosts (a missing figure,
        # from a run with --no-ssh, is not met)
        ("ssh_failures", 0),
        ("ssh_double_holders", 0),
        ("ssh_leaked_devices", 0),
        ("ssh_hosts_over_capacity", 0),
        ("ssh_connections_per_start", 1),
        # and its p95 against the stock spawner: every host a real sshd and agent on
        # these same 2 cores (issue 41's gate; not met yet, see the README)
        ("ssh_p95_ratio", 1.5),
    ],
    # A course day with idle gaps: at least half of the idle-held GPU-hours given back
    # (idle_kept_share: the other half at most), no GPU that worked (or was held, for a
    # detach) anywhere in its window taken, nothing wrong with the ledger or fabric.
    "gpu_reclaim": [
        ("idle_kept_share", 0.5),
        ("busy_taken", 0),
        ("held_detached", 0),
        ("errors", 0),
    ],
    # course_storm's share variant (its own results file): 100 quarter-T4 students,
    # every one started, T4s attached = ⌈holders/4⌉, nothing over-held, misplaced or left.
    "course_storm_shares": [
        ("share_not_started", 0),
        ("share_failures", 0),
        ("share_extra_gpus", 0),
        ("share_holders_missing", 0),
        ("share_over_held", 0),
        ("share_misplaced", 0),
        ("share_double_holders", 0),
        ("share_hosts_over_capacity", 0),
        ("share_leaked_gpus", 0),
    ],
    "placement_speed": [("large_place_p99_us", 1000)],
    "spawn_storm_kubernetes": [
        ("p95_ratio", 1.0),
        ("failures", 0),
        ("double_holders", 0),
        ("leaked_devices", 0),
    ],
    "spawn_to_lab": [("median_ratio", 1.1)],
    "release_latency": [("p95_ratio", 1.2), ("leaked_devices", 0)],
}


def unmet(name: str, result: dict[str, Any]) -> list[str]:
    """The gates of benchmark ``name`` that ``result`` does not meet, as lines to print."""
    missing = object()
    lines = []
    for figure, most in GATES.get(name, []):
        value = result.get(figure, missing)
        if value is missing or not isinstance(value, int | float) or value > most:
            shown = "missing" if value is missing else value
            lines.append(f"{name}: {figure} is {shown}, the gate is at most {most:g}")
    return lines


# benchmark -> the other results files it writes, each with gates of its own
ALSO_WRITES: dict[str, list[str]] = {"course_storm": ["course_storm_shares"]}


def check(name: str, results: Path = RESULTS) -> list[str]:
    """:func:`unmet` for the results the benchmark wrote (none to check: no gate)."""
    lines = []
    for written in [name, *ALSO_WRITES.get(name, [])]:
        path = results / f"{written}.json"
        if written in GATES and path.is_file():
            lines += unmet(written, json.loads(path.read_text()))
    return lines
