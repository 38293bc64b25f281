"""The device nodes a notebook may open: the basics every program needs, and its own GPUs.

``CUDA_VISIBLE_DEVICES`` only selects GPUs; the nodes of every GPU on a shared host
(``/dev/nvidia0``, ``/dev/nvidia1``, …) stay open to any account, so a notebook that
unsets the variable reaches its neighbour's. A cgroup's device rules close them, as
Slurm's ``ConstrainDevices`` and container runtimes do: everything is denied, then
the nodes below allowed. A GPU's node is ``c 195:<minor>``, and its minor is what the
NVIDIA driver says of it in ``/proc/driver/nvidia/gpus/<bus>/information`` (``GPU
UUID`` and ``Device Minor`` lines), so a GPU named by UUID is found without NVML.
Besides its own GPUs a notebook with any gets ``nvidiactl`` (``c 195:255``) and the
unified-memory nodes (``nvidia-uvm``, ``nvidia-uvm-tools``: one major the driver
takes at load, in ``/proc/devices``).

A container gets the same nodes by path (:func:`device_nodes`) and its runtime writes
the rules. Deciding is pure (:func:`minors_in`, :func:`uvm_major_in`,
:func:`device_rules`); the reads are :func:`gpu_minors` and :func:`gpu_device_rules`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from composespawner.launchers.cgroups import CgroupError

NVIDIA_PROC = Path("/proc/driver/nvidia")
PROC_DEVICES = Path("/proc/devices")
DEV = Path("/dev")
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
# What any program may open, as Docker's and runc's defaults allow (mknod is not among
# them): null, zero, full, random, urandom, tty, the pty multiplexer and the ptys.
BASIC_DEVICES = (
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
)
_FIELD = re.compile(r"^\s*(GPU UUID|Device Minor)\s*:\s*(\S+)\s*$", re.MULTILINE)
log = logging.getLogger(__name__)


class UnknownGpuNode(CgroupError):
    """A notebook's GPU has no device node the host's driver lists; the message says which."""


def minors_in(informations: Iterable[str]) -> dict[str, int]:
    """Each GPU's minor by its UUID (lower case), from the driver's ``information`` files;
    a file lacking either line names no GPU."""
    minors = {}
    for text in informations:
        fields = dict(_FIELD.findall(text))
        uuid, minor = fields.get("GPU UUID"), fields.get("Device Minor")
        if uuid and minor and minor.isdigit():
            minors[uuid.lower()] = int(minor)
    return minors


def uvm_major_in(proc_devices: str) -> int | None:
    """The major of ``nvidia-uvm`` in ``/proc/devices`` (None: the module is not loaded)."""
    for line in proc_devices.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == "nvidia-uvm" and fields[0].isdigit():
            return int(fields[0])
    return None


def device_rules(gpus: Sequence[int], uvm_major: int | None) -> tuple[str, ...]:
    """The ``devices.allow`` rules of a notebook holding the GPUs of minors ``gpus``."""
    if not gpus:
        return BASIC_DEVICES
    own = [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in sorted(set(gpus))]
    uvm = [f"c {uvm_major}:* rwm"] if uvm_major is not None else []
    return (*BASIC_DEVICES, *own, f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rwm", *uvm)


def unfound(uuids: Sequence[str], minors: Mapping[str, int]) -> list[str]:
    """Of ``uuids`` (``GPU-…``, any case), those the driver lists no node for."""
    return [uuid for uuid in uuids if uuid.lower() not in minors]


def gpu_device_rules(
    uuids: Sequence[str], nvidia_proc: Path = NVIDIA_PROC, proc_devices: Path = PROC_DEVICES
) -> tuple[str, ...]:
    """The rules of a notebook holding the GPUs ``uuids`` on this host (see
    :func:`gpu_minors`)."""
    found = gpu_minors(uuids, nvidia_proc)
    if not found:
        return BASIC_DEVICES
    try:
        uvm = uvm_major_in(proc_devices.read_text())
    except OSError:
        uvm = None
    return device_rules(found, uvm)


def device_nodes(gpus: Sequence[int], dev: Path = DEV) -> tuple[str, ...]:
    """The nodes a container holding the GPUs of minors ``gpus`` gets (``--device``):
    its own GPUs', ``nvidiactl`` and the unified-memory nodes that exist here."""
    if not gpus:
        return ()
    own = [str(dev / f"nvidia{minor}") for minor in sorted(set(gpus))]
    shared = [dev / "nvidiactl", dev / "nvidia-uvm", dev / "nvidia-uvm-tools"]
    return (*own, *(str(node) for node in shared if node.exists()))


def gpu_minors(uuids: Sequence[str], nvidia_proc: Path = NVIDIA_PROC) -> list[int]:
    """The device minors of the GPUs ``uuids`` on this host.

    Without the driver loaded (no ``gpus`` folder) the host has no GPU to open: none,
    logged. With it, a GPU it lists no node for (a MIG instance, a UUID the host does
    not have, an index) raises :class:`UnknownGpuNode`: the notebook could not use it,
    and nothing is guessed around.
    """
    if not uuids:
        return []
    informations = []
    for information in sorted((nvidia_proc / "gpus").glob("*/information")):
        try:
            informations.append(information.read_text())
        except OSError as e:
            log.warning("cannot read %s: %s", information, e.strerror)
    minors = minors_in(informations)
    missing = unfound(uuids, minors)
    if missing and (nvidia_proc / "gpus").is_dir():
        raise UnknownGpuNode(
            f"the NVIDIA driver lists no device node for GPUs {', '.join(missing)} under"
            f" {nvidia_proc}: the notebook could not open them (MIG instances are not"
            " supported by this runtime)"
        )
    if missing:
        log.warning(
            "no NVIDIA driver (%s/gpus): GPUs %s get no device node",
            nvidia_proc,
            ", ".join(missing),
        )
    return [minors[uuid.lower()] for uuid in uuids if uuid.lower() in minors]
