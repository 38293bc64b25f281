"""System accounts of the users a production hub makes, on this machine, removed afterwards."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from composespawner.launchers.accounts import ensure_user_account, let_in


@contextmanager
def user_accounts(homes: Path, names: Iterable[str], reach: Iterable[Path]) -> Iterator[None]:
    """Accounts of their own for ``names``, as the production hub makes them at first login,
    each let in to ``reach`` (this machine's Python may sit in root's home, as no
    production host's does). Afterwards every account with a home under ``homes`` is
    removed, those the hub made included, with the way in it was given."""
    reach = list(reach)
    opened: dict[str, list[Path]] = {}
    try:
        for name in names:
            account = ensure_user_account(name, homes)
            opened[name] = let_in(account, reach)
        yield
    finally:
        for name, folders in opened.items():
            for folder in folders:
                run(["setfacl", "-x", f"u:{name}", str(folder)])
        for account in pwd.getpwall():
            if Path(account.pw_dir).is_relative_to(homes):
                run(["userdel", "--remove", account.pw_name])


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"
