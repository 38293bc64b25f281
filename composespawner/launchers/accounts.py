"""The accounts notebooks run as when the hub is root.

In production each person has an account of their own (:func:`ensure_user_account`,
made at their first login), so one user's notebook cannot read, change or signal
another's. The embedded demo has no system accounts for its users and runs every
notebook under one unprivileged account (``shared_account``).

A notebook under root could read everything the hub holds: its environment in
``/proc``, the cookie secret, the databases, the fabric's password. Under one
unprivileged system account it reads none of that, provided it can still reach
what it runs: a Python installed under ``/root`` (pyenv), or a checkout in
root's home, is out of its reach until it is allowed to enter ``/root``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

DEFAULT_NOTEBOOK_ACCOUNT = "composespawner-nb"
BUILD_ACCOUNT = "composespawner-build"  # builds stack environments: never root
USERADD_TIMEOUT = 30.0  # seconds
_USERADD_EXISTS = 9  # useradd's exit status for "the account already exists"
# What useradd takes on every Linux without --badname (shadow's is_valid_user_name).
PR_SET_NO_NEW_PRIVS = 38  # linux/prctl.h
_ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


class AccountError(Exception):
    """The notebook account is missing or cannot run notebooks; the message says what to do."""


def notebook_account_for(shared_account: bool, hub_euid: int, account: str) -> str | None:
    """The account a shared-account notebook runs as: None means the hub's own."""
    if not shared_account or hub_euid != 0 or not account:
        return None
    return account


