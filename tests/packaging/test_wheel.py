"""The wheel alone runs the demo: build it, install it in a clean venv, look inside.

No source checkout is on the installed side's path (no PYTHONPATH, a working
directory outside the repository), so everything it finds came from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import ROOT

# Run by the venv's Python: resolves what a hub resolves, and reads the packaged config.
CHECKS = """
import json, sys
from importlib.metadata import entry_points
from pathlib import Path

from jupyterhub.app import JupyterHub
from traitlets.config.loader import PyFileConfigLoader

from composespawner.commands import embedded
from composespawner.spawners.spawner import ComposeSpawner

(compose,) = entry_points(group="jupyterhub.spawners", name="compose")
assert compose.load() is ComposeSpawner, compose
from composespawner.spawners.kube import ComposeKubeSpawner

(on_pods,) = entry_points(group="jupyterhub.spawners", name="compose-kubernetes")
assert on_pods.load() is ComposeKubeSpawner, on_pods
hub = JupyterHub()
hub.spawner_class = "compose"
assert hub.spawner_class is ComposeSpawner, hub.spawner_class

import importlib, pkgutil
import composespawner, fabricsim

# Every module of both packages imports (a subpackage left out of the wheel would not).
modules = sorted(
    m.name
    for package in (composespawner, fabricsim)
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not m.name.endswith("__main__")
)
for name in modules:
    importlib.import_module(name)

config_dir = embedded.config_dir()
config = PyFileConfigLoader(embedded.CONFIG_FILE, str(config_dir)).load_config()
print("FOUND", json.dumps({
    "site": str(Path(embedded.__file__).parents[1]),  # the package, above commands/
    "config_dir": str(config_dir),
    "config_files": sorted(p.name for p in config_dir.iterdir() if p.is_file()),
    "templates": str(embedded.hub_templates_dir()),
    "template_files": sorted(p.name for p in embedded.hub_templates_dir().iterdir()),
    "template_paths": list(config.JupyterHub.template_paths),
    "proxy": list(config.ConfigurableHTTPProxy.command),
    "catalog": config.ComposeMixin.catalog_file,
    "modules": modules,
}))
"""


def source_copy(into: Path) -> Path:
    """The files git would commit, copied: building writes build/ and *.egg-info beside them."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def run(command: list[str], cwd: Path, timeout: float) -> str:
    # No PYTHONPATH: the installed side must not import the checkout.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = source_copy(work / "source")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*pip, "wheel", "--no-deps", "-w", str(work / "dist"), str(source)], work, 300)
    (wheel,) = (work / "dist").glob("composespawner-*.whl")
    run([sys.executable, "-m", "venv", str(work / "venv")], work, 120)
    python = work / "venv" / "bin" / "python"
    constraints = str(ROOT / "constraints.txt")
    run([str(python), "-m", "pip", "install", "-q", "-c", constraints, str(wheel)], work, 600)
    return work / "venv"


@pytest.mark.timeout(900)
def test_the_installed_wheel_resolves_the_spawner_and_ships_the_demo(venv: Path) -> None:
    output = run([str(venv / "bin" / "python"), "-c", CHECKS], venv, 120)
    # The config prints the demo's greeting; the checks' answer is the last line.
    found = json.loads(output.splitlines()[-1].removeprefix("FOUND "))
    site = Path(found["site"])
    assert site.is_relative_to(venv), found  # imported from the venv, not the checkout
    assert Path(found["config_dir"]) == site / "hub_config"
    assert {"jupyterhub_config.py", "catalog.toml", "fabric_inventory.toml"} <= set(
        found["config_files"]
    )
    assert Path(found["templates"]) == site / "templates" / "hub"
    assert {"spawn.html", "spawn_pending.html"} <= set(found["template_files"])
    assert found["template_paths"] == [found["templates"]]
    assert Path(found["catalog"]) == site / "hub_config" / "catalog.toml"
    # No node_modules beside an installed package: the proxy comes from PATH.
    assert found["proxy"] == ["configurable-http-proxy"]
    assert found["modules"] == checkout_modules()


def checkout_modules() -> list[str]:
    """The modules of the checkout's packages, named as an installed wheel's must be."""
    names = []
    for package in ("composespawner", "fabricsim"):
        for path in (ROOT / package).rglob("*.py"):
            folder = path.parent
            if path.stem == "__main__" or not (folder / "__init__.py").is_file():
                continue  # the migrations: read by Alembic, not imported
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if path.stem == "__init__" else parts))
    return sorted(n for n in names if n not in ("composespawner", "fabricsim"))


@pytest.mark.timeout(900)
def test_the_installed_console_script_runs(venv: Path) -> None:
    usage = run([str(venv / "bin" / "composespawner"), "--help"], venv, 60)
    assert "demo" in usage
    assert "fabric-simulator" in usage
