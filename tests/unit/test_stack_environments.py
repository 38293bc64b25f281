"""Stack environments: built once from a hashed lock, shared, never half there.

The builds here are real (venv and pip) from a wheel the test makes, so they
need no package index; the stacks' own locks are built in tests/e2e.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from composespawner.domain.catalog import Stack
from composespawner.launchers.environments import (
    MANIFEST,
    StackBuildError,
    StackEnvironments,
    environment_key,
    notebook_side_sha256,
    pip_percent,
    requirement_count,
)
from composespawner.launchers.local import LocalLauncher
from tests.support.stacks import COMMON, make_stack


def test_requirement_count_counts_packages_not_hashes_or_comments() -> None:
    lock = (
        "# header\nsix==1.17.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
        "    # via x\nnumpy==2.4.6 \\\n    --hash=sha256:cc\n"
    )
    assert requirement_count(lock) == 2


def test_pip_percent_stays_within_the_fetch_phase() -> None:
    percents = [pip_percent(seen, 40) for seen in range(0, 60)]
    assert percents == sorted(percents)
    assert (percents[0], percents[40], percents[-1]) == (5, 80, 80)
    assert pip_percent(3, 0) == 80  # an empty lock cannot divide by zero


def test_the_key_changes_with_the_lock_python_common_files_and_notebook_side() -> None:
    key = environment_key("a" * 64, "3.11.2", "c" * 64, "n" * 64)
    assert key == environment_key("a" * 64, "3.11.2", "c" * 64, "n" * 64)
    assert key != environment_key("b" * 64, "3.11.2", "c" * 64, "n" * 64)
    assert key != environment_key("a" * 64, "3.12.0", "c" * 64, "n" * 64)
    assert key != environment_key("a" * 64, "3.11.2", "d" * 64, "n" * 64)
    assert key != environment_key("a" * 64, "3.11.2", "c" * 64, "m" * 64)


def test_the_notebook_side_hash_covers_the_built_lab_extension(tmp_path: Path) -> None:
    package = tmp_path / "composespawner_lab"
    package.mkdir()
    (package / "__init__.py").write_text("VERSION = 1\n")
    unbuilt = notebook_side_sha256(package)
    (package / "labextension").mkdir()
    (package / "labextension" / "package.json").write_text("{}\n")
    built = tmp_path / "built" / "composespawner_lab"
    shutil.copytree(package, built)
    assert notebook_side_sha256(built) != unbuilt
    (built / "labextension" / "remoteEntry.js").write_text("// newer\n")
    changed = tmp_path / "changed" / "composespawner_lab"
    shutil.copytree(built, changed)
    assert notebook_side_sha256(changed) not in (unbuilt, notebook_side_sha256(built))


def test_only_the_files_an_agent_takes_name_the_environment(tmp_path: Path) -> None:
    common = tmp_path / "common"
    shutil.copytree(COMMON, common)
    stack = make_stack(tmp_path)
    path = StackEnvironments(tmp_path / "envs", common).environment(stack).path
    (common / "notes~ with space").write_text("not a common file: no agent gets it\n")
    assert StackEnvironments(tmp_path / "envs", common).environment(stack).path == path


def test_a_changed_stack_manifest_with_the_same_lock_is_another_environment(
    tmp_path: Path,
) -> None:
    # The probe's: an environment's name ignored the common files, so a changed
    # stack_manifest.py with the same lock reused (or poisoned) the built environment.
    common = tmp_path / "common"
    shutil.copytree(COMMON, common)
    stack = make_stack(tmp_path)
    environments = StackEnvironments(tmp_path / "envs", common)
    before = environments.environment(stack).path
    manifest = common / "stack_manifest.py"
    manifest.write_text(manifest.read_text() + "\nimport os  # another manifest\n")
    after = environments.environment(stack).path
    assert after != before
    assert after.name.startswith("tiny-")
    assert StackEnvironments(tmp_path / "envs", common).environment(stack).path == after


def test_a_lock_that_changed_since_the_catalog_pinned_it_is_refused(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)
    assert stack.cpu is not None
    environments = StackEnvironments(tmp_path / "envs", COMMON)
    assert environments.environment(stack) == environments.environment(stack)
    stack.cpu.lock.write_text(stack.cpu.lock.read_text() + "# edited\n")
    with pytest.raises(StackBuildError, match=r"Tiny 1\.0 stack's lock .* has changed"):
        environments.environment(stack)
    assert not (tmp_path / "envs").exists()


def test_a_stack_without_a_cpu_lock_cannot_run_here(tmp_path: Path) -> None:
    environments = StackEnvironments(tmp_path / "envs", COMMON)
    with pytest.raises(StackBuildError, match="has no CPU lock"):
        environments.environment(Stack(id="gpu-only", label="GPU only", common=COMMON))


# The wheel, the repro helper and composespawner's client: all importable in the stack.
SHOW = (
    "import repro, tiny; from composespawner import client;"
    " print(tiny.VERSION, repro.__name__, client.__name__)"
)


async def test_two_first_starts_share_one_build_and_the_second_use_waits_for_nothing(
    tmp_path: Path,
) -> None:
    stack = make_stack(tmp_path)
    environments = StackEnvironments(tmp_path / "envs", COMMON)
    assert environments.ready(stack) is None
    heard: dict[str, list[tuple[str, int]]] = {"first": [], "second": []}

    def listener(who: str) -> Callable[[str, int], None]:
        return lambda message, percent: heard[who].append((message, percent))

    first, second = await asyncio.gather(
        environments.ensure(stack, listener("first")),
        environments.ensure(stack, listener("second")),
    )
    assert first == second == environments.ready(stack)
    for events in heard.values():
        assert events[-1] == ("building the Tiny 1.0 stack (first use; cached after): 100%", 100)
        assert [p for _, p in events] == sorted(p for _, p in events)
    # One venv, made once: a second build would have started from 1% again.
    assert [p for _, p in heard["first"]].count(1) <= 1

    manifest = json.loads(first.manifest.read_text())
    assert (manifest["stack"], manifest["variant"]) == ("tiny", "cpu")
    assert stack.cpu is not None
    assert manifest["lock_sha256"] == stack.cpu.lock_sha256
    assert manifest["packages"]["tiny"] == "1.0"
    shown = await asyncio.to_thread(
        subprocess.run,
        [first.bin / "python", "-c", SHOW],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout.split() == ["1.0", "repro", "composespawner.client"]

    again: list[tuple[str, int]] = []
    assert await environments.ensure(stack, lambda m, p: again.append((m, p))) == first
    assert again == []


async def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    stack = make_stack(tmp_path, wheel_hash="0" * 64)  # the lock's hash is not the wheel's
    environments = StackEnvironments(tmp_path / "envs", COMMON)
    path = environments.environment(stack).path
    with pytest.raises(StackBuildError, match=r"Tiny 1\.0 stack could not be built \(install step"):
        await environments.ensure(stack, lambda m, p: None)
    assert not path.exists()
    assert not (path / MANIFEST).exists()


async def test_a_newer_repro_helper_is_built_into_another_environment(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)
    built = await StackEnvironments(tmp_path / "envs", COMMON).ensure(stack, lambda m, p: None)
    newer = tmp_path / "newer-common"
    shutil.copytree(COMMON, newer)
    (newer / "repro.py").write_text('"""A newer repro helper."""\nNEWER = True\n')
    heard: list[tuple[str, int]] = []
    again = await StackEnvironments(tmp_path / "envs", newer).ensure(
        stack, lambda m, p: heard.append((m, p))
    )
    assert again.path != built.path
    assert heard[-1][1] == 100  # built anew, never changed in place
    site, old_site = (next(e.path.glob("lib/python3.*/site-packages")) for e in (again, built))
    assert (site / "repro.py").read_text() == (newer / "repro.py").read_text()
    assert (old_site / "repro.py").read_text() == (COMMON / "repro.py").read_text()


async def test_only_a_start_that_builds_its_stack_gets_the_build_time(tmp_path: Path) -> None:
    stack = make_stack(tmp_path)
    launcher = LocalLauncher(stack_environments_dir=str(tmp_path / "envs"), stack_build_timeout=900)
    assert launcher.extra_start_time(stack) == 900
    assert launcher.extra_start_time(None) == 0  # no stack, nothing to build

    # Built here as the launcher's child builds it (tests/launchers has the child's).
    await StackEnvironments(tmp_path / "envs", COMMON).ensure(stack, lambda m, p: None)
    assert launcher.extra_start_time(stack) == 0
