"""What every composespawner hub config sets alike: its services, scopes and roles.

The embedded default (``hub_config/jupyterhub_config.py``) and the production
config (``hub_config/production_config.py``) differ in who logs in, where state
lives and how the hub is reached; the GPU portal, the reconciler and the idle
culler, and what each may do, are the same. Each config passes its own values.
The reclaimer runs where a config asks for it (the embedded default does).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composespawner.domain.reclaim import SITE_DEFAULT, WINDOWS, policy_problems

CUSTOM_SCOPES: dict[str, dict[str, Any]] = {
    "custom:compose:staff": {
        "description": "Manage cohorts in the GPU portal: dates, sessions, stacks, starter"
        " kit. Give it as custom:compose:staff!group=<cohort> for one cohort.",
    },
    "custom:compose:admin": {
        "description": "Manage the GPU pool in its portal: inventory, quotas, cohorts,"
        " co-located devices, usage, the audit log.",
        "subscopes": ["custom:compose:staff"],
    },
}


@dataclass(frozen=True, slots=True)
class Services:
    """The hub-managed services of a composing hub, and how often they work."""

    config_file: Path  # the hub's config: the portal and the reconciler read it too
    portal_port: int
    cull_timeout: int = 600
    cull_every: int = 60
    reconcile_every: int = 60
    reconcile_grace: int = 60

    def with_hub(self) -> list[str]:
        """Run a service so that the kernel ends it when this hub process dies, even by
        SIGKILL: a restarted hub never finds its old reconciler or culler at work.
        (A config file runs inside the hub, so this is the hub's pid.)"""
        return [str(_bin() / "composespawner"), "with-hub", f"--hub-pid={os.getpid()}", "--"]

    def compose_env(self) -> dict[str, str]:
        """A service's environment is only what is listed (and the hub's API token):
        the config file reads its settings from these."""
        return {k: v for k, v in os.environ.items() if k.startswith("COMPOSE_")}

    def services(self) -> list[dict[str, Any]]:
        config = f"--config={self.config_file.resolve()}"
        return [
            {
                "name": "idle-culler",
                "command": [
                    *self.with_hub(),
                    sys.executable,
                    "-m",
                    "jupyterhub_idle_culler",
                    f"--timeout={self.cull_timeout}",
                    f"--cull-every={self.cull_every}",
                ],
            },
            {
                # The GPU portal at /services/compose/: "my machine" for everyone, quotas
                # and the audit log for admins. It reads the config for ledger and catalog.
                "name": "compose",
                "url": f"http://127.0.0.1:{self.portal_port}",
                "command": [*self.with_hub(), str(_bin() / "composespawner"), "portal", config],
                "environment": self.compose_env(),
                "oauth_no_confirm": True,
                # What the portal may learn of a visitor: their custom:compose:* scopes.
                "oauth_client_allowed_scopes": ["custom:compose:admin", "custom:compose:staff"],
            },
            {
                # Makes ledger, fabric and servers agree at hub start and then periodically.
                "name": "compose-reconciler",
                "command": [
                    *self.with_hub(),
                    str(_bin() / "composespawner"),
                    "reconcile",
                    config,
                    f"--every={self.reconcile_every}",
                    f"--grace={self.reconcile_grace}",
                ],
                "environment": self.compose_env(),
            },
        ]

    def reclaimer(self) -> dict[str, Any]:
        """The reclaimer: idle GPUs back to the pool while their servers run on. Where it
        reads GPU activity, how often, its policy and the hub's public URL (for the
        servers' kernels) are the config file's ``c.ReclaimerApp`` section. A config that
        runs it passes ``roles(reclaimer=True)``."""
        return {
            "name": RECLAIMER,
            "command": [
                *self.with_hub(),
                str(_bin() / "composespawner"),
                "reclaimer",
                f"--config={self.config_file.resolve()}",
            ],
            "environment": self.compose_env(),
        }


RECLAIMER = "compose-reclaimer"


def roles(
    *,
    admins: dict[str, list[str]] | None = None,
    extra: list[dict[str, Any]] | None = None,
    reclaimer: bool = False,
) -> list[dict[str, Any]]:
    """JupyterHub roles for users, notebooks, the services and the pool's admins.

    ``admins``: who holds ``compose-admin`` (``{"users": [...], "groups": [...]}``).
    ``reclaimer``: the config runs ``Services.reclaimer()`` (the hub refuses a role
    naming a service it does not have).
    """
    return [
        {
            # JupyterHub's default user role, and the GPU portal.
            "name": "user",
            "scopes": ["self", "access:services!service=compose"],
        },
        {
            # A notebook's own token (JupyterHub's server role), and the GPU portal for
            # composespawner.client: the machine it runs on, grown or shrunk in place.
            "name": "server",
            "scopes": [
                "users:activity!user",
                "access:servers!server",
                "access:services!service=compose",
            ],
        },
        {
            "name": "compose-admin",
            "description": "The GPU pool's admins",
            "scopes": ["custom:compose:admin", "access:services!service=compose"],
            **(admins or {}),
        },
        *(extra or []),
        {
            # Checks that a cohort's group exists, reads a user's groups for their quota,
            # a cohort's members for its usage, stops a server an admin releases from the
            # inventory page and starts one a user launches again from a run manifest.
            "name": "compose-portal",
            "scopes": [
                "list:groups",
                "read:groups",
                "read:users:groups",
                "read:users:name",
                "servers",
            ],
            "services": ["compose"],
        },
        {
            "name": "idle-culler",
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            "services": ["idle-culler"],
        },
        {
            "name": "compose-reconciler",
            "scopes": ["list:users", "read:servers", "admin:server_state", "delete:servers"],
            "services": ["compose-reconciler"],
        },
        *(
            [
                {
                    # The kernels API of the server whose idle GPU it takes, to shut the
                    # kernels down first. Machines and their GPUs it reads from the ledger
                    # and changes through the fabric, so no scope to read or stop servers.
                    "name": RECLAIMER,
                    "scopes": ["access:servers"],
                    "services": [RECLAIMER],
                }
            ]
            if reclaimer
            else []
        ),
    ]


def setting(name: str, default: str | None = None) -> str:
    """A config file's setting from the environment; a missing one ends the hub with
    what to set (a systemd unit reads them from its environment file)."""
    value = os.environ.get(name, default)
    if value is None:
        raise SystemExit(f"composespawner: set {name} (see the config file's header for what)")
    return value


def policy_setting(name: str) -> dict[str, Any]:
    """A reclaim policy from the environment: the fields that differ from the defaults,
    ``field=value`` comma-separated (``warn_after=1800,keeps_allowed=2``; ``off`` turns a
    step off), {} when unset. One that cannot be used ends the hub saying why. (``off``
    for anything but a step is refused: keeps_allowed's null means no limit.)"""
    policy: dict[str, Any] = {}
    for entry in setting_list(name):
        field, _, value = (part.strip() for part in entry.partition("="))
        if not field or not value:
            raise SystemExit(
                f"composespawner: {name}: {entry!r} is not field=value (e.g. warn_after=1800)"
            )
        if value == "off" and field not in WINDOWS:
            raise SystemExit(
                f"composespawner: {name}: {field}=off: only a step ({', '.join(WINDOWS)}) can"
                " be turned off; keeps_allowed=0 allows no Keep"
            )
        policy[field] = None if value == "off" else _number(value)
    problems = policy_problems(policy, over=SITE_DEFAULT)
    if problems:
        raise SystemExit(f"composespawner: {name} cannot be used: {'; '.join(problems.values())}")
    return policy


def _number(text: str) -> int | float | str:
    """``text`` as the number it is; as it is when none (the policy's check names it)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def setting_list(name: str) -> list[str]:
    """A comma-separated setting (empty when unset)."""
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _bin() -> Path:
    return Path(sys.executable).parent
