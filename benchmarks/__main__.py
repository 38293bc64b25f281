"""Run benchmarks: ``python -m benchmarks [name ...]`` (all when none is named)."""

import importlib
import sys

BENCHMARKS = ["spawn_to_lab", "placement_speed", "trace_replay", "spawn_storm", "release_latency"]


def main(argv: list[str]) -> int:
    for name in argv or BENCHMARKS:
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
            return 2
        importlib.import_module(f"benchmarks.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
