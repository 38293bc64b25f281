"""The ``--state-file``: attachments and tags that survive a restart (I/O).

Real composed hardware stays composed when its manager restarts; with a state
file the simulator behaves the same. The file is rewritten after every write,
atomically (a temporary file renamed over it), so a crash never leaves half a
document behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .state import FabricState, StateFileError


class StateFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load_into(self, state: FabricState) -> list[str]:
        """Restore ``state`` from the file if it exists; returns what was dropped.

        A file that exists but cannot be read raises :class:`StateFileError`:
        starting empty instead would report attached devices as free.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as err:
            raise StateFileError(f"cannot read {self.path}: {err}") from err
        try:
            document = json.loads(text)
        except ValueError as err:
            raise StateFileError(f"{self.path} is not JSON: {err}") from err
        return state.restore(document)

    def save(self, document: dict[str, Any]) -> None:
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        try:
            temporary.write_text(json.dumps(document) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError as err:
            raise StateFileError(f"cannot write {self.path}: {err}") from err
