"""The run manifest goes into a folder the notebook owns: nothing there is trusted by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.local import write_for_notebook


def test_the_file_is_written_read_only_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / ".composespawner" / "default.run.json"
    write_for_notebook(path, b'{"run": 1}', None)
    assert path.read_bytes() == b'{"run": 1}'
    assert path.stat().st_mode & 0o777 == 0o444
    write_for_notebook(path, b'{"run": 2}', None)  # over the read-only one
    assert path.read_bytes() == b'{"run": 2}'
    assert [p.name for p in path.parent.iterdir()] == ["default.run.json"]


def test_a_folder_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".composespawner").symlink_to(elsewhere)
    with pytest.raises(SpawnRefused, match=r"is not a folder \(it may be a link"):
        write_for_notebook(home / ".composespawner" / "default.run.json", b"{}", None)
    assert list(elsewhere.iterdir()) == []


def test_a_planted_link_in_the_folder_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me")
    folder = tmp_path / ".composespawner"
    folder.mkdir()
    (folder / "default.run.json").symlink_to(target)
    write_for_notebook(folder / "default.run.json", b"{}", None)
    assert target.read_text() == "keep me"
    assert not (folder / "default.run.json").is_symlink()
    assert (folder / "default.run.json").read_bytes() == b"{}"
