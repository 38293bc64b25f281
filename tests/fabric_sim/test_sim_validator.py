"""DMTF's Redfish Service Validator, run against the simulator: no failures allowed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import PASSWORD, SYSTEMS, USERNAME, StartSimulator, poll_monitor, shared_dir

VALIDATOR = Path(sys.executable).parent / "rf_service_validator"
# The summary table's values row: | PASS | WARN | FAIL | NOT TESTED |
SUMMARY_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*$", re.M)
TAG = {"Hub": "validator-hub", "Machine": "m-1", "Owner": "erin/default"}


def summary_counts(output: str) -> dict[str, int]:
    match = SUMMARY_ROW.search(output)
    assert match, f"no summary table in the validator's output:\n{output[-3000:]}"
    return dict(zip(("pass", "warn", "fail", "not_tested"), map(int, match.groups()), strict=True))


def offline_environment() -> dict[str, str]:
    """Keep the validator off the internet, where it would fetch DMTF's newest bundle.

    Requests to dmtf.org go to a closed local port and fail at once; the
    simulator on 127.0.0.1 is reached directly.
    """
    dead_proxy = "http://127.0.0.1:9"
    return {
        **os.environ,
        "HTTP_PROXY": dead_proxy,
        "HTTPS_PROXY": dead_proxy,
        "NO_PROXY": "127.0.0.1,localhost",
    }


@pytest.mark.timeout(600)
def test_service_validator_reports_no_failures(
    start_simulator: StartSimulator, tmp_path: Path
) -> None:
    simulator = start_simulator("--faults-api", "--async-tasks", "--task-duration", "0.05")
    client = simulator.client
    # Something of everything: attachments of each kind, a tag, finished tasks.
    for block_id in ("r1-a100-1", "r1-nic100-1", "r1-nvme-1"):
        monitor = client.attach("host-01", block_id).headers["Location"]
        assert poll_monitor(client, monitor).status == 204
    tagged = client.patch(f"{SYSTEMS}/host-01", {"Oem": {"ComposeSpawner": TAG}},
                          headers={"If-Match": "*"})  # fmt: skip
    assert tagged.status == 200
    # A copy: the validator saves schemas the service references (our OEM schema) there.
    schemas = tmp_path / "csdl"
    shutil.copytree(shared_dir() / "redfish" / "csdl", schemas)

    result = subprocess.run(
        [str(VALIDATOR), "-r", f"http://127.0.0.1:{simulator.port}",
         "-u", USERNAME, "-p", PASSWORD, "--authtype", "Session",
         "--schema_directory", str(schemas), "--logdir", str(tmp_path / "logs")],
        cwd=tmp_path,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=540,
    )  # fmt: skip

    output = result.stdout + result.stderr
    counts = summary_counts(output)
    validated = len(re.findall(r"^Validating /redfish", output, re.M))
    print(f"validator: {counts}, {validated} resources")
    assert counts["fail"] == 0, output[-5000:]
    assert result.returncode == 0, output[-5000:]
    assert validated > 50
    assert counts["pass"] > 1000
    assert (schemas / "ComposeSpawner_v1.xml").is_file()  # found through $metadata
