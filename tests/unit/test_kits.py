"""Merging a starter kit into a home, as nbgitpuller does: the user's work always wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from composespawner.launchers.kits import Step, kit_files, merge, plan, remembered


def test_plan_decides_each_file_from_hashes() -> None:
    kit = {"new.py": "k1", "deleted.py": "k2", "same.py": "k3", "old.py": "k4", "edited.py": "k5",
           "clash.py": "k6"}  # fmt: skip
    home = {"same.py": "k3", "old.py": "g4", "edited.py": "u5", "clash.py": "u6"}
    given = {"deleted.py": "k2", "same.py": "k3", "old.py": "g4", "edited.py": "g5"}
    assert {s.path: s.action for s in plan(kit, home, given)} == {
        "new.py": "copy",
        "deleted.py": "copy",
        "same.py": "same",
        "old.py": "update",
        "edited.py": "keep",
        "clash.py": "rename",
    }


def test_a_kept_file_is_remembered_as_it_was_given_not_as_the_kit_is_now() -> None:
    steps = [Step("edited.py", "keep"), Step("own.py", "keep"), Step("old.py", "update")]
    kit = {"edited.py": "k5", "own.py": "k6", "old.py": "k4"}
    assert remembered(steps, kit, {"edited.py": "g5"}) == {"edited.py": "g5", "old.py": "k4"}


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    folder = tmp_path / "kit"
    (folder / "lib").mkdir(parents=True)
    (folder / "kit.ipynb").write_text("notebook v1")
    (folder / "lib" / "data.py").write_text("data v1")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "data.pyc").write_text("not the kit")
    return folder


def merged(kit: Path, home: Path) -> dict[str, str]:
    return {s.path: s.action for s in merge(kit, home, "demo")}


def test_the_first_start_copies_the_kit_and_nothing_it_left_behind(
    kit: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    assert merged(kit, home) == {"kit.ipynb": "copy", "lib/data.py": "copy"}
    into = home / "starter-kits" / "demo"
    assert (into / "kit.ipynb").read_text() == "notebook v1"
    assert not (into / "__pycache__").exists()
    memory = json.loads((home / ".composespawner" / "kits" / "demo.json").read_text())
    assert memory == kit_files(kit)


def test_the_users_edits_win_and_untouched_files_follow_the_kit(kit: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    merge(kit, home, "demo")
    into = home / "starter-kits" / "demo"
    (into / "kit.ipynb").write_text("my model")
    (kit / "kit.ipynb").write_text("notebook v2")
    (kit / "lib" / "data.py").write_text("data v2")
    assert merged(kit, home) == {"kit.ipynb": "keep", "lib/data.py": "update"}
    assert (into / "kit.ipynb").read_text() == "my model"
    assert (into / "lib" / "data.py").read_text() == "data v2"
    # Still the user's on the next start, and the one after.
    assert merged(kit, home)["kit.ipynb"] == "keep"
    assert (into / "kit.ipynb").read_text() == "my model"


def test_a_deleted_file_comes_back(kit: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    merge(kit, home, "demo")
    (home / "starter-kits" / "demo" / "kit.ipynb").unlink()
    assert merged(kit, home)["kit.ipynb"] == "copy"
    assert (home / "starter-kits" / "demo" / "kit.ipynb").read_text() == "notebook v1"


def test_a_users_own_file_of_a_kit_files_name_is_renamed(kit: Path, tmp_path: Path) -> None:
    into = tmp_path / "home" / "starter-kits" / "demo"
    into.mkdir(parents=True)
    (into / "kit.ipynb").write_text("mine")
    (into / "kit-1.ipynb").write_text("also mine")
    assert merged(kit, tmp_path / "home")["kit.ipynb"] == "rename"
    assert (into / "kit.ipynb").read_text() == "notebook v1"
    assert (into / "kit-1.ipynb").read_text() == "also mine"
    assert (into / "kit-2.ipynb").read_text() == "mine"


def test_a_link_in_the_home_is_renamed_never_written_through(kit: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not the kit's to change")
    into = tmp_path / "home" / "starter-kits" / "demo"
    into.mkdir(parents=True)
    (into / "kit.ipynb").symlink_to(elsewhere)
    assert merged(kit, tmp_path / "home")["kit.ipynb"] == "rename"
    assert elsewhere.read_text() == "not the kit's to change"
    assert (into / "kit-1.ipynb").is_symlink()
    assert (into / "kit.ipynb").read_text() == "notebook v1"


def test_a_broken_memory_makes_every_differing_file_the_users(kit: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    merge(kit, home, "demo")
    (home / "starter-kits" / "demo" / "kit.ipynb").write_text("my model")
    (home / ".composespawner" / "kits" / "demo.json").write_text("[not, json")
    assert merged(kit, home)["kit.ipynb"] == "rename"
    assert (home / "starter-kits" / "demo" / "kit-1.ipynb").read_text() == "my model"
