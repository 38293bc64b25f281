"""What the spawner tells a user when it will not start their server."""

from __future__ import annotations

from jupyterhub.spawner import SpawnException


class ComposeRefusal(SpawnException):
    """A refusal shown to the user as-is: on the form, the progress page and in the API."""

    def __init__(self, message: str, *, reason: str, status_code: int) -> None:
        super().__init__(message, reason=reason, status_code=status_code)
        # The spawn form shows ``jupyterhub_message`` verbatim (str() adds a prefix).
        self.jupyterhub_message = message
