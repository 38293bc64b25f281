"""DMTF's Redfish Service Validator, run against the simulator over https: no failures allowed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.tls import TLSFiles

from .harness import (
    BLOCKS,
    PASSWORD,
    SYSTEMS,
    USERNAME,
    RedfishClient,
    StartSimulator,
    poll_monitor,
    shared_dir,
)

VALIDATOR = Path(sys.executable).parent / "rf_service_validator"
# The summary table's values row: | PASS | WARN | FAIL | NOT TESTED |
SUMMARY_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*$", re.M)
TAG = {"Hub": "validator-hub", "Machine": "m-1", "Owner": "erin/default"}
SHARED = {"Hub": "validator-hub", "Machines": [{"Machine": "m-2", "Owner": "erin/b"},
                                               {"Machine": "m-3", "Owner": "finn/"}]}  # fmt: skip
DEVICES = ("r1-a100-1", "r1-nic100-1", "r1-nvme-1")


def summary_counts(output: str) -> dict[str, int]:
    match = SUMMARY_ROW.search(output)
    assert match, f"no summary table in the validator's output:\n{output[-3000:]}"
    return dict(zip(("pass", "warn", "fail", "not_tested"), map(int, match.groups()), strict=True))


def offline_environment(tls: TLSFiles) -> dict[str, str]:
    """Keep a validator off the internet, where it would fetch DMTF's newest bundle.

    Requests to dmtf.org go to a closed local port and fail at once; the
    simulator on 127.0.0.1 is reached directly. ``requests`` trusts the
    tests' CA (REQUESTS_CA_BUNDLE), for the requests a validator makes
    without its own CA option.
    """
    dead_proxy = "http://127.0.0.1:9"
    return {
        **os.environ,
        "HTTP_PROXY": dead_proxy,
        "HTTPS_PROXY": dead_proxy,
        "NO_PROXY": "127.0.0.1,localhost",
        "REQUESTS_CA_BUNDLE": str(tls.ca_bundle),
    }


def compose_expandable(client: RedfishClient) -> None:
    """Attachments of each kind and a tag on host-01."""
    for block_id in DEVICES:
        monitor = client.attach("host-01", block_id).headers["Location"]
        assert poll_monitor(client, monitor).status == 204
    tagged = client.patch(f"{SYSTEMS}/host-01", {"Oem": {"ComposeSpawner": TAG}},
                          headers={"If-Match": "*"})  # fmt: skip
    assert tagged.status == 200
    share(client, f"{SYSTEMS}/host-02")


def share(client: RedfishClient, system: str) -> None:
    """A T4 added by PATCH of the system's whole block list, with the shared (v1_1_0) mark."""
    blocks = client.get(system).json["Links"]["ResourceBlocks"]
    blocks = [*blocks, {"@odata.id": f"{BLOCKS}/r1-t4-1"}]
    body = {"Links": {"ResourceBlocks": blocks}, "Oem": {"ComposeSpawner": SHARED}}
    accepted = client.patch(system, body, headers={"If-Match": "*"})
    assert accepted.status == 202  # blocks are attached by a task under --async-tasks
    assert poll_monitor(client, accepted.headers["Location"]).status == 200


def compose_request() -> dict[str, Any]:
    blocks = [{"@odata.id": f"{BLOCKS}/{b}"} for b in ("host-01-block", *DEVICES)]
    return {"Name": "validated", "Links": {"ResourceBlocks": blocks},
            "Oem": {"ComposeSpawner": TAG}}  # fmt: skip


def compose_specific(client: RedfishClient) -> None:
    """A composed system by POST to Systems."""
    monitor = client.post(SYSTEMS, compose_request()).headers["Location"]
    done = poll_monitor(client, monitor)
    assert done.status == 201
    share(client, done.headers["Location"])


def compose_by_action(client: RedfishClient) -> None:
    """A composed system by a Compose manifest."""
    stanza = {"StanzaType": "ComposeSystem", "StanzaId": "1", "Request": compose_request()}
    body = {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": [stanza]}}
    target = "/redfish/v1/CompositionService/Actions/CompositionService.Compose"
    monitor = client.post(target, body).headers["Location"]
    done = poll_monitor(client, monitor)
    assert done.status == 200
    share(client, done.json["Manifest"]["Stanzas"][0]["Response"]["@odata.id"])


COMPOSE_IN_MODE: dict[str, Callable[[RedfishClient], None]] = {
    "expandable": compose_expandable,
    "specific": compose_specific,
    "action": compose_by_action,
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", list(COMPOSE_IN_MODE))
def test_service_validator_reports_no_failures(
    start_simulator: StartSimulator, tls_files: TLSFiles, tmp_path: Path, mode: str
) -> None:
    simulator = start_simulator(
        "--faults-api", "--async-tasks", "--task-duration", "0.05", "--composition", mode,
        tls=tls_files,
    )  # fmt: skip
    # Something of everything: attachments of each kind, a tag, finished tasks.
    COMPOSE_IN_MODE[mode](simulator.client)
    # A copy: the validator saves schemas the service references (our OEM schema) there.
    schemas = tmp_path / "csdl"
    shutil.copytree(shared_dir() / "redfish" / "csdl", schemas)

    result = subprocess.run(
        [str(VALIDATOR), "-r", simulator.url,
         "-u", USERNAME, "-p", PASSWORD, "--authtype", "Session",
         "--schema_directory", str(schemas), "--logdir", str(tmp_path / "logs")],
        cwd=tmp_path,
        env=offline_environment(tls_files),
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