def switch_account_command(account: pwd.struct_passwd | None) -> list[str]:
    """What to put before a command so it runs as ``account``, with its group alone.

    util-linux's setpriv changes the account in the new process, after Popen
    has started it: Popen itself changes nothing, so it can vfork the hub.
    No new privileges either: a setuid program cannot lift the notebook back up.
    """
    if account is None:
        return []
    return [
        "setpriv",
        f"--reuid={account.pw_uid}",
        f"--regid={account.pw_gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]


def make_home(home: Path, owner: pwd.struct_passwd | None) -> None:
    """Create ``home`` if missing; under ``owner``, private to it.

    What is already so is not done again: a chown or chmod is a journalled
    write even when it changes nothing, and on ext4 every such write joins the
    next fsync of the hub's database.
    """
    home.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        home.mkdir(mode=0o700)
    if owner is None:
        return
    found = home.stat()
    if (found.st_uid, found.st_gid) != (owner.pw_uid, owner.pw_gid):
        os.chown(home, owner.pw_uid, owner.pw_gid)
    if stat.S_IMODE(found.st_mode) != 0o700:
        home.chmod(0o700)


def useradd_command(name: str) -> list[str]:
    """A system account with its own group, no login shell and no home of its own."""
    return [
        _useradd(),
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        name,
    ]


def user_account_command(name: str, homes: Path) -> list[str]:
    """A person's own account: its own group, a home under ``homes``, no password."""
    return [
        _useradd(),
        "--create-home",
        "--base-dir",
        str(homes),
        "--user-group",
        "--shell",
        "/bin/bash",  # for JupyterLab's terminals; with no password, no login
        name,
    ]


def is_account_name(name: str) -> bool:
    """Whether ``name`` can be a system account's name everywhere useradd runs."""
    return bool(_ACCOUNT_NAME.fullmatch(name)) and not name.isdigit()


def ensure_user_account(name: str, homes: Path) -> pwd.struct_passwd:
    """``name``'s own account, created at first need with a home only it may enter
    (an existing one is left as it is: its home's mode is the user's to choose)."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    if not is_account_name(name):
        raise AccountError(
            f"{name!r} cannot be a system account's name: use lower-case letters, digits,"
            " '_', '.' or '-', at most 32, starting with a letter or '_'."
        )
    account = ensure_account(name, user_account_command(name, homes))
    make_home(Path(account.pw_dir), account)
    return account


def ensure_account(name: str, command: list[str] | None = None) -> pwd.struct_passwd:
    """The account ``name``, created with ``command`` (a system account's ``useradd``
    by default) if missing (root, Debian and kin)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    command = command or useradd_command(name)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=USERADD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountError(f"Could not create the account {name!r}: {e}") from e
    if done.returncode not in (0, _USERADD_EXISTS):  # another process may have just made it
        raise AccountError(
            f"Could not create the account {name!r} ({done.stderr.strip()}): "
            f"create it yourself with `{' '.join(command)}`."
        )
    return pwd.getpwnam(name)


def account_reaching(name: str, needed: Iterable[Path]) -> pwd.struct_passwd:
    """The system account ``name``, made if missing, let in to ``needed`` (:func:`let_in`);
    AccountError, saying what to do, if it cannot be made or still cannot reach them."""
    needed = list(needed)
    account = ensure_account(name)
    let_in(account, needed)
    problem = reach_problem(account, needed)
    if problem:
        raise AccountError(problem)
    return account


def closed_dirs(path: Path, mode_of: Callable[[Path], int] | None = None) -> list[Path]:
    """Folders on the way to ``path`` that accounts other than their owner cannot enter."""
    mode_of = mode_of or (lambda p: p.stat().st_mode)
    return [d for d in reversed(path.parents) if not mode_of(d) & stat.S_IXOTH]


def let_in(account: pwd.struct_passwd, paths: Iterable[Path]) -> list[Path]:
    """Let ``account`` enter the closed folders on the way to ``paths``; those it let in.

    Only to enter (an ACL entry ``u:ACCOUNT:x``), never to list: the account can
    open what it is given the path of, say a checkout under ``/root``, and learns
    nothing else there. A folder the account can already enter is left alone.
    """
    closed = dict.fromkeys(d for path in paths for d in closed_dirs(path.resolve()))
    opened = [d for d in closed if not _runs_as(account, ["test", "-x", str(d)])]
    for folder in opened:
        let_enter(f"u:{account.pw_name}", folder)
    return opened


def let_enter(who: str, folder: Path) -> None:
    """An ACL entry that lets ``who`` (``u:NAME`` or ``g:NAME``) enter ``folder``, not list it."""
    command = ["setfacl", "-m", f"{who}:x", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        done = subprocess.CompletedProcess(command, 1, "", str(e))
    if done.returncode != 0:
        raise AccountError(
            f"Could not let {who.partition(':')[2]!r} enter {folder} ({done.stderr.strip()}):"
            f" run `{' '.join(command)}` (Debian package acl), or move what is there"
            " where every account can enter."
        )


def reach_problem(account: pwd.struct_passwd, programs: Iterable[Path]) -> str | None:
    """Why ``account`` could not run ``programs``, or None if it can.

    Asked of the system as that account (``test -x``), so ACLs count too.
    """
    for program in programs:
        real = program.resolve()
        # Programs and folders are reached when they can be run or entered; other files
        # (a module the account imports) when they can be read.
        can = "-x" if real.is_dir() or real.stat().st_mode & 0o111 else "-r"
        if _runs_as(account, ["test", can, str(real)]):
            continue
        closed = closed_dirs(real)
        folders = ", ".join(f"{d} (mode {stat.S_IMODE(d.stat().st_mode):04o})" for d in closed)
        fixes = " and ".join(f"`setfacl -m u:{account.pw_name}:x {d}`" for d in closed)
        return (
            f"Notebooks run as the unprivileged account {account.pw_name!r}, which cannot "
            f"reach {real}"
            + (
                f": it may not enter {folders}. Let it in ({fixes}, Debian package acl)"
                if closed
                else ""
            )
            + ", or keep it where every account can enter."
        )
    return None


def _useradd() -> str:
    """useradd, also where root's PATH leaves out the sbin folders (`su`, a bare chroot)."""
    return shutil.which("useradd") or shutil.which("useradd", path="/usr/sbin:/sbin") or "useradd"


def _runs_as(account: pwd.struct_passwd, command: list[str]) -> bool:
    try:
        done = subprocess.run(
            command,
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=[],
            capture_output=True,
            timeout=USERADD_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def becoming(account: pwd.struct_passwd, home: str) -> Callable[[], None]:
    """A ``preexec_fn`` that turns the forked child (root) into ``account``, for good."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it
    name, uid, gid = account.pw_name, account.pw_uid, account.pw_gid

    def become() -> None:  # in the forked child, as root, before exec
        os.initgroups(name, gid)
        os.setgid(gid)
        os.setuid(uid)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        os.chdir(home)  # as the account: a home root may not enter (NFS) is still entered

    return become
