"""Command-line applications that read the hub's own config file.

Every composespawner process other than the hub (``composespawner reconcile``,
``composespawner upgrade-db``) is a traitlets ``Application``, as
jupyterhub-idle-culler is: it loads the same ``jupyterhub_config.py`` the hub
does, so the ledger, the fabric and the catalog are configured in one place.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from traitlets import Unicode, default
from traitlets.config import Application

from .settings import ComposeSettings, settings_from_config, upgrade_ledger


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
        before, after = upgrade_ledger(self.settings.ledger_url)
        if before == after:
            self.log.info("The ledger's schema is current (revision %s)", after)
        else:
            self.log.info("Upgraded the ledger's schema from %s to %s", before or "(empty)", after)
