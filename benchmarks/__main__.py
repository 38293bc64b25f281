"""Run benchmarks: ``python -m benchmarks [name ...]`` (all when none is named)."""

import importlib
import sys

from benchmarks.gates import check
from benchmarks.interrupt import interrupt_on_sigterm

BENCHMARKS = [
    "spawn_to_lab",
    "container_spawn",
    "placement_speed",
    "trace_replay",
    "spawn_storm",
    "course_storm",
    "spawn_storm_kubernetes",
    "release_latency",
    "portal_latency",
    "ledger_claims",
    "gpu_reclaim",
]


def main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in BENCHMARKS]
    if unknown:  # before running any: a storm takes minutes
        print(
            f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}"
            " (options go to one benchmark: python -m benchmarks.spawn_storm --rounds 2)"
        )
        return 2
    failed = []
    for name in argv or BENCHMARKS:
        importlib.import_module(f"benchmarks.{name}").main()
        failed += check(name)
    for line in failed:
        print(f"GATE NOT MET: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    interrupt_on_sigterm()
    sys.exit(main(sys.argv[1:]))
