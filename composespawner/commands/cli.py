"""The ``composespawner`` command: one traitlets root application with ``subcommands``.

As ``jupyterhub`` does (``jupyterhub upgrade-db``, ``jupyterhub token``), the root
names each subcommand's application and the words that describe it; the first
argument picks one, and the rest are that application's own. The hub's services
(``reconcile``, ``reclaimer``, ``portal``) and the deploy steps (``upgrade-db``,
``build-stacks``) are traitlets applications reading the hub's config file; the
others take their arguments whole: ``fabric-simulator`` is a package of its own with
its own parser, ``demo`` hands its arguments to the hub, ``with-hub`` ends at ``--``.

The hub's services are named by their import path and loaded only when chosen (as
the commands of this module load what they run), so ``composespawner --help`` loads
none of the portal, the ledger or the fabric.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Generator, Sequence
from typing import Any, NoReturn

from traitlets import Integer
from traitlets.config import Application

USAGE_ERROR = 2  # what argparse exits with, as this command always has


class WholeArgumentsCommand(Application):
    """A subcommand that is no traitlets application: its arguments are passed on whole."""

    exit_status = Integer(0, help="What the command returned: the process's exit status.")
    aliases: dict[str, Any] = {}
    flags: dict[str, Any] = {}

    def parse_command_line(self, argv: Sequence[str] | None = None) -> None:
        self.extra_args = list(argv or [])

    def start(self) -> None:
        self.exit_status = self.run(self.extra_args)

    def run(self, arguments: list[str]) -> int:
        raise NotImplementedError


class FabricSimulator(WholeArgumentsCommand):
    """``composespawner fabric-simulator``: the name configs use for ``python -m fabricsim``."""

    name = "composespawner fabric-simulator"
    description = "Run the simulated Redfish fabric."

    def run(self, arguments: list[str]) -> int:
        # The simulator is a package of its own (fabricsim), with its own parser.
        from fabricsim.__main__ import main as simulator_main

        return simulator_main(arguments)


class Demo(WholeArgumentsCommand):
    """``composespawner demo [HUB ARGS]``: the fabric simulator beside the embedded default hub."""

    name = "composespawner demo"
    description = (
        "Start the fabric simulator and the embedded default hub at http://127.0.0.1:8000."
    )

    def run(self, arguments: list[str]) -> int:
        _help_only(self.name, self.description, arguments)
        from composespawner.commands import supervise

        return supervise.demo_main(arguments)


class NotebookAccount(WholeArgumentsCommand):
    """``composespawner notebook-account``: as root, the account notebooks run as."""

    name = "composespawner notebook-account"
    description = "As root, create the account notebooks run as and let it reach this installation."

    def run(self, arguments: list[str]) -> int:
        _help_only(self.name, self.description, arguments)
        from composespawner.commands import supervise

        return supervise.notebook_account_main()


class WithHub(WholeArgumentsCommand):
    """``composespawner with-hub --hub-pid PID -- COMMAND [ARG...]``."""

    name = "composespawner with-hub"
    description = "Run a hub-managed service that ends when the hub does, even if it is killed."

    def run(self, arguments: list[str]) -> int:
        parser = argparse.ArgumentParser(prog=self.name, description=self.description)
        parser.add_argument("--hub-pid", type=int, required=True, help="the hub's process id")
        parser.add_argument("service", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
        asked, _ = parser.parse_known_args(arguments)  # as the one parser of old did
        service = asked.service[1:] if asked.service[:1] == ["--"] else asked.service
        if not service:
            parser.error("give the service's command after --")
        from composespawner.commands import supervise

        try:
            supervise.exec_with_hub(asked.hub_pid, service)
        except supervise.DemoError as e:
            print(f"{self.name}: {e}", file=sys.stderr)
            return 1


def _help_only(prog: str, description: str, arguments: list[str]) -> None:
    """Answer ``-h``/``--help`` (and exit), leaving every other argument to the command."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.parse_known_args(arguments)


class ComposeSpawnerCommand(Application):
    """The root of ``composespawner``: nothing of its own, a subcommand for each process."""

    name = "composespawner"
    description = """composespawner's processes: the demo and its fabric simulator, the hub's
    services (the GPU portal, the reconciler, the reclaimer) and the deploy steps. Each
    subcommand's --help says more: `composespawner reconcile --help`."""
    examples = """
composespawner demo
composespawner upgrade-db -f /etc/composespawner/jupyterhub_config.py
composespawner reconcile --once -f jupyterhub_config.py
"""
    aliases: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    subcommands = {
        "fabric-simulator": (
            FabricSimulator,
            "run the simulated Redfish fabric",
        ),
        "reconcile": (
            "composespawner.services.reconcile.ReconcilerApp",
            "make ledger, fabric and hub servers agree",
        ),
        "reclaimer": (
            "composespawner.commands.reclaim.ReclaimerApp",
            "give idle GPUs back while their servers run on (-f the hub's config)",
        ),
        "upgrade-db": (
            "composespawner.services.application.UpgradeDB",
            "upgrade the ledger's schema (-f the hub's config)",
        ),
        "build-stacks": (
            "composespawner.services.application.BuildStacks",
            "build the stacks' environments ahead of first use (-f the hub's config)",
        ),
        "portal": (
            "composespawner.portal.app.PortalApp",
            "the GPU portal, a hub-managed service (-f the hub's config)",
        ),
        "demo": (
            Demo,
            "start the fabric simulator and the embedded default hub at http://127.0.0.1:8000",
        ),
        "notebook-account": (
            NotebookAccount,
            "as root, create the account notebooks run as and let it reach this installation",
        ),
        "with-hub": (
            WithHub,
            "run a hub-managed service that ends when the hub does, even if it is killed",
        ),
    }

    def parse_command_line(self, argv: Sequence[str] | None = None) -> None:
        argv = sys.argv[1:] if argv is None else list(argv)
        if argv[:1] in (["-h"], ["--help"]):
            self.print_help()
            self.exit(0)
        if not argv:
            self.refuse("name a command")
        if argv[0] not in self.subcommands:
            self.refuse(f"no command {argv[0]!r}")
        self.initialize_subcommand(argv[0], argv[1:])

    def emit_help_epilogue(self, classes: bool) -> Generator[str, None, None]:
        yield from ()  # no class options of its own: each subcommand's --help has them

    def refuse(self, why: str) -> NoReturn:
        """A usage error, said as argparse says it, with the commands there are."""
        commands = ", ".join(self.subcommands)
        print(f"{self.name}: error: {why} (choose from {commands})", file=sys.stderr)
        print(f"`{self.name} --help` says what each does.", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)

    @property
    def exit_status(self) -> int:
        return int(getattr(self.subapp, "exit_status", 0))


def main(argv: list[str] | None = None) -> int:
    """The console script: the subcommand's exit status (a traitlets application's is 0)."""
    command = ComposeSpawnerCommand()
    try:
        command.initialize(argv)
        command.start()
        return command.exit_status
    finally:
        # The subcommand ran as the process's Application singleton (traitlets' loggers
        # find it there); a second main() in one process (tests) starts from none.
        if command.subapp is not None:
            type(command.subapp).clear_instance()
