"""The agent's guards at its edges: no account made over a campus directory's head, the
system's PATH, the run manifest written as the account, a notebook's log kept under a cap.

The tests that make accounts and start processes need root: run them under
``flock /tmp/heavy.lock``.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from composespawner.hostagent import __main__ as agent_main
from composespawner.hostagent import accounts, logsink
from composespawner.hostagent.config import MachineFacts, parse_config
from composespawner.hostagent.starting import SINKS, StartFailed, popen_as, write_as
from composespawner.launchers.agent_protocol import Refused
from tests.hostagent.hosts import USERS_GROUP, Host

pytestmark = pytest.mark.timeout(60)

FACTS = MachineFacts(cores=4, memory_gib=4, python=sys.executable, nvidia_smi=None)
NOBODY_KNOWS = "cshost-nobody-knows"  # no account of this name on the test machine


@pytest.fixture
def nsswitch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nsswitch.conf"
    monkeypatch.setattr(accounts, "NSSWITCH", path)
    return path


def test_no_account_is_made_while_passwd_has_a_directory(nsswitch: Path) -> None:
    nsswitch.write_text("passwd: files sss\ngroup: files sss\n")
    config = parse_config({}, {}, FACTS)
    with pytest.raises(Refused, match="passwd: sss") as refused:
        accounts.existing_account(NOBODY_KNOWS, config)
    assert "shadow the campus one" in str(refused.value)
    always = replace(config, create_accounts="always")
    assert accounts.existing_account(NOBODY_KNOWS, always) is None  # may be made


def test_an_account_may_be_made_where_passwd_is_local(nsswitch: Path) -> None:
    config = parse_config({}, {}, FACTS)
    nsswitch.write_text("passwd: files systemd\n")
    assert accounts.existing_account(NOBODY_KNOWS, config) is None
    nsswitch.unlink()  # no nsswitch.conf: glibc reads files alone
    assert accounts.existing_account(NOBODY_KNOWS, config) is None


def test_an_unreadable_nsswitch_makes_no_account(nsswitch: Path) -> None:
    nsswitch.mkdir()  # read_text fails (IsADirectoryError), as an unreadable file would
    with pytest.raises(Refused, match="cannot be read"):
        accounts.existing_account(NOBODY_KNOWS, parse_config({}, {}, FACTS))


def test_the_agent_runs_with_the_systems_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    monkeypatch.delenv("SSH_ORIGINAL_COMMAND", raising=False)
    log = logging.getLogger("composespawner.hostagent")
    handlers = list(log.handlers)
    with (tmp_path / "stdout").open("w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)  # the channel: a file with a descriptor
        try:
            assert agent_main.main(["--config", str(tmp_path / "missing.toml")]) == 2
        finally:
            for handler in log.handlers[len(handlers) :]:
                log.removeHandler(handler)
    assert os.environ["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
    assert "misconfigured" in (tmp_path / "stdout").read_text()


def drained(tmp_path: Path, data: bytes, cap: int, before: bytes = b"") -> bytes:
    log_path = tmp_path / "m1.log"
    log_path.write_bytes(before)
    source = tmp_path / "output"
    source.write_bytes(data)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    with source.open("rb") as read:
        try:
            logsink.drain(read.fileno(), log, cap)
        finally:
            os.close(log)
    return log_path.read_bytes()


def test_a_log_under_its_cap_is_all_the_output(tmp_path: Path) -> None:
    assert drained(tmp_path, b"started\nlistening\n", cap=1 << 20) == b"started\nlistening\n"


def test_a_log_past_its_cap_starts_again_with_a_note(tmp_path: Path) -> None:
    data = b"".join(b"line %06d\n" % n for n in range(40_000))  # 480 kB, in 64 kB reads
    kept = drained(tmp_path, data, cap=100_000, before=b"x" * 50_000)
    assert len(kept) <= 100_000
    assert kept.startswith(logsink.NOTE)
    assert kept.endswith(b"line 039999\n")  # the most recent output is what is kept
    assert kept[len(logsink.NOTE) :] in data


# -- as root, with accounts and processes ------------------------------------------------


@pytest.fixture
def account(host: Host) -> pwd.struct_passwd:
    """A person's account whose home is its own (as a campus one on NFS is), let reach
    the agent's Python (here under /root) as the agent lets the accounts it makes."""
    made = host.campus_account()
    subprocess.run(["groupadd", "--system", "-f", USERS_GROUP], check=True, timeout=30)
    subprocess.run(["usermod", "-aG", USERS_GROUP, made.pw_name], check=True, timeout=30)
    accounts.open_the_way([sys.executable])
    return made


@pytest.mark.host_processes
def test_the_run_manifest_is_written_as_the_account(account: pwd.struct_passwd) -> None:
    home = Path(account.pw_dir)
    path = home / ".composespawner" / "default.run.json"
    path.parent.mkdir()
    os.chown(path.parent, account.pw_uid, account.pw_gid)
    path.symlink_to("/etc/composespawner-planted")  # a link the user planted: not followed
    write_as(account, path, b'{"machine": "m1"}\n')
    found = path.lstat()
    # The account's own file: written by it, as on a home where root is nobody (NFS).
    assert (found.st_uid, found.st_gid) == (account.pw_uid, account.pw_gid)
    assert stat.S_ISREG(found.st_mode)
    assert stat.S_IMODE(found.st_mode) == 0o444
    assert path.read_bytes() == b'{"machine": "m1"}\n'
    assert not Path("/etc/composespawner-planted").exists()
    write_as(account, path, b"{}\n")  # the next start's replaces it
    assert path.read_bytes() == b"{}\n"


@pytest.mark.host_processes
def test_a_manifest_the_account_cannot_write_fails_the_start(account: pwd.struct_passwd) -> None:
    closed = Path(account.pw_dir) / ".composespawner"
    closed.mkdir(mode=0o755)  # root's: the account may not write in it
    with pytest.raises(StartFailed, match="cannot write the run manifest"):
        write_as(account, closed / "default.run.json", b"{}\n")
    assert not (closed / "default.run.json").exists()


@pytest.mark.host_processes
def test_a_notebooks_output_reaches_its_log_under_the_cap(
    account: pwd.struct_passwd, tmp_path: Path
) -> None:
    log_path = tmp_path / "m1.log"
    noisy = "import sys\nfor n in range(100_000): print('output line', n)\nprint('the end')\n"
    process = popen_as(account, [sys.executable, "-I", "-c", noisy], {}, (), log_path, cap=200_000)
    assert process.wait(timeout=30) == 0  # the cap never stops the notebook
    _, status = os.waitpid(SINKS.pop(), 0)
    assert os.waitstatus_to_exitcode(status) == 0  # the notebook's end is the sink's EOF
    kept = log_path.read_bytes()
    assert kept.endswith(b"the end\n")
    assert len(kept) <= 200_000
    assert kept.startswith(logsink.NOTE)
    found = log_path.stat()
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o600)
