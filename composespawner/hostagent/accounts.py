"""The account a notebook runs as on this host: the user's own, never a system one.

An existing account (a campus one through NSS/SSSD, or one made here before) is
used as it is, when its uid is a person's (``min_uid`` to ``max_uid``). Otherwise the
agent creates it, unless ``create_accounts`` says not to: by default none is made
where NSS looks accounts up in a directory (SSSD, LDAP: the name may be a campus
person's whose directory is unreachable just now, and a local account would
shadow theirs). It creates it as the local launcher creates a person's account
(:func:`~composespawner.launchers.accounts.user_account_command`), with a home
only it may enter under ``home_root``, in the group ``composespawner-users``.

That group is how accounts the agent made reach the notebook's interpreter
when it sits behind a folder others may not enter (a Python under ``/root``,
as pyenv installs it, on a test machine): the agent lets the group enter
those folders, only to enter (an ACL ``g:composespawner-users:x``), never to
list. One entry per folder for every account, rather than one per account
(``launchers.accounts.let_in``): a host that makes thousands of accounts
would otherwise grow ``/root``'s ACL past what the filesystem holds. A campus
account is left as its site made it; if it cannot reach the interpreter, the
start fails saying so (add it to the group, or install where all can enter).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from composespawner.hostagent.config import USERS_GROUP, AgentConfig
from composespawner.hostagent.decisions import (
    account_refusal,
    creation_refusal,
    directory_sources,
    interpreter_of,
    passwd_sources,
)
from composespawner.launchers.accounts import (
    USERADD_TIMEOUT,
    AccountError,
    closed_dirs,
    ensure_account,
    let_enter,
    make_home,
    user_account_command,
)
from composespawner.launchers.agent_protocol import Refused

NSSWITCH = Path("/etc/nsswitch.conf")  # where NSS's sources are (read at each lookup: tests set it)
log = logging.getLogger("composespawner.hostagent")


def existing_account(name: str, config: AgentConfig) -> pwd.struct_passwd | None:
    """``name``'s account if it exists and may run notebooks; None if the agent may
    create it; Refused if it may not run one, or may not be created."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        asks_nss = config.create_accounts == "when-no-directory"
        directories = directory_sources(passwd_sources(_nsswitch(name))) if asks_nss else []
        refusal = creation_refusal(name, config.create_accounts, directories)
        if refusal:
            raise Refused(refusal) from None
        return None
    refusal = account_refusal(
        name,
        account.pw_uid,
        account.pw_gid,
        config.min_uid,
        group_names(name, account.pw_gid),
        config.refused_groups,
        config.max_uid,
    )
    if refusal:
        raise Refused(refusal)
    return account


def create_account(name: str, config: AgentConfig) -> pwd.struct_passwd:
    """A new person's account under ``home_root``, in :data:`USERS_GROUP`; AccountError."""
    group = ensure_group(USERS_GROUP)
    config.home_root.mkdir(mode=0o755, parents=True, exist_ok=True)
    command = user_account_command(name, config.home_root)
    account = ensure_account(name, [*command[:-1], "--groups", group, command[-1]])
    refusal = account_refusal(
        name, account.pw_uid, account.pw_gid, config.min_uid, max_uid=config.max_uid
    )
    if refusal:  # useradd's UID_MIN/UID_MAX (login.defs) outside the agent's min/max_uid
        raise AccountError(f"useradd made {refusal}; set UID_MIN/UID_MAX in /etc/login.defs")
    make_home(Path(account.pw_dir), account)
    log.info("created the account %s (uid %d, home %s)", name, account.pw_uid, account.pw_dir)
    return account


def _nsswitch(name: str) -> str:
    """``/etc/nsswitch.conf``'s text; "" where there is none (glibc then reads files).
    Refused if it cannot be read: whether a directory is behind NSS is then unknown."""
    try:
        return NSSWITCH.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise Refused(
            f"no account {name!r} on this host, and {NSSWITCH} cannot be read ({e.strerror}):"
            " whether accounts come from a directory is unknown, so none is created"
        ) from None


def group_names(name: str, gid: int) -> list[str]:
    """The names of the groups ``name`` is in (as initgroups gives them to its notebook)."""
    names = []
    for member_of in os.getgrouplist(name, gid):
        with contextlib.suppress(KeyError):
            names.append(grp.getgrgid(member_of).gr_name)
    return names


def ensure_group(name: str) -> str:
    with contextlib.suppress(KeyError):
        return grp.getgrnam(name).gr_name
    command = [_groupadd(), "--system", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=USERADD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountError(f"cannot create the group {name}: {e}") from e
    if done.returncode not in (0, 9):  # 9: made meanwhile by another agent
        raise AccountError(f"cannot create the group {name}: {done.stderr.strip()}")
    return name


def programs_of(command: Sequence[str]) -> list[Path]:
    """The program ``command`` runs and, for a script, the interpreter its ``#!`` names
    (none for no command)."""
    if not command:
        return []
    program = Path(command[0])
    programs = [program]
    try:
        with program.open("rb") as file:
            interpreter = interpreter_of(file.readline(256))
    except OSError:
        interpreter = None
    if interpreter:
        programs.append(Path(interpreter))
    return programs


def folders_to_open(programs: Iterable[Path]) -> list[Path]:
    """The closed folders on the way to each program, as named and as resolved."""
    paths = [p for program in programs for p in (program, program.resolve())]
    return list(dict.fromkeys(d for path in paths for d in closed_dirs(path)))


def let_group_in(folders: Iterable[Path], group: str = USERS_GROUP) -> None:
    """Let ``group`` enter ``folders`` (ACL ``x``, not read); AccountError if it cannot."""
    for folder in folders:
        let_enter(f"g:{group}", folder)


def _groupadd() -> str:
    return (
        shutil.which("groupadd") or shutil.which("groupadd", path="/usr/sbin:/sbin") or "groupadd"
    )


def open_the_way(configured: Sequence[str] = ()) -> None:
    """Let :data:`USERS_GROUP` enter the closed folders on the way to the configured
    notebook command's program and interpreter, and to the agent's own Python (a stack's
    environment runs on it); AccountError if it cannot.

    Never on the way to a path read from a stack's environment (its notebook server's
    ``#!`` line, a link in its ``bin``): the build wrote those, running the request's
    code, and could name any closed folder (``/root/.ssh``) to have it opened.
    """
    let_group_in(folders_to_open([*programs_of(configured), Path(sys.executable)]))


def stack_program_refusal(program: str, environment: Path, configured: str) -> str | None:
    """Why a stack's notebook program may not run: it leads (through links the build may
    have planted) out of the stack's environment, to neither the configured program nor
    the agent's own Python; None if it may."""
    real = Path(os.path.realpath(program))
    allowed = {Path(os.path.realpath(p)) for p in (configured, sys.executable)}
    if real in allowed or real.is_relative_to(os.path.realpath(environment)):
        return None
    return (
        f"the stack's notebook program {program} leads to {real}, outside its environment"
        f" {environment}; an administrator removes that environment to have it built again"
    )
