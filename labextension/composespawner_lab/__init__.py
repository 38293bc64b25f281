"""composespawner's JupyterLab extension: the machine in the status bar and a side panel.

Two halves in one package, as JupyterLab's extensions ship: the prebuilt frontend in
``labextension/`` (``make labextension`` builds it) and a jupyter_server extension whose
``/compose/*`` endpoints call the GPU portal as ``composespawner.client`` does, with the
notebook's own ``$JUPYTERHUB_API_TOKEN``: the browser never holds that token.
"""

from __future__ import annotations

from typing import Any

EXTENSION = "composespawner-lab"  # the npm package's name: its folder under labextensions/


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": EXTENSION}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "composespawner_lab"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    # Imported here: JupyterLab lists the labextension paths without a server's packages.
    from composespawner_lab.handlers import setup_handlers

    setup_handlers(server_app.web_app)
    server_app.log.info("composespawner-lab: /compose endpoints ready")
