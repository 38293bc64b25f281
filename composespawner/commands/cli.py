"""The ``composespawner`` command: the demo, its simulator, the hub's services, upgrade-db,
build-stacks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="composespawner")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fabric-simulator", help="run the simulated Redfish fabric", add_help=False)
    commands.add_parser(
        "reconcile", help="make ledger, fabric and hub servers agree", add_help=False
    )
    commands.add_parser(
        "upgrade-db", help="upgrade the ledger's schema (-f the hub's config)", add_help=False
    )
    commands.add_parser(
        "build-stacks",
        help="build the stacks' environments ahead of first use (-f the hub's config)",
        add_help=False,
    )
    commands.add_parser(
        "portal", help="the GPU portal, a hub-managed service (-f the hub's config)", add_help=False
    )
    commands.add_parser(
        "demo",
        help="start the fabric simulator and the embedded default hub at http://127.0.0.1:8000",
    )
    commands.add_parser(
        "notebook-account",
        help="as root, create the account notebooks run as and let it reach this installation",
    )
    with_hub = commands.add_parser(
        "with-hub",
        help="run a hub-managed service that ends when the hub does, even if it is killed",
    )
    with_hub.add_argument("--hub-pid", type=int, required=True, help="the hub's process id")
    with_hub.add_argument("service", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args, rest = parser.parse_known_args(argv)
    if args.command == "fabric-simulator":
        # The simulator is a package of its own (fabricsim); this name stays for configs.
        from fabricsim.__main__ import main as simulator_main

        return simulator_main(rest)
    if args.command == "reconcile":
        from composespawner.services.reconcile import ReconcilerApp

        ReconcilerApp.launch_instance(rest)
        return 0
    if args.command == "portal":
        from composespawner.portal.app import PortalApp

        PortalApp.launch_instance(rest)
        return 0
    if args.command == "upgrade-db":
        from composespawner.services.application import UpgradeDB

        UpgradeDB.launch_instance(rest)
        return 0
    if args.command == "build-stacks":
        from composespawner.services.application import BuildStacks

        BuildStacks.launch_instance(rest)
        return 0
    from composespawner.commands import supervise

    if args.command == "notebook-account":
        return supervise.notebook_account_main()
    if args.command == "with-hub":
        service = args.service[1:] if args.service[:1] == ["--"] else args.service
        if not service:
            parser.error("with-hub: give the service's command after --")
        try:
            supervise.exec_with_hub(args.hub_pid, service)
        except supervise.DemoError as e:
            print(f"composespawner with-hub: {e}", file=sys.stderr)
            return 1
    return supervise.demo_main(rest)
