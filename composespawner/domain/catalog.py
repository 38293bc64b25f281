"""What the spawn form may offer, read from a TOML file in ``hub_config/``.

The catalog knows hardware models and choices, never users: deciding what a
given user may see is the job of :func:`Catalog.visible_gpu_models` callers,
which pass in the groups that own co-located hardware.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    id: str
    label: str
    fabric_models: frozenset[str]  # Processor.Model strings this choice accepts
    description: str = ""
    # Share sizes it is offered in besides whole GPUs (4: a quarter of one GPU,
    # time-sliced), ascending; () for a model the site keeps whole.
    shares: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NetworkChoice:
    id: str
    label: str
    speed_gbps: int  # 0: no dedicated card
    description: str = ""


@dataclass(frozen=True, slots=True)
class Size:
    """A share of a host's CPU cores and memory a server may ask for (``"size"``).

    ``whole_host``: the host's every core and all its memory, whatever they are;
    such a machine shares its host with nobody.
    """

    id: str
    label: str
    cores: int = 0
    memory_gib: int = 0
    whole_host: bool = False
    description: str = ""


# What a catalog that lists no sizes offers: every machine has its host to itself.
WHOLE_HOST = Size(id="whole", label="Whole host", whole_host=True)
# The most devices one host takes where neither the fabric nor the catalog says.
DEFAULT_MAX_DEVICES = 16
# The share sizes a GPU model may be offered in: time-slicing past 16 holders
# leaves each too little of the GPU to be worth a server.
SHARE_SIZES = range(2, 17)


@dataclass(frozen=True, slots=True)
class ColocatedChassis:
    chassis: str
    owner_group: str


@dataclass(frozen=True, slots=True)
class StackBuild:
    """One of a stack's two builds: from its GPU lock or its CPU lock."""

    lock: Path  # the hashed lock file
    lock_sha256: str  # what the lock must hash to: the stack's identity
    digest: str = ""  # the built image's digest ("sha256:..."); empty until one is pushed


@dataclass(frozen=True, slots=True)
class Stack:
    """A software stack: a pinned environment a notebook runs in (``images/<id>``).

    ``env`` is what the stack needs set for reproducible runs (seeds of hashing,
    deterministic kernels, fixed thread counts): the spawner injects it.
    """

    id: str
    label: str
    description: str = ""
    image: str = ""  # the image repository; its builds are pinned by digest
    gpu: StackBuild | None = None
    cpu: StackBuild | None = None
    env: tuple[tuple[str, str], ...] = ()
    common: Path | None = None  # what every stack gets (repro.py, stack_manifest.py)


@dataclass(frozen=True, slots=True)
class Kit:
    """A starter kit (``images/kits/<id>``): a notebook and its data, on one stack."""

    id: str
    label: str
    stack: str  # the Stack.id its notebook runs on
    folder: Path  # what is merged into ~/starter-kits/<id>/
    notebook: str  # the notebook in it to open
    module: str  # the module in it with the kit's data and score(predict, secret)
    description: str = ""


