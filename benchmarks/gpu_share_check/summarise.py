"""Judge the four holders' reports (see run.sh) and the agent's GPU list; print the verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from composespawner.hostagent.decisions import parse_gpu_list, resolve_gpus
from composespawner.launchers.agent_protocol import Refused


def finds(gpu: str, listed: list[str]) -> bool:
    """Whether the agent takes ``gpu`` as one of the host's (``listed``)."""
    try:
        return resolve_gpus([gpu], listed) != ()
    except Refused:
        return False


def main(uuid: str, out: Path) -> int:
    holders = [json.loads((out / f"holder{i}.json").read_text()) for i in range(1, 5)]
    listed = parse_gpu_list((out / "nvidia_smi_uuids.txt").read_text())
    apps = [line for line in (out / "compute_apps.txt").read_text().splitlines() if uuid in line]
    overlap = min(h["ended"] for h in holders) - max(h["began"] for h in holders)
    verdict = {
        "uuid": uuid,
        "same_gpu": {h["uuid"] for h in holders} == {uuid},
        "each_sees_one_gpu": all(h["devices"] == 1 for h in holders),
        "all_allocated_and_ran": all(h["alloc_ok"] and h["run_ok"] for h in holders),
        "ran_together_s": round(overlap, 3),
        "compute_apps_on_gpu": len(apps),
        "agent_finds_uuid": finds(uuid, listed),
        "agent_finds_uuid_without_prefix": finds(uuid.removeprefix("GPU-"), listed),
        "holders": holders,
    }
    (out / "gpu_share_check.json").write_text(json.dumps(verdict, indent=2))
    print(json.dumps({k: v for k, v in verdict.items() if k != "holders"}, indent=2))
    good = verdict["same_gpu"] and verdict["all_allocated_and_ran"] and overlap > 0
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
