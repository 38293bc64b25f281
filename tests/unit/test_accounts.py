"""Who a shared-account notebook runs as, and what keeps that account from running it."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from composespawner.launchers.accounts import (
    closed_dirs,
    let_in,
    notebook_account_for,
    reach_problem,
    switch_account_command,
    user_account_command,
    useradd_command,
)


@pytest.mark.parametrize(
    ("shared", "euid", "account", "expected"),
    [
        (True, 0, "composespawner-nb", "composespawner-nb"),  # root hub: never root notebooks
        (True, 1000, "composespawner-nb", None),  # a hub that is not root runs them as itself
        (True, 0, "", None),  # explicitly as root
        (False, 0, "composespawner-nb", None),  # each user's own account: not ours to choose
    ],
)
def test_the_notebook_account_is_used_only_by_a_root_hub_with_shared_account(
    shared: bool, euid: int, account: str, expected: str | None
) -> None:
    assert notebook_account_for(shared, euid, account) == expected


def test_the_command_runs_as_the_account_with_its_group_alone() -> None:
    # The suite runs as root, as the demo's hub does: setpriv may change accounts.
    nobody = pwd.getpwnam("nobody")
    command = [*switch_account_command(nobody), "sh", "-c", "id -u; id -g; id -G"]

    done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)

    uid, gid, groups = done.stdout.split("\n")[:3]
    assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
    assert groups.split() == [str(nobody.pw_gid)]  # none of root's groups
    assert switch_account_command(None) == []


def test_closed_dirs_lists_the_folders_others_cannot_enter() -> None:
    modes = {"/": 0o755, "/root": 0o700, "/root/.pyenv": 0o755, "/root/.pyenv/bin": 0o750}
    found = closed_dirs(Path("/root/.pyenv/bin/python"), lambda p: stat.S_IFDIR | modes[str(p)])
    assert found == [Path("/root"), Path("/root/.pyenv/bin")]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a command as another account")
def test_reach_problem_names_the_closed_folder_and_the_fix(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    program = closed / "notebook"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    open_program = Path("/bin/sh")
    nobody = pwd.getpwnam("nobody")

    assert reach_problem(nobody, [open_program]) is None
    problem = reach_problem(nobody, [open_program, program])
    assert problem is not None
    assert f"cannot reach {program}" in problem
    assert f"`setfacl -m u:nobody:x {closed}`" in problem


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a command as another account")
def test_let_in_lets_the_account_enter_a_checkout_in_a_private_folder() -> None:
    with tempfile.TemporaryDirectory() as made:  # 0700, as `mktemp -d` makes it
        base = Path(made)
        private = base / "root-home"  # as root's home
        package = private / "clone" / "composespawner"
        package.mkdir(parents=True)
        private.chmod(0o700)
        module = package / "kits.py"
        module.write_text("")
        nobody = pwd.getpwnam("nobody")
        assert reach_problem(nobody, [module]) is not None

        assert let_in(nobody, [module, package]) == [base, private]
        assert reach_problem(nobody, [module]) is None
        assert let_in(nobody, [module]) == []  # nothing more to do
        listing = subprocess.run(
            [*switch_account_command(nobody), "ls", str(private)], capture_output=True, timeout=10
        )
        assert listing.returncode != 0  # to enter, not to list
        assert private.stat().st_mode & 0o007 == 0  # nothing opened to all accounts


def test_useradd_is_found_where_roots_path_leaves_out_sbin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # as `su` or a chroot gives it
    assert Path(useradd_command("someone")[0]).name == "useradd"
    assert Path(useradd_command("someone")[0]).is_file()
    assert Path(user_account_command("someone", Path("/home"))[0]).is_file()
