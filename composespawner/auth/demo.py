"""The embedded default's login: a few named demo accounts sharing one password.

JupyterHub's DummyAuthenticator lets any name in and its password option is
deprecated; SharedPasswordAuthenticator makes admins use a second 32-character
password. A demo needs neither: only the configured accounts, one password.
"""

from __future__ import annotations

import hmac
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import Unicode


class DemoAuthenticator(Authenticator):
    """Let the users in ``allowed_users`` (and ``admin_users``) log in with one password."""

    password = Unicode(
        config=True,
        help="The password every demo account logs in with. Set it from the environment.",
    )

    def check_allow_config(self) -> None:
        super().check_allow_config()
        if not self.password:
            raise ValueError("DemoAuthenticator.password is empty: set COMPOSE_DEMO_PASSWORD")

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        name = data.get("username", "")
        known = name in self.allowed_users or name in self.admin_users
        if known and hmac.compare_digest(data.get("password", ""), self.password):
            return name
        return None
