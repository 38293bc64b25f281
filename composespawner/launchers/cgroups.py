"""A local notebook's share of its host, enforced by the kernel: a cgroup of its own.

Several machines share one composed host; each notebook may use its share's
cores (a CFS quota: cores × period) and memory (a limit, and no swap beyond
it where the kernel accounts swap). A notebook that allocates past its
memory is killed by the kernel alone (SIGKILL, 137 in a shell), its
neighbours untouched.

Both layouts are served: the v2 unified hierarchy (``cpu.max``,
``memory.max``, ``memory.swap.max``; controllers enabled top-down in
``cgroup.subtree_control``) and v1 controllers, each on its own mount
(``cpu.cfs_quota_us``, ``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes``). A hybrid host has both; each controller is
taken from whichever hierarchy holds it (the kernel puts a controller on one
only), as ``/proc/self/mounts`` and the v2 root's ``cgroup.controllers`` say.

The cgroup is ``<mount>/<parent>/<user>-<server>-<token>``, from the mount's
root as Docker's cgroupfs driver places ``/docker/<id>``: the random token
keeps two starts (or two hubs on one host) apart, and the paths are in the
server's state, so a restarted hub removes exactly what it made. What to do
is decided by pure functions (:func:`hierarchies_in`, :func:`plan_cgroup`);
the reads and writes are at the edges, each write checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from composespawner.domain.hardware import Share

MOUNTS = Path("/proc/self/mounts")
# What a notebook is held to: its share (cpu, memory), how many processes and threads it
# may have (pids: one notebook must not use up the host's pid_max, and with it every
# neighbour's fork, the agent's and sshd's), and the device nodes it may open (devices:
# only its own GPUs', where the v1 controller is mounted; v2 has no file for it).
CONTROLLERS = ("cpu", "memory", "pids", "devices")
REQUIRED = ("cpu", "memory")  # a host without pids or v1 devices runs notebooks, and says so
CPU_PERIOD_US = 100_000  # the kernel's default CFS period
GIB = 1 << 30
REMOVE_TIMEOUT = 10.0  # seconds for a stopped notebook's leftovers to die
LEAST_PIDS = 64  # processes and threads any notebook may have, whatever its size
PIDS_PER_GIB = 256  # the default of the sites' setting: 2,048 for an 8 GiB notebook
# The notebook's process enters its cgroups itself, then execs the command (see
# join_command). $$ is that process: sh execs, it does not fork.
JOIN_SCRIPT = (
    'while [ "$1" != -- ]; do echo $$ >"$1" || '
    '{ echo "composespawner: cannot enter cgroup $1" >&2; exit 126; }; shift; done; '
    'shift; exec "$@"'
)


class CgroupError(Exception):
    """A cgroup could not be made, joined or removed; the message names the file and why."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """A mounted cgroup hierarchy and which of :data:`CONTROLLERS` it holds."""

    mount: Path
    v2: bool
    controllers: frozenset[str]


@dataclass(frozen=True, slots=True)
class Write:
    """One value for one interface file, written in plan order."""

    path: Path
    value: str
    optional: bool = False  # absent where the kernel does not account it (swap): skipped


@dataclass(frozen=True, slots=True)
class CgroupPlan:
    """A notebook's cgroup in each hierarchy (its directories) and what to write there."""

    cgroups: tuple[Path, ...]
    writes: tuple[Write, ...]

    @property
    def procs(self) -> tuple[Path, ...]:
        """The files the notebook's process writes its pid to, to enter its cgroups."""
        return tuple(cgroup / "cgroup.procs" for cgroup in self.cgroups)


# -- decisions (pure) -------------------------------------------------------------


def cgroup_name(user: str, server: str, token: str) -> str:
    """A cgroup name for one start of ``user``'s ``server``: safe characters, unique.

    Dots are replaced too, so no name is ``..`` or looks like an interface file
    (``cgroup.procs``); the token keeps apart names that replacing made alike.
    """

    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64]

    return f"{safe(user)}-{safe(server or 'default')}-{token}"


