"""The ``composespawner`` command: the fabric simulator and the demo hub."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="composespawner")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fabric-simulator", help="run the simulated Redfish fabric", add_help=False)
    commands.add_parser(
        "reconcile", help="make ledger, fabric and hub servers agree", add_help=False
    )
    commands.add_parser("demo", help="start the embedded default hub at http://127.0.0.1:8000")
    args, rest = parser.parse_known_args(argv)
    if args.command == "fabric-simulator":
        from .fabric.simulator.__main__ import main as simulator_main

        return simulator_main(rest)
    if args.command == "reconcile":
        from .reconcile import main as reconcile_main

        return reconcile_main(rest)
    return demo(rest)


def demo(extra: list[str]) -> int:
    """Exec JupyterHub with the embedded default config (hub_config/jupyterhub_config.py)."""
    config = ROOT / "hub_config" / "jupyterhub_config.py"
    state = Path(os.environ.get("COMPOSE_STATE_DIR", ROOT / ".demo"))
    state.mkdir(parents=True, exist_ok=True)
    jupyterhub = shutil.which("jupyterhub", path=str(Path(sys.executable).parent))
    if jupyterhub is None:
        print("jupyterhub is not installed next to this Python; run `make demo`.", file=sys.stderr)
        return 1
    os.chdir(state)
    os.execv(jupyterhub, [jupyterhub, "-f", str(config), *extra])
