"""Where the embedded default's files are, and the commands of its processes.

The embedded default (one machine, SQLite, the simulated fabric) ships inside
the package: its config, catalog and simulated inventory as the data package
``composespawner.hub_config`` (built from the repository's ``hub_config/``), and
the hub's page templates under ``templates/hub``. So ``composespawner demo``
runs from an installed wheel, with no source checkout anywhere.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from composespawner.ledger.database import log_ahead

PACKAGE = Path(__file__).resolve().parents[1]  # composespawner/, above commands/
CONFIG_FILE = "jupyterhub_config.py"
# The simulator and the spawner of the demo share these Redfish credentials.
DEMO_FABRIC_USERNAME = "admin"
DEMO_FABRIC_PASSWORD = "fabric-demo"


def config_dir() -> Path:
    """The embedded default's folder: in the package when installed, else the checkout's.

    setup.py maps the repository's ``hub_config/`` to ``composespawner/hub_config``
    in a wheel; running from a checkout (PYTHONPATH or an editable install) the
    same files sit beside the package.
    """
    installed = PACKAGE / "hub_config"
    return installed if (installed / CONFIG_FILE).is_file() else PACKAGE.parent / "hub_config"


def hub_templates_dir() -> Path:
    """The spawn form and progress pages for ``c.JupyterHub.template_paths``."""
    return PACKAGE / "templates" / "hub"


def hub_database_kwargs(path: Path) -> dict[str, Any]:
    """``c.JupyterHub.db_kwargs`` for the hub's own SQLite file: a write-ahead log.

    JupyterHub commits on its event loop, and in SQLite's default rollback mode
    each commit waits for two or three fsyncs: every page and API call of every
    user waits with it. On the ledger's write-ahead log (:func:`log_ahead`) a
    commit syncs nothing until a checkpoint. A power cut that loses the last
    commits also ends, on one machine, every notebook they were about. A
    200-user spawn storm was ready about a fifth sooner.
    """
    return {"creator": _wal_connector(path)}


def _wal_connector(path: Path) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        # What JupyterHub's own engine passes for SQLite (its pool hands a
        # connection to whichever thread runs the query).
        connection = sqlite3.connect(path, check_same_thread=False)
        log_ahead(connection)
        return connection

    return connect


def simulator_command(
    composespawner: str | Path, *, port: int, state_file: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The fabric simulator serving the embedded default's inventory on ``port``."""
    return [
        str(composespawner),
        "fabric-simulator",
        "--inventory",
        str(config_dir() / "fabric_inventory.toml"),
        "--port",
        str(port),
        "--state-file",
        str(state_file),
        *extra,
    ]
