"""The spawn storm with notebooks as pods: ``python -m benchmarks.spawn_storm --kubernetes``.

compose-kubernetes against stock KubeSpawner, 100 users at once, on one real
kube-apiserver and the tests' process kubelet (see :mod:`benchmarks.spawn_storm`).
Writes benchmarks/results/spawn_storm_kubernetes.json.
"""

from __future__ import annotations

import sys

from benchmarks import spawn_storm
from benchmarks.interrupt import interrupt_on_sigterm


def main(argv: list[str] | None = None) -> None:
    spawn_storm.main(["--kubernetes", *(argv or [])])


if __name__ == "__main__":
    interrupt_on_sigterm()
    main(sys.argv[1:])