def parent_parts(parent: str) -> tuple[str, ...]:
    """The folders of ``cgroup_parent`` below a hierarchy's root; ValueError if it leaves it."""
    parts = tuple(p for p in PurePosixPath(parent).parts if p != "/")
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"{parent!r} is not a folder below the cgroup hierarchy's root")
    return parts


def unescape_mount(field: str) -> str:
    """A path as ``/proc/self/mounts`` writes it: space, tab, newline, backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def hierarchies_in(mounts: str, v2_controllers: Callable[[Path], str]) -> tuple[Hierarchy, ...]:
    """Where each of :data:`CONTROLLERS` is: the first hierarchy that holds it.

    ``mounts`` is ``/proc/self/mounts``; ``v2_controllers`` reads a v2 mount's
    ``cgroup.controllers`` (a v1 mount names its controllers in its options).
    Raises CgroupError naming the controllers no hierarchy holds.
    """
    found: list[Hierarchy] = []
    placed: set[str] = set()
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("cgroup", "cgroup2"):
            continue
        mount, v2 = Path(unescape_mount(fields[1])), fields[2] == "cgroup2"
        names = v2_controllers(mount).split() if v2 else fields[3].split(",")
        held = frozenset(names) & set(CONTROLLERS) - placed  # a second mount: the first's
        if held:
            placed |= held
            found.append(Hierarchy(mount, v2, held))
    missing = [c for c in REQUIRED if c not in placed]
    if missing:
        raise CgroupError(
            f"no mounted cgroup hierarchy holds the {', '.join(missing)} controller"
            f"{'s' if len(missing) > 1 else ''} (see /proc/self/mounts)"
        )
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a notebook's cgroups hold it to."""

    share: Share
    pids: int  # processes and threads together, at most (see pids_limit)
    # The device nodes it may open, as devices.allow rules (see gpu_devices.py); every
    # other node is denied. None: devices are left as the parent has them.
    devices: tuple[str, ...] | None = None


def host_share() -> Share:
    """The whole host as a share, for a notebook composed without one."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Share(cores=os.cpu_count() or 1, memory_gib=max(1, memory // GIB))


def pids_limit(share: Share, per_gib: int) -> int:
    """The processes and threads a notebook of ``share`` may have: ``per_gib`` for each
    GiB of its memory, and never fewer than :data:`LEAST_PIDS` (JupyterLab, a kernel and
    its BLAS threads need some tens). Memory is what the host's room divides, so the
    notebooks on a host together hold no more than ``per_gib`` × its memory: a site sets
    ``per_gib`` (plus :data:`LEAST_PIDS` for each notebook smaller than that) so that
    this stays well under the host's ``kernel.pid_max``."""
    return max(LEAST_PIDS, per_gib * share.memory_gib)


def plan_cgroup(
    hierarchies: Sequence[Hierarchy], parent: Sequence[str], name: str, limits: Limits
) -> CgroupPlan:
    """The cgroups a notebook held to ``limits`` runs in, and the values that hold it."""
    quota = limits.share.cores * CPU_PERIOD_US
    memory = str(limits.share.memory_gib * GIB)
    cgroups: list[Path] = []
    writes: list[Write] = []
    for hierarchy in hierarchies:
        cgroup = hierarchy.mount.joinpath(*parent, name)
        cgroups.append(cgroup)
        has = hierarchy.controllers
        if hierarchy.v2:
            # A controller reaches a cgroup only if every ancestor enables it for its children.
            enable = " ".join(f"+{c}" for c in ("cpu", "memory", "pids") if c in has)
            for depth in range(len(parent) + 1):
                ancestor = hierarchy.mount.joinpath(*parent[:depth])
                writes.append(Write(ancestor / "cgroup.subtree_control", enable))
            if "cpu" in has:
                writes.append(Write(cgroup / "cpu.max", f"{quota} {CPU_PERIOD_US}"))
            if "memory" in has:
                writes.append(Write(cgroup / "memory.max", memory))
                writes.append(Write(cgroup / "memory.swap.max", "0", optional=True))
            if "pids" in has:
                writes.append(Write(cgroup / "pids.max", str(limits.pids)))
            continue
        if "cpu" in has:
            writes.append(Write(cgroup / "cpu.cfs_period_us", str(CPU_PERIOD_US)))
            writes.append(Write(cgroup / "cpu.cfs_quota_us", str(quota)))
        if "memory" in has:
            # memsw (memory + swap) may never be below the memory limit: that goes first.
            writes.append(Write(cgroup / "memory.limit_in_bytes", memory))
            writes.append(Write(cgroup / "memory.memsw.limit_in_bytes", memory, optional=True))
        if "pids" in has:
            writes.append(Write(cgroup / "pids.max", str(limits.pids)))
        if "devices" in has and limits.devices is not None:
            # Everything denied first, then each node allowed: the kernel's own order.
            writes.append(Write(cgroup / "devices.deny", "a"))
            writes.extend(Write(cgroup / "devices.allow", rule) for rule in limits.devices)
    return CgroupPlan(tuple(cgroups), tuple(writes))


