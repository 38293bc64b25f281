"""Whose System V objects are whose, read from the kernel's own tables, and the files an
account left in a shared-memory folder removed (never another's, never through a link)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from composespawner.launchers.ipc import remove_ipc_of, runs_as, sysv_objects_of

pytestmark = pytest.mark.timeout(10)

# /proc/sysvipc/shm as Linux 6.x writes it (its padding left out: columns are split on it).
SHM = "\n".join(
    " ".join(row)
    for row in (
        ("key shmid perms size cpid lpid nattch uid gid cuid cgid", "atime dtime ctime rss swap"),
        ("1433717 4 600 56 2201 2229 5 101 104 101 104", "1795915019 1795915019 1795915016 4096 0"),
        ("0 10 600 16777216 13822 13822 0 1001 1001 1001 1001", "1795915100 0 1795915100 0 0"),
        ("0 11 600 16777216 13835 13835 0 1002 1002 1001 1001", "1795915101 0 1795915101 0 0"),
    )
)
SEM = """\
       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
         0          3   600          1  1001  1001  1001  1001          0 1795915100
"""


def test_an_accounts_objects_are_those_it_owns_or_made() -> None:
    assert sysv_objects_of(1001, "shm", SHM) == [10, 11]  # 11: made by 1001, given to 1002
    assert sysv_objects_of(1002, "shm", SHM) == [11]
    assert sysv_objects_of(4242, "shm", SHM) == []
    assert sysv_objects_of(1001, "sem", SEM) == [3]
    assert sysv_objects_of(1001, "msg", "") == []


def test_only_the_accounts_files_go_and_links_are_not_followed(tmp_path: Path) -> None:
    shm, kept = tmp_path / "shm", tmp_path / "kept"
    shm.mkdir()
    kept.mkdir()
    (kept / "precious").write_text("another's")
    os.chown(kept / "precious", 4243, 4243)
    for name in ("torch_1234", "sem.mp-x"):
        (shm / name).write_text("x")
        os.chown(shm / name, 4242, 4242)
    (shm / "others").write_text("y")
    os.chown(shm / "others", 4243, 4243)
    (shm / "to-kept").symlink_to(kept)
    os.chown(shm / "to-kept", 4242, 4242, follow_symlinks=False)
    empty = tmp_path / "sysvipc"
    empty.mkdir()
    assert remove_ipc_of(4242, empty, [shm]) == 3
    assert sorted(p.name for p in shm.iterdir()) == ["others"]
    assert (kept / "precious").read_text() == "another's"


def test_roots_objects_are_nobodys_to_remove(tmp_path: Path) -> None:
    (tmp_path / "roots").write_text("x")
    assert remove_ipc_of(0, tmp_path, [tmp_path]) == 0
    assert (tmp_path / "roots").exists()


def test_a_deep_tree_is_walked_without_recursion_and_a_folder_link_is_not_entered(
    tmp_path: Path,
) -> None:
    shm, elsewhere = tmp_path / "shm", tmp_path / "elsewhere"
    shm.mkdir()
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("root's, through a link")
    os.chown(elsewhere / "victim", 4242, 4242)  # the account's own file, but not in shm
    deep = shm
    for _ in range(100):  # past MOST_DEPTH: a tree as deep as its owner likes costs nothing
        deep = deep / "d"
    deep.mkdir(parents=True)
    os.chown(shm / "d", 4242, 4242)
    (shm / "d" / "file").write_text("x")
    os.chown(shm / "d" / "file", 4242, 4242)
    (shm / "d" / "link").symlink_to(elsewhere, target_is_directory=True)
    os.chown(shm / "d" / "link", 4242, 4242, follow_symlinks=False)
    empty = tmp_path / "sysvipc"
    empty.mkdir()
    assert remove_ipc_of(4242, empty, [shm]) == 2  # the file and the link itself
    assert (elsewhere / "victim").exists()
    assert (shm / "d" / "d").is_dir()  # root's folders stay, and so does their owner's


def test_nothing_is_removed_while_a_process_of_the_account_runs(tmp_path: Path) -> None:
    (tmp_path / "mine").write_text("x")
    me = os.getuid()
    assert me == 0 or remove_ipc_of(me, tmp_path, [tmp_path]) == 0
    assert (tmp_path / "mine").exists()
    assert runs_as(os.getuid())
    assert not runs_as(4242)
