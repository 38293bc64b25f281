"""Command-line applications that read the hub's own config file.

The hub's services and the deploy steps (``composespawner reconcile``,
``portal``, ``upgrade-db``, ``build-stacks``) are traitlets applications,
subcommands of the ``composespawner`` root (``commands/cli.py``), as
jupyterhub-idle-culler is one: each loads the same ``jupyterhub_config.py`` the
hub does, so the ledger, the fabric and the catalog are configured in one place.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any
from zoneinfo import ZoneInfo

from traitlets import Unicode, default
from traitlets.config import Application

from composespawner.domain.catalog import Catalog, Stack
from composespawner.launchers.accounts import BUILD_ACCOUNT
from composespawner.launchers.cgroups import PIDS_PER_GIB
from composespawner.launchers.environments import (
    BUILD_TIMEOUT,
    StackBuildError,
    StackEnvironments,
    default_root,
)
from composespawner.launchers.local_files import stack_builder
from composespawner.services.settings import ComposeSettings, settings_from_config, upgrade_ledger


class ComposeApplication(Application):
    """Base of the command-line applications: ``-f`` names the hub's config file."""

    config_file = Unicode(
        "jupyterhub_config.py",
        config=True,
        help="""The hub's config file, whose ComposeSpawner (or ComposeSettings) section
        says where the ledger, the fabric and the catalog are.""",
    )
    aliases = {"f": "ComposeApplication.config_file", "config": "ComposeApplication.config_file"}

    @default("log_level")
    def _default_log_level(self) -> int:
        return logging.INFO

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        if not os.path.isfile(self.config_file):
            # traitlets would skip a missing file quietly and run on defaults.
            raise SystemExit(
                f"{self.name}: no config file {self.config_file!r}; pass the hub's with -f"
            )
        self.load_config_file(self.config_file)
        # A command-line value wins over the file, as in JupyterHub.
        self.update_config(self.cli_config)

    @property
    def settings(self) -> ComposeSettings:
        return settings_from_config(self.config, self.log)


class UpgradeDB(ComposeApplication):
    """Bring the ledger's schema up to the version this composespawner needs."""

    name = "composespawner upgrade-db"
    description = """Upgrade the ledger's database schema (as `jupyterhub upgrade-db` does the
    hub's). Run it with the hub's config before starting a new version of the hub,
    and back the database up first."""

    def start(self) -> None:
        before, after = upgrade_ledger(
            self.settings.ledger_url, ZoneInfo(self.settings.site_timezone)
        )
        if before == after:
            self.log.info("The ledger's schema is current (revision %s)", after)
        else:
            self.log.info("Upgraded the ledger's schema from %s to %s", before or "(empty)", after)


class BuildStacks(ComposeApplication):
    """Build the catalog's stack environments for the local launcher ahead of use."""

    name = "composespawner build-stacks"
    description = """Build the environments notebooks run in on the embedded default (each
    stack's CPU lock), so that no first start waits for one: `composespawner build-stacks
    -f jupyterhub_config.py [STACK ...]`. Built ones are left as they are."""

    def start(self) -> None:
        catalog = Catalog.from_file(self.settings.catalog_file)
        wanted = self.extra_args or [s.id for s in catalog.stacks]
        unknown = [i for i in wanted if catalog.stack(i) is None]
        if unknown:
            offered = ", ".join(s.id for s in catalog.stacks) or "none"
            raise SystemExit(f"{self.name}: no stack {unknown[0]!r} in the catalog ({offered})")
        for stack_id in wanted:
            stack = catalog.stack(stack_id)
            assert stack is not None
            try:
                environment = asyncio.run(self._builder(stack).ensure(stack, self._say))
            except StackBuildError as e:
                raise SystemExit(f"{self.name}: {e}") from e
            self.log.info("%s: %s", stack.id, environment.path)

    def _builder(self, stack: Stack) -> StackEnvironments:
        launcher = self._launcher_config()
        return stack_builder(
            str(launcher.get("stack_environments_dir", default_root())),
            stack,
            float(launcher.get("stack_build_timeout", BUILD_TIMEOUT)),
            self.log,
            account=str(launcher.get("stack_build_account", BUILD_ACCOUNT)),
            cgroup_parent=str(launcher.get("cgroup_parent", "composespawner")),
            pids_per_gib=int(launcher.get("pids_per_gib", PIDS_PER_GIB)),
        )

    def _launcher_config(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for section in ("LocalLauncher", "ComposeSpawner"):
            if section in self.config:
                values.update(self.config[section])
        return values

    def _say(self, message: str, percent: int) -> None:
        del percent
        self.log.info("%s", message)
