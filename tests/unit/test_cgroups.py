"""A notebook's cgroup, decided: where the controllers are, its name, its limits, how it joins.

The decisions are pure and tested against literal mount tables and values; the
join wrapper and the undo of a half-made cgroup run for real against plain
files and folders (no cgroup needed: tests/launchers has the real ones).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User

from composespawner.domain.hardware import Share
from composespawner.launchers import local_process
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.cgroups import (
    LEAST_PIDS,
    CgroupError,
    CgroupPlan,
    Hierarchy,
    Limits,
    Write,
    balance_cpu_weight,
    cgroup_name,
    controllers_to_enable,
    hierarchies_in,
    join_command,
    join_then,
    make_cgroup,
    parent_cpu_weight,
    parent_parts,
    pids_limit,
    plan_cgroup,
    remove_cgroups,
    unconfined,
)
from composespawner.launchers.local import LocalLauncher

GIB = 1 << 30
LOGGER = "composespawner.test.cgroups"
CG = Path("/sys/fs/cgroup")
# This machine's kind: v1 controllers, and a v2 mount that holds only hugetlb.
HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
PURE_V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
V2_CONTROLLERS = {
    CG / "unified": "hugetlb\n",
    CG: "cpuset cpu io memory hugetlb pids rdma misc\n",
}


def controllers(mount: Path) -> str:
    return V2_CONTROLLERS[mount]


# -- where the controllers are --------------------------------------------------------


def test_on_a_hybrid_host_each_controller_comes_from_its_v1_mount() -> None:
    assert hierarchies_in(HYBRID, controllers) == (
        Hierarchy(CG / "cpu", False, frozenset({"cpu"})),
        Hierarchy(CG / "memory", False, frozenset({"memory"})),
        Hierarchy(CG / "pids", False, frozenset({"pids"})),
        Hierarchy(CG / "devices", False, frozenset({"devices"})),
    )
    assert unconfined(hierarchies_in(HYBRID, controllers)) == []


def test_on_a_pure_v2_host_one_hierarchy_holds_all_but_devices() -> None:
    assert hierarchies_in(PURE_V2, controllers) == (
        Hierarchy(CG, True, frozenset({"cpu", "memory", "pids"})),
    )
    (devices,) = unconfined(hierarchies_in(PURE_V2, controllers))
    assert devices.startswith("its device nodes")


def test_cpu_and_cpuacct_mounted_together_and_a_second_mount_of_it_counts_once() -> None:
    mounts = (
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
        "cgroup /mnt/again cgroup rw,cpu,cpuacct 0 0\n"
    )
    assert [h.mount for h in hierarchies_in(mounts, controllers)] == [
        CG / "cpu,cpuacct",
        CG / "memory",
        CG / "pids",
    ]


def test_a_mount_path_is_read_as_the_kernel_escapes_it() -> None:
    mounts = "cgroup2 /srv/my\\040cgroups cgroup2 rw 0 0\n"
    found = hierarchies_in(mounts, lambda mount: "cpu memory pids")
    assert found[0].mount == Path("/srv/my cgroups")


def test_without_a_memory_controller_it_says_which_is_missing() -> None:
    only_cpu = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
    with pytest.raises(CgroupError, match="holds the memory controller"):
        hierarchies_in(only_cpu, controllers)
    with pytest.raises(CgroupError, match="the cpu, memory controllers"):
        hierarchies_in("proc /proc proc rw 0 0\n", controllers)


def test_without_pids_or_devices_it_runs_and_says_what_is_not_held() -> None:
    found = hierarchies_in(
        "cgroup /a cgroup rw,cpu 0 0\ncgroup /b cgroup rw,memory 0 0\n", controllers
    )
    assert [m.split(" (")[0] for m in unconfined(found)] == ["its processes", "its device nodes"]


# -- names ------------------------------------------------------------------------------


def test_a_name_has_safe_characters_and_its_token() -> None:
    assert cgroup_name("ada", "", "0a1b2c3d") == "ada-default-0a1b2c3d"
    assert cgroup_name("a.b@uni/x", "..", "ff") == "a_b_uni_x-__-ff"
    assert cgroup_name("cgroup.procs", "thesis", "1") == "cgroup_procs-thesis-1"


def test_a_parent_stays_below_the_root() -> None:
    assert parent_parts("composespawner") == ("composespawner",)
    assert parent_parts("/hub/notebooks/") == ("hub", "notebooks")
    for outside in ("", "/", "../x", "a/../../b", "."):
        with pytest.raises(ValueError, match="is not a folder below"):
            parent_parts(outside)


# -- limits -----------------------------------------------------------------------------


def test_v1_limits_cores_memory_without_swap_processes_and_device_nodes() -> None:
    limits = Limits(Share(2, 8), pids=2048, devices=("c 1:3 rwm", "c 195:1 rwm"))
    plan = plan_cgroup(hierarchies_in(HYBRID, controllers), ("cs",), "ada-default-1", limits)
    cpu, memory, pids, devices = (
        CG / controller / "cs/ada-default-1" for controller in ("cpu", "memory", "pids", "devices")
    )
    assert plan == CgroupPlan(
        (cpu, memory, pids, devices),
        (
            Write(cpu / "cpu.cfs_period_us", "100000"),
            Write(cpu / "cpu.cfs_quota_us", "200000"),
            Write(memory / "memory.limit_in_bytes", str(8 * GIB)),
            Write(memory / "memory.memsw.limit_in_bytes", str(8 * GIB), optional=True),
            Write(pids / "pids.max", "2048"),
            Write(devices / "devices.deny", "a"),
            Write(devices / "devices.allow", "c 1:3 rwm"),
            Write(devices / "devices.allow", "c 195:1 rwm"),
        ),
    )
    assert plan.procs[:2] == (cpu / "cgroup.procs", memory / "cgroup.procs")


def test_without_device_rules_the_devices_cgroup_is_joined_but_not_written() -> None:
    plan = plan_cgroup(hierarchies_in(HYBRID, controllers), ("cs",), "a-1", Limits(Share(1, 1), 64))
    assert not [w for w in plan.writes if w.path.name.startswith("devices.")]


def test_a_notebooks_processes_are_counted_by_its_memory_and_never_below_the_least() -> None:
    assert pids_limit(Share(2, 8), per_gib=256) == 2048
    assert pids_limit(Share(1, 1), per_gib=16) == LEAST_PIDS
    # What a host's notebooks hold together is bounded by its memory, as the room is.
    assert sum(pids_limit(Share(1, gib), 256) for gib in (8, 8, 16)) == 256 * 32


def test_v2_enables_the_controllers_down_to_the_parent_then_limits() -> None:
    found = hierarchies_in(PURE_V2, controllers)
    plan = plan_cgroup(found, ("hub", "nb"), "bob-thesis-2", Limits(Share(4, 32), 8192, ("x",)))
    leaf = CG / "hub/nb/bob-thesis-2"
    enable = "+cpu +memory +pids"
    assert plan == CgroupPlan(
        (leaf,),
        (
            Write(CG / "cgroup.subtree_control", enable),
            Write(CG / "hub/cgroup.subtree_control", enable),
            Write(CG / "hub/nb/cgroup.subtree_control", enable),
            Write(leaf / "cpu.max", "400000 100000"),
            Write(leaf / "memory.max", str(32 * GIB)),
            Write(leaf / "memory.swap.max", "0", optional=True),
            Write(leaf / "pids.max", "8192"),
        ),
    )


def test_a_controller_already_enabled_is_not_enabled_again() -> None:
    assert controllers_to_enable("cpuset cpu io memory pids\n", "+cpu +memory") == ""
    assert controllers_to_enable("cpu\n", "+cpu +memory") == "+memory"
    assert controllers_to_enable("", "+cpu +memory") == "+cpu +memory"


# -- the edges, against plain files --------------------------------------------------------


def test_the_wrapper_enters_every_cgroup_as_the_process_it_execs(tmp_path: Path) -> None:
    procs = [tmp_path / "cpu.procs", tmp_path / "memory.procs"]
    for path in procs:
        path.write_text("")
    command = join_command(procs, ["sh", "-c", "echo $$"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    pid = done.stdout.strip()
    assert [path.read_text() for path in procs] == [pid + "\n", pid + "\n"]


def test_a_wrapper_that_cannot_enter_runs_nothing_and_says_why(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    gone = tmp_path / "gone" / "cgroup.procs"
    command = join_command([gone], ["touch", str(ran)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 126
    assert f"composespawner: cannot enter cgroup {gone}" in done.stderr
    assert not ran.exists()


def test_a_forked_start_enters_before_its_own_preexec(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    seen: list[str] = []

    def preexec() -> None:
        # In the child: what it wrote is there before the account would change.
        assert procs.read_text() != ""

    child = subprocess.Popen(
        [sys.executable, "-I", "-c", "import os; print(os.getpid())"],
        preexec_fn=join_then([procs], preexec),
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = child.communicate(timeout=30)
    seen.append(out.strip())
    assert child.returncode == 0
    assert procs.read_text() == seen[0]


def test_a_cgroup_half_made_is_removed_and_the_error_names_the_file(tmp_path: Path) -> None:
    leaf = tmp_path / "cs" / "ada-default-1"
    plan = CgroupPlan((leaf,), (Write(leaf / "memory.limit_in_bytes", "1"),))
    with pytest.raises(CgroupError, match=f"cannot write '1' to {leaf}/memory.limit_in_bytes"):
        make_cgroup(plan)
    assert not leaf.exists()
    assert (tmp_path / "cs").is_dir()  # the parent is shared: it stays


def test_an_optional_file_the_kernel_lacks_is_skipped(tmp_path: Path) -> None:
    leaf = tmp_path / "cs" / "ada-default-1"
    make_cgroup(CgroupPlan((leaf,), (Write(leaf / "memory.swap.max", "0", optional=True),)))
    assert leaf.is_dir()
    remove_cgroups([leaf, tmp_path / "never-made"], within=5)
    assert not leaf.exists()


def test_only_the_controllers_not_yet_enabled_are_written(tmp_path: Path) -> None:
    ready, half = tmp_path / "ready", tmp_path / "half"
    for folder, enabled in ((ready, "cpu memory\n"), (half, "cpu\n")):
        folder.mkdir()
        (folder / "cgroup.subtree_control").write_text(enabled)
    leaf = tmp_path / "cs" / "ada-default-1"
    enable = tuple(Write(f / "cgroup.subtree_control", "+cpu +memory") for f in (ready, half))
    make_cgroup(CgroupPlan((leaf,), enable))
    assert (ready / "cgroup.subtree_control").read_text() == "cpu memory\n"  # not written
    assert (half / "cgroup.subtree_control").read_text().startswith("+memory")
    remove_cgroups([leaf], within=5)


def test_a_cgroup_that_cannot_be_created_says_where(tmp_path: Path) -> None:
    blocker = tmp_path / "cs"
    blocker.write_text("a file, not a folder")
    with pytest.raises(CgroupError, match=f"cannot create {blocker}/ada"):
        make_cgroup(CgroupPlan((blocker / "ada",), ()))


# -- the launcher, where the share cannot be enforced -----------------------------------------


@pytest.fixture
def unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hierarchy whose parent cannot be made (a file is in the way): as without rights."""
    (tmp_path / "cgroup").write_text("")
    hierarchy = Hierarchy(tmp_path / "cgroup", False, frozenset({"cpu", "memory"}))
    monkeypatch.setattr(local_process, "find_hierarchies", lambda: (hierarchy,))
    return hierarchy.mount


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What the launcher logs (building a JupyterHub user drops pytest's root handler)."""
    log = logging.getLogger(LOGGER)
    log.addHandler(caplog.handler)
    yield caplog
    log.removeHandler(caplog.handler)


def launcher(tmp_path: Path, **config: Any) -> LocalLauncher:
    db = orm.new_session_factory("sqlite:///:memory:")()
    db.add(orm.User(name="ada"))
    db.commit()
    spawner: LocalLauncher = User(db.query(orm.User).one(), {})._new_spawner(
        "",
        spawner_class=LocalLauncher,
        cmd=[sys.executable, "-I", "-c", "import time; time.sleep(60)"],
        hub=Hub(),
        shared_account=True,
        notebook_account="",
        home_dir_template=str(tmp_path / "homes" / "{username}"),
        kill_timeout=1,
        **config,
    )
    spawner.share = Share(2, 8)
    spawner.log = logging.getLogger(LOGGER)
    return spawner


async def test_a_share_that_cannot_be_enforced_is_refused_with_what_to_do(
    tmp_path: Path, unwritable: Path, said: pytest.LogCaptureFixture
) -> None:
    spawner = launcher(tmp_path)
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 503
    assert "(2 cores, 8 GiB of memory)" in refused.value.jupyterhub_message
    assert "tell the hub's administrators" in refused.value.jupyterhub_message.lower()
    assert "c.LocalLauncher.cgroup_required = False" in said.text
    assert f"cannot create {unwritable}/composespawner" in said.text
    assert spawner.proc is None


async def test_unless_required_it_runs_without_limits_and_says_so(
    tmp_path: Path, unwritable: Path, said: pytest.LogCaptureFixture
) -> None:
    spawner = launcher(tmp_path, cgroup_required=False)
    await spawner.start()
    try:
        assert spawner.proc is not None
        assert spawner.proc.poll() is None
        assert spawner.proc.args[0] == sys.executable  # no wrapper
        assert "runs without its share (2 cores, 8 GiB) enforced" in said.text
        assert spawner.get_state().get("cgroups") is None
    finally:
        await spawner.stop()


async def test_without_a_share_nothing_is_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never() -> tuple[Hierarchy, ...]:
        raise AssertionError("no share: no cgroup")

    monkeypatch.setattr(local_process, "find_hierarchies", never)
    spawner = launcher(tmp_path)
    spawner.share = None
    await spawner.start()
    try:
        assert spawner.proc is not None
        assert spawner.proc.args[0] == sys.executable
    finally:
        await spawner.stop()


def test_a_restarted_hub_keeps_the_cgroups_it_must_remove(tmp_path: Path) -> None:
    spawner = launcher(tmp_path)
    spawner.load_state({"pid": 42, "cgroups": ["/sys/fs/cgroup/memory/cs/ada-default-1"]})
    assert spawner.get_state()["cgroups"] == ["/sys/fs/cgroup/memory/cs/ada-default-1"]


def test_a_parent_outside_the_hierarchy_is_refused_as_config(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="cgroup_parent"):
        launcher(tmp_path, cgroup_parent="../escape")


@pytest.mark.parametrize(
    ("children", "per_child", "most", "weight"),
    [
        (0, 1024, 262_144, 1024),
        (1, 1024, 262_144, 1024),
        (60, 1024, 262_144, 61_440),
        (300, 1024, 262_144, 262_144),
        (3, 100, 10_000, 300),
        (200, 100, 10_000, 10_000),
    ],
)
def test_the_parent_weighs_as_its_notebooks(
    children: int, per_child: int, most: int, weight: int
) -> None:
    assert parent_cpu_weight(children, per_child, most) == weight


def test_balancing_counts_the_notebook_folders_in_each_parent(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    for parent, weight in ((v1, "cpu.shares"), (v2, "cpu.weight")):
        parent.mkdir()
        (parent / weight).write_text("x")
        for n in range(3):
            (parent / f"nb-{n}").mkdir()
    balance_cpu_weight([v1, v2])
    assert (v1 / "cpu.shares").read_text() == "3072"
    assert (v2 / "cpu.weight").read_text() == "300"