def unconfined(hierarchies: Sequence[Hierarchy]) -> list[str]:
    """What a plan on ``hierarchies`` cannot hold a notebook to, in words for the log:
    its processes without a pids controller; its device nodes without the v1 devices
    controller (v2 would need a BPF program, which this does not load)."""
    missing = []
    if not any("pids" in h.controllers for h in hierarchies):
        missing.append("its processes (no pids controller: a fork bomb can fill the host)")
    if not any("devices" in h.controllers and not h.v2 for h in hierarchies):
        missing.append(
            "its device nodes (no v1 devices controller: every GPU's node can be opened;"
            " the container runtime loads a BPF program for that on cgroup v2)"
        )
    return missing


# A cgroup's CPU weight file, what one process weighs there by default, and its most:
# v2's cpu.weight, v1's cpu.shares.
CPU_WEIGHTS = (("cpu.weight", 100, 10_000), ("cpu.shares", 1024, 262_144))


def parent_cpu_weight(children: int, per_child: int, most: int) -> int:
    """The CPU weight of the parent of ``children`` notebook cgroups: theirs together.

    Under contention the kernel shares CPU among a cgroup's children by weight,
    and the parent competes with the hub and everything else beside it as one
    child: at the default weight every notebook together would weigh what one
    process does, and a class starting at once would start at the pace of one
    process. Weighing the parent as its notebooks gives each notebook what it had
    as a plain process; its cap (its share's cores) is the CPU quota, not this.
    """
    return min(max(children, 1) * per_child, most)


def controllers_to_enable(enabled: str, wanted: str) -> str:
    """Of ``wanted`` (``+cpu +memory``), those not in ``enabled`` (a subtree_control's text)."""
    have = set(enabled.split())
    return " ".join(w for w in wanted.split() if w.removeprefix("+") not in have)


def join_command(procs: Sequence[Path], command: Sequence[str]) -> list[str]:
    """``command`` run by a shell that first enters the cgroups (writes its pid to ``procs``).

    Why a wrapper: the process must be in its cgroup before it runs anything,
    or a notebook's first children (and its first allocations) escape it;
    moving it after Popen returns races with them. A ``preexec_fn`` would do it
    before exec, but forces Popen to fork the hub rather than vfork it (see
    :meth:`~composespawner.launchers.local.LocalLauncher.start`). The wrapper
    goes before ``setpriv``: entering a cgroup needs the hub's privileges,
    which setpriv then drops. ``/bin/sh`` is on every host and costs a
    millisecond; a failed entry ends the start with status 126 and says why.
    """
    return ["/bin/sh", "-c", JOIN_SCRIPT, "composespawner-cgroup", *map(str, procs), "--", *command]


# -- the reads and writes (the edges) -----------------------------------------------


def find_hierarchies(mounts: Path = MOUNTS) -> tuple[Hierarchy, ...]:
    """:func:`hierarchies_in` this host's mounts; CgroupError if unreadable or incomplete."""

    def v2_controllers(mount: Path) -> str:
        try:
            return (mount / "cgroup.controllers").read_text()
        except OSError:
            return ""

    try:
        text = mounts.read_text()
    except OSError as e:
        raise CgroupError(f"cannot read {mounts}: {e.strerror}") from e
    return hierarchies_in(text, v2_controllers)


