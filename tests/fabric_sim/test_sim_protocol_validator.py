"""DMTF's Redfish Protocol Validator, run against the simulator over https.

No failures beyond :data:`OUTSIDE_THE_SUBSET`: assertions about parts of
Redfish that FABRIC.md's subset leaves out, each with its reason. The
validator also reports some assertions NOT_TESTED, for the same reason:
SSDP discovery, Server-Sent Events and event subscriptions, and everything
it tests by creating accounts (ETag write semantics, password-change rules,
privileges), which needs an AccountService.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.tls import TLSFiles

from .harness import PASSWORD, USERNAME, SimulatorProcess
from .test_sim_validator import offline_environment

VALIDATOR = Path(sys.executable).parent / "rf_protocol_validator"

# Assertion → why the simulator fails it on purpose.
OUTSIDE_THE_SUBSET = {
    "SEC_PRIV_SUPPORT_PREDEFINED_ROLES": (
        "the Administrator, Operator and ReadOnly roles live in an AccountService; the "
        "simulator has none (one account, given on its command line), as FABRIC.md's "
        "subset needs no account management"
    ),
}


def report_rows(report_dir: Path) -> list[dict[str, str]]:
    (report,) = report_dir.glob("RedfishProtocolValidationReport_*.tsv")
    with report.open(newline="") as rows:
        return list(csv.DictReader(rows, delimiter="\t"))


MODES = ("expandable", "specific", "action")


@dataclass(frozen=True)
class Validation:
    output: str
    reports: Path


@pytest.fixture(scope="module")
def validations(
    tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles
) -> Iterator[dict[str, Validation]]:
    """The validator run against a simulator of each composition mode, all at once: each
    run spends its 20 s waiting on the service's answers (0.4 s of CPU), not computing."""
    tmp = tmp_path_factory.mktemp("protocol")
    simulators = {
        mode: SimulatorProcess(("--composition", mode), tmp / f"{mode}.log", tls=tls_files)
        for mode in MODES
    }
    try:
        runs = {}
        for mode, simulator in simulators.items():
            simulator.start()
            (tmp / mode).mkdir()
            runs[mode] = subprocess.Popen(
                [str(VALIDATOR), "-r", simulator.url, "-u", USERNAME, "-p", PASSWORD,
                 "--ca-bundle", str(tls_files.ca_bundle),
                 "--report-dir", str(tmp / mode / "reports"), "--report-type", "tsv",
                 # The simulator serves https only: there is no http port to redirect from.
                 "--avoid-http-redirect"],
                cwd=tmp / mode,  # it reads an optional config.ini from here
                env=offline_environment(tls_files),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        done = {}
        for mode, run in runs.items():
            try:
                output, _ = run.communicate(timeout=540)
            finally:
                run.kill()
            done[mode] = Validation(output, tmp / mode / "reports")
        yield done
    finally:
        for simulator in simulators.values():
            simulator.stop()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_protocol_validator_finds_nothing_inside_the_subset(
    validations: dict[str, Validation], mode: str
) -> None:
    output, reports = validations[mode].output, validations[mode].reports
    assert reports.is_dir(), output[-5000:]
    rows = report_rows(reports)
    failed = {row["Assertion"]: row["Message"] for row in rows if row["Result"] == "FAIL"}
    counts = Counter(row["Result"] for row in rows)
    summary = json.loads((reports / "results.json").read_text())["TestResults"]
    print(f"protocol validator: {dict(counts)}")
    assert failed.keys() == OUTSIDE_THE_SUBSET.keys(), failed
    assert counts["PASS"] == summary["Protocol Validations"]["pass"]
    assert counts["PASS"] > 180  # it did reach the service, over https