@dataclass(frozen=True, slots=True)
class Catalog:
    gpu_models: tuple[GpuModel, ...]
    networks: tuple[NetworkChoice, ...]
    scratch_gb: tuple[int, ...]
    max_gpus_per_machine: int
    colocated: tuple[ColocatedChassis, ...] = ()
    stacks: tuple[Stack, ...] = ()
    kits: tuple[Kit, ...] = ()
    sizes: tuple[Size, ...] = (WHOLE_HOST,)
    # GPU count → the size a request of that many GPUs gets when it names none:
    # the entry with the largest count not above the request's.
    default_sizes: tuple[tuple[int, str], ...] = ()
    # The most devices (GPUs, NICs, drives) one host takes, where the fabric does not say.
    max_devices_per_host: int = DEFAULT_MAX_DEVICES

    def gpu_model(self, model_id: str) -> GpuModel | None:
        return next((m for m in self.gpu_models if m.id == model_id), None)

    def network(self, network_id: str) -> NetworkChoice | None:
        return next((n for n in self.networks if n.id == network_id), None)

    def owner_of_chassis(self, chassis: str) -> str | None:
        return next((c.owner_group for c in self.colocated if c.chassis == chassis), None)

    def stack(self, stack_id: str) -> Stack | None:
        return next((s for s in self.stacks if s.id == stack_id), None)

    def kit(self, kit_id: str) -> Kit | None:
        return next((k for k in self.kits if k.id == kit_id), None)

    def size(self, size_id: str) -> Size | None:
        return next((s for s in self.sizes if s.id == size_id), None)

    def default_size(self, gpu_count: int) -> Size:
        """The size a request of ``gpu_count`` GPUs gets when it names none."""
        below = [(count, size) for count, size in self.default_sizes if count <= gpu_count]
        chosen = self.size(max(below)[1]) if below else None
        return chosen or self.sizes[0]

    @property
    def default_stack(self) -> Stack | None:
        """What a request that names no stack runs on: the first listed."""
        return self.stacks[0] if self.stacks else None

    @classmethod
    def from_file(cls, path: str | Path) -> Catalog:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
            return cls.from_dict(raw, relative_to=path.resolve().parent)
        except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
            raise CatalogError(f"{path}: {e}") from e

    @classmethod
    def from_dict(cls, raw: dict[str, Any], relative_to: Path = Path()) -> Catalog:
        """``relative_to``: the folder stack locks are named relative to (the file's)."""
        catalog = cls(
            gpu_models=tuple(_gpu_model(m) for m in raw["gpu_models"]),
            networks=tuple(
                NetworkChoice(
                    id=str(n["id"]),
                    label=str(n["label"]),
                    speed_gbps=int(n["speed_gbps"]),
                    description=str(n.get("description", "")),
                )
                for n in raw["networks"]
            ),
            scratch_gb=tuple(int(s) for s in raw.get("storage", {}).get("scratch_gb", [0])),
            max_gpus_per_machine=int(raw["max_gpus_per_machine"]),
            colocated=tuple(
                ColocatedChassis(chassis=str(c["chassis"]), owner_group=str(c["owner_group"]))
                for c in raw.get("colocated", [])
            ),
            stacks=tuple(_stack(s, raw, relative_to) for s in raw.get("stacks", [])),
            kits=tuple(_kit(k, relative_to) for k in raw.get("kits", [])),
            sizes=tuple(_size(s) for s in raw.get("sizes", [])) or (WHOLE_HOST,),
            default_sizes=tuple(
                sorted(
                    (int(count), str(size)) for count, size in raw.get("default_size", {}).items()
                )
            ),
            max_devices_per_host=int(raw.get("hosts", {}).get("max_devices", DEFAULT_MAX_DEVICES)),
        )
        _check(catalog)
        return catalog


def _gpu_model(raw: dict[str, Any]) -> GpuModel:
    model_id = str(raw["id"])
    return GpuModel(
        id=model_id,
        label=str(raw["label"]),
        fabric_models=frozenset(str(f) for f in raw["fabric_models"]),
        description=str(raw.get("description", "")),
        shares=_shares(model_id, raw.get("shares", [])),
    )


def _shares(model_id: str, raw: Any) -> tuple[int, ...]:
    """A model's share sizes: whole numbers from 2 to 16, each once."""
    sizes = raw if isinstance(raw, list) else [None]
    if any(isinstance(n, bool) or not isinstance(n, int) or n not in SHARE_SIZES for n in sizes):
        raise ValueError(
            f"gpu model {model_id!r}: shares must list whole numbers from {SHARE_SIZES[0]}"
            f" to {SHARE_SIZES[-1]} (4: a quarter of one GPU), such as [2, 4]; got {raw!r}"
        )
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"gpu model {model_id!r}: shares lists a size twice: {raw!r}")
    return tuple(sorted(sizes))


