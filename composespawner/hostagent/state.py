"""The agent's records of the notebooks it started, in its state folder (root's alone).

Each SSH channel runs a fresh agent, so what one start decided must be seen by
the next: ``<machine>.json`` per running notebook, written whole (a rename), and
one lock file that a start holds from its checks until its record is written,
so two starts racing for one GPU or the host's last cores cannot both pass.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from composespawner.hostagent.decisions import Record
from composespawner.launchers.processes import process_started

LOCK = ".lock"
log = logging.getLogger("composespawner.hostagent")


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def ensure(self) -> None:
        """The folder, made root's alone (records name accounts, logs hold output)."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = self.path.stat()
        if found.st_mode & 0o077:
            self.path.chmod(0o700)

    @contextlib.contextmanager
    def locked(self, name: str = LOCK) -> Iterator[None]:
        """Held by one agent at a time on this host (a start's checks through its record)."""
        self.ensure()
        fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # and with it the lock

    def record_path(self, machine: str) -> Path:
        return self.path / f"{machine}.json"  # machine ids are [A-Za-z0-9_-] (the protocol's)

    def log_path(self, machine: str) -> Path:
        return self.path / f"{machine}.log"

    def read(self, machine: str) -> Record | None:
        return self._load(self.record_path(machine))

    def records(self) -> list[Record]:
        try:
            paths = sorted(self.path.glob("*.json"))
        except OSError:
            return []
        return [record for path in paths if (record := self._load(path)) is not None]

    def write(self, record: Record) -> None:
        self.ensure()
        target = self.record_path(record.machine)
        partial = target.with_name(f".{target.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(record.to_json(), file)
        os.replace(partial, target)

    def remove(self, record: Record) -> None:
        """Remove ``record`` if the file still holds it (not a later start's)."""
        if self.read(record.machine) == record:
            with contextlib.suppress(FileNotFoundError):
                self.record_path(record.machine).unlink()

    def prune_logs(self, older_than: float) -> None:
        """Remove the logs of ended notebooks last written before ``older_than`` (epoch s)."""
        running = {record.machine for record in self.records()}
        for path in self.path.glob("*.log"):
            with contextlib.suppress(OSError):  # another agent's prune got there first
                if path.stem not in running and path.stat().st_mtime < older_than:
                    path.unlink()

    def _load(self, path: Path) -> Record | None:
        try:
            return Record.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.error("ignoring the damaged record %s: %s", path, e)
            return None


def alive(record: Record) -> bool:
    """Whether the record's process runs: its pid, started when the notebook did."""
    return process_started(record.pid) == record.started
