"""Reproducible runs in a notebook: seed everything, go deterministic, keep a record.

Importable in every composespawner stack (``import repro``)::

    import repro
    repro.seed_everything(42)          # Python, NumPy and whichever framework is here
    repro.deterministic()              # each framework's deterministic kernels
    ...
    record = repro.record(seed=42, data_order=order, weights=model, metric=0.97)
    record.save("run.json")
    print(repro.compare(repro.load("run.json"), repro.load("other-run.json")))

A record holds what decides a result: the seed, the versions of Python and of
every framework, the device (GPU model and driver through NVML when there is
one), a hash of the order the data was seen in, a hash of the final weights and
the metric. :func:`compare` names what differs between two records, so a
changed result points at its cause: another version, device or data order.

Standard library only; frameworks are used when they are importable.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import platform
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

FRAMEWORKS = ("numpy", "torch", "tensorflow", "tensorflow-cpu", "keras", "jax", "jaxlib")
MANIFEST_ENV = "COMPOSE_RUN_MANIFEST"  # the server's run manifest, set by the spawner


def _loaded(module: str) -> Any:
    """The framework, if this stack has it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def seed_everything(seed: int) -> int:
    """Seed Python, NumPy and every framework installed here; returns the seed."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer from 0 to 2**32-1, not {seed!r}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for processes started from here
    if (np := _loaded("numpy")) is not None:
        np.random.seed(seed)
    if (torch := _loaded("torch")) is not None:
        torch.manual_seed(seed)  # every device, CUDA included
    if (tf := _loaded("tensorflow")) is not None:
        tf.keras.utils.set_random_seed(seed)
    return seed


def deterministic(on: bool = True) -> None:
    """Switch each installed framework to deterministic kernels (slower on GPUs).

    PyTorch raises at the first operation that has no deterministic kernel,
    which names it; TensorFlow does the same.
    """
    if (torch := _loaded("torch")) is not None:
        if on:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(on)
        torch.backends.cudnn.deterministic = on
        torch.backends.cudnn.benchmark = not on
    if (tf := _loaded("tensorflow")) is not None:
        if on:
            tf.config.experimental.enable_op_determinism()
        else:
            tf.config.experimental.disable_op_determinism()


def order_hash(order: Iterable[Any]) -> str:
    """A hash of the order data was seen in (indices, ids or file names)."""
    digest = hashlib.sha256()
    for item in order:
        digest.update(repr(_plain(item)).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _plain(item: Any) -> Any:
    return item.item() if hasattr(item, "item") and callable(item.item) else item


def weights_hash(weights: Any) -> str:
    """SHA-256 of a model's parameters: a PyTorch module or state dict, a Keras
    model, or a sequence of arrays. Equal weights give equal hashes, bit for bit."""
    digest = hashlib.sha256()
    for name, array in _arrays(weights):
        digest.update(name.encode())
        digest.update(str(array.dtype).encode() + str(tuple(array.shape)).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _arrays(weights: Any) -> list[tuple[str, Any]]:
    if hasattr(weights, "state_dict"):  # a torch.nn.Module
        weights = weights.state_dict()
    if hasattr(weights, "get_weights"):  # a Keras model
        weights = weights.get_weights()
    if isinstance(weights, dict):
        items = list(weights.items())
    else:
        items = [(str(i), w) for i, w in enumerate(weights)]
    arrays = []
    for name, value in items:
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().contiguous().numpy()
        elif hasattr(value, "numpy"):  # a TensorFlow variable
            value = value.numpy()
        arrays.append((str(name), value))
    return arrays


def device() -> dict[str, Any]:
    """The accelerator this kernel computes on: GPU models and driver through NVML."""
    info: dict[str, Any] = {"kind": "cpu", "cpu": platform.processor() or platform.machine()}
    try:
        import pynvml
    except ImportError:
        return info
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return info  # the library is here, no GPU or driver is
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = [
            _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(count)
        ]
        info = {"kind": "gpu", "gpus": names, "driver": _text(pynvml.nvmlSystemGetDriverVersion())}
    finally:
        pynvml.nvmlShutdown()
    return info


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in FRAMEWORKS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[dist] = metadata.version(dist)
    return found


@dataclass
class Record:
    """What decides an experiment's result, and the result."""

    seed: int | None
    versions: dict[str, str]
    device: dict[str, Any]
    data_order: str | None
    weights: str | None
    metric: float | None
    stack: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path


def record(
    *,
    seed: int | None,
    data_order: Iterable[Any] | str | None = None,
    weights: Any = None,
    metric: float | None = None,
    **notes: Any,
) -> Record:
    """Describe this run. ``data_order`` may be the order itself or its order_hash."""
    if data_order is not None and not isinstance(data_order, str):
        data_order = order_hash(data_order)
    return Record(
        seed=seed,
        versions=versions(),
        device=device(),
        data_order=data_order,
        weights=None if weights is None else weights_hash(weights),
        metric=None if metric is None else float(metric),
        stack=_stack(),
        notes=notes,
    )


def _stack() -> dict[str, Any]:
    """The stack and machine from the server's run manifest, when there is one."""
    path = os.environ.get(MANIFEST_ENV)
    if not path:
        return {}
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    stack = manifest.get("stack", {})
    return {k: stack.get(k) for k in ("id", "lock_sha256", "image_digest")}


def load(path: str | Path) -> Record:
    raw = json.loads(Path(path).read_text())
    return Record(**raw)


def compare(a: Record, b: Record, metric_tolerance: float = 0.0) -> list[str]:
    """What differs between two records, causes first; empty when they agree.

    The metric counts as the same within ``metric_tolerance`` (absolute).
    """
    differences = []
    for name in sorted(set(a.versions) | set(b.versions)):
        left, right = a.versions.get(name), b.versions.get(name)
        if left != right:
            differences.append(f"version of {name}: {left or 'absent'} vs {right or 'absent'}")
    if a.device != b.device:
        differences.append(f"device: {_device(a.device)} vs {_device(b.device)}")
    if a.stack != b.stack:
        differences.append(f"stack: {a.stack or 'unknown'} vs {b.stack or 'unknown'}")
    if a.seed != b.seed:
        differences.append(f"seed: {a.seed} vs {b.seed}")
    if a.data_order != b.data_order:
        differences.append("data order: the data was seen in another order")
    if a.weights != b.weights:
        differences.append(f"final weights: {_short(a.weights)} vs {_short(b.weights)}")
    if not _close(a.metric, b.metric, metric_tolerance):
        differences.append(f"metric: {a.metric} vs {b.metric}")
    return differences


def _device(info: dict[str, Any]) -> str:
    if info.get("kind") == "gpu":
        return f"{', '.join(info.get('gpus', []))} (driver {info.get('driver')})"
    return f"CPU {info.get('cpu', '')}".strip()


def _short(digest: str | None) -> str:
    return "none" if digest is None else digest[:12]


def _close(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tolerance