def _stack(raw: dict[str, Any], catalog: dict[str, Any], relative_to: Path) -> Stack:
    if "stack_common" not in catalog:
        raise ValueError("stacks need stack_common: the folder of what every stack gets")

    def build(variant: str) -> StackBuild | None:
        entry = raw.get(variant)
        if entry is None:
            return None
        sha256 = str(entry["lock_sha256"])
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"stack {raw['id']!r}: {variant}.lock_sha256 is not a SHA-256")
        return StackBuild(
            lock=(relative_to / str(entry["lock"])).resolve(),
            lock_sha256=sha256,
            digest=str(entry.get("digest", "")),
        )

    return Stack(
        id=str(raw["id"]),
        label=str(raw["label"]),
        description=str(raw.get("description", "")),
        image=str(raw.get("image", "")),
        gpu=build("gpu"),
        cpu=build("cpu"),
        env=tuple((str(k), str(v)) for k, v in raw.get("env", {}).items()),
        common=(relative_to / str(catalog["stack_common"])).resolve(),
    )


def _size(raw: dict[str, Any]) -> Size:
    whole = raw.get("whole_host", False)
    if not isinstance(whole, bool):
        raise ValueError(f"size {raw.get('id')!r}: whole_host is true or false")
    size = Size(
        id=str(raw["id"]),
        label=str(raw["label"]),
        cores=0 if whole else int(raw["cores"]),
        memory_gib=0 if whole else int(raw["memory_gib"]),
        whole_host=whole,
        description=str(raw.get("description", "")),
    )
    if not whole and (size.cores < 1 or size.memory_gib < 1):
        raise ValueError(f"size {size.id!r}: cores and memory_gib must be at least 1")
    return size


def _kit(raw: dict[str, Any], relative_to: Path) -> Kit:
    kit = Kit(
        id=str(raw["id"]),
        label=str(raw["label"]),
        stack=str(raw["stack"]),
        folder=(relative_to / str(raw["folder"])).resolve(),
        notebook=str(raw["notebook"]),
        module=str(raw["module"]),
        description=str(raw.get("description", "")),
    )
    for name in (kit.notebook, f"{kit.module}.py"):
        if not (kit.folder / name).is_file():
            raise ValueError(f"kit {kit.id!r}: no {name!r} in {kit.folder}")
    return kit


def _check(catalog: Catalog) -> None:
    for kind, ids in (
        ("gpu_models", [m.id for m in catalog.gpu_models]),
        ("networks", [n.id for n in catalog.networks]),
        ("stacks", [s.id for s in catalog.stacks]),
        ("kits", [k.id for k in catalog.kits]),
        ("sizes", [s.id for s in catalog.sizes]),
    ):
        duplicates = {i for i in ids if ids.count(i) > 1}
        if duplicates:
            raise ValueError(f"duplicate {kind} ids: {sorted(duplicates)}")
    if not catalog.gpu_models:
        raise ValueError("gpu_models is empty: there is nothing to offer")
    for kit in catalog.kits:
        if catalog.stack(kit.stack) is None:
            raise ValueError(f"kit {kit.id!r} runs on stack {kit.stack!r}, which is not listed")
    if not catalog.networks:
        raise ValueError("networks is empty: offer at least the host network (speed_gbps = 0)")
    if catalog.max_gpus_per_machine < 1:
        raise ValueError("max_gpus_per_machine must be at least 1")
    for count, size in catalog.default_sizes:
        if count < 0 or catalog.size(size) is None:
            raise ValueError(f"default_size: {count} GPUs -> {size!r}, which is not a listed size")
    if catalog.max_devices_per_host < 1:
        raise ValueError("hosts.max_devices must be at least 1")
    if any(s < 0 for s in catalog.scratch_gb) or not catalog.scratch_gb:
        raise ValueError("storage.scratch_gb must list sizes >= 0")
