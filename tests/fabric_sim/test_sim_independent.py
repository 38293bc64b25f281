"""The simulator is a package of its own: it shares no code with the client it stands in for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from composespawner.commands import cli
from harness.paths import ROOT

# Imports every fabricsim module in a fresh interpreter, then lists what came along.
IMPORT_ALL = """
import json, pkgutil, sys
import fabricsim
for module in pkgutil.walk_packages(fabricsim.__path__, "fabricsim."):
    __import__(module.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_fabricsim_imports_nothing_from_composespawner() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules = json.loads(done.stdout)
    assert "fabricsim.app" in modules  # the walk did reach the modules
    assert [m for m in modules if m.split(".")[0] == "composespawner"] == []


def test_composespawner_command_still_runs_the_simulator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fabric-simulator", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: fabricsim ")