def new_token() -> str:
    return secrets.token_hex(4)


def balance_cpu_weight(parents: Iterable[Path]) -> None:
    """Weigh each parent folder as the notebook cgroups in it now (see parent_cpu_weight).

    Racing starts and stops each count the children again, so the last write
    counts them all. CgroupError if a weight cannot be written.
    """
    for parent in parents:
        for name, per_child, most in CPU_WEIGHTS:
            weight = parent / name
            if not weight.exists():
                continue
            try:
                children = sum(1 for entry in os.scandir(parent) if entry.is_dir())
            except OSError as e:
                raise CgroupError(f"cannot list {parent}: {e.strerror}") from e
            value = str(parent_cpu_weight(children, per_child, most))
            _checked(f"write {value!r} to {weight}", write_value, weight, value)


def write_value(path: Path, value: str) -> None:
    """Write ``value`` to an interface file in one write, checked (the kernel answers it)."""
    data = value.encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"short write of {value!r}")
    finally:
        os.close(fd)


def make_cgroup(plan: CgroupPlan) -> None:
    """Make the plan's cgroups and write its limits; on failure remove what was made."""
    made: list[Path] = []
    try:
        for cgroup in plan.cgroups:
            _checked(f"create {cgroup}", cgroup.mkdir, parents=True)
            made.append(cgroup)
        for write in plan.writes:
            value = _still_to_write(write)
            if value:
                _checked(f"write {value!r} to {write.path}", write_value, write.path, value)
    except CgroupError:
        with contextlib.suppress(CgroupError):
            remove_cgroups(made, REMOVE_TIMEOUT)
        raise


def _still_to_write(write: Write) -> str:
    """What of ``write`` the kernel does not have yet: a controller already enabled is
    not enabled again (a cgroup that holds processes, as a container's root may, refuses
    any change to its subtree_control); an optional file it lacks is skipped."""
    if write.optional and not write.path.exists():
        return ""
    if write.path.name != "cgroup.subtree_control":
        return write.value
    try:
        enabled = write.path.read_text()
    except OSError:
        return write.value  # the write says why
    return controllers_to_enable(enabled, write.value)


def _checked(what: str, action: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    try:
        action(*args, **kwargs)
    except OSError as e:
        raise CgroupError(f"cannot {what}: {e.strerror or e}") from e


def join_then(procs: Sequence[Path], preexec: Callable[[], Any] | None) -> Callable[[], None]:
    """A ``preexec_fn`` that enters the cgroups, then runs ``preexec`` (which may drop root).

    For a start that forks anyway (a preexec_fn of its own, which changes the account).
    """

    def join() -> None:
        pid = str(os.getpid())
        for path in procs:
            write_value(path, pid)
        if preexec is not None:
            preexec()

    return join


def pids_in(cgroup: Path) -> list[int]:
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def remove_cgroups(cgroups: Iterable[Path], within: float) -> None:
    """End every process left in ``cgroups`` and remove them; gone already is done.

    A stopped notebook's kernels may outlive it: they are its, and die with it
    (``cgroup.kill`` where the kernel has it, else SIGKILL to each). Raises
    CgroupError if one is still busy after ``within`` seconds.
    """
    deadline = time.monotonic() + within
    for cgroup in cgroups:
        try:
            _remove(cgroup, deadline)
        except OSError as e:  # a read or a kill refused: said as the others are
            raise CgroupError(f"cannot empty {cgroup}: {e.strerror or e}") from e


def _remove(cgroup: Path, deadline: float) -> None:
    kill = cgroup / "cgroup.kill"
    with contextlib.suppress(FileNotFoundError):
        write_value(kill, "1")
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise CgroupError(f"cannot remove {cgroup}: {e.strerror}") from e
        for pid in pids_in(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise CgroupError(f"cannot remove {cgroup}: processes {pids_in(cgroup)} will not die")
        time.sleep(0.01)  # a killed process leaves its cgroup as it exits: moments
