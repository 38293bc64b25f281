"""Describe the stack this Python runs in: written once, when the stack is built.

Run by each image's Dockerfile and by composespawner's local stack builder,
inside the stack's own Python, so that it reports what is really installed:

    python stack_manifest.py --stack pytorch --variant gpu \\
        --lock requirements.lock --out /opt/stack/manifest.json

Standard library only. Versions come from the installed distributions' metadata;
the framework is imported (once, at build time) only to ask which CUDA it was
built against, which a CPU build answers with null.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

# The distribution that is each framework, in the order a stack is named by it.
FRAMEWORKS = {
    "torch": "torch",
    "tensorflow": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "jax": "jax",
}
# CUDA libraries come as wheels: their versions are the stack's, whatever the host has.
CUDA_LIBRARIES = {
    "cuda_runtime": re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$"),
    "cudnn": re.compile(r"^nvidia-cudnn(-cu\d+)?$"),
    "nccl": re.compile(r"^nvidia-nccl(-cu\d+)?$"),
    "cublas": re.compile(r"^nvidia-cublas(-cu\d+)?$"),
}


def installed() -> dict[str, str]:
    """Every distribution in this environment, by normalised name."""
    found = {}
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        found[name] = dist.version
    return dict(sorted(found.items()))


def framework(packages: dict[str, str]) -> dict[str, Any]:
    for dist, module in FRAMEWORKS.items():
        if dist in packages:
            return {
                "name": dist,
                "version": packages[dist],
                "built_with_cuda": built_with_cuda(module),
            }
    return {"name": None, "version": None, "built_with_cuda": None}


def built_with_cuda(module: str) -> str | None:
    """The CUDA version the framework was compiled for; None for a CPU build."""
    if module == "torch":
        import torch

        return torch.version.cuda
    if module == "tensorflow":
        import tensorflow as tf

        cuda = tf.sysconfig.get_build_info().get("cuda_version")
        return str(cuda) if cuda else None
    return None


def cuda_libraries(packages: dict[str, str]) -> dict[str, str | None]:
    return {
        library: next((v for name, v in packages.items() if pattern.match(name)), None)
        for library, pattern in CUDA_LIBRARIES.items()
    }


def built_at() -> datetime:
    """Now, or SOURCE_DATE_EPOCH where a reproducible build sets it (reproducible-builds.org)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return datetime.fromtimestamp(int(epoch), UTC) if epoch.isdigit() else datetime.now(UTC)


def manifest(stack: str, variant: str, lock: Path) -> dict[str, Any]:
    packages = installed()
    return {
        "stack": stack,
        "variant": variant,
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "framework": framework(packages),
        "cuda": cuda_libraries(packages),
        "packages": packages,
        "built_at": built_at().isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="the stack's id in the catalog")
    parser.add_argument("--variant", required=True, choices=("gpu", "cpu"))
    parser.add_argument("--lock", required=True, type=Path, help="the lock it was built from")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    text = json.dumps(manifest(args.stack, args.variant, args.lock), indent=2) + "\n"
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
