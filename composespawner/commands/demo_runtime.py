"""Where the demo's notebooks run: in containers of their own where podman can run them
from the stacks' images, else as local processes, and the demo says which and why.

``make demo`` builds the stacks' CPU images first where it can (``make images``: root,
podman and debootstrap from Debian); what it built is recorded in the cache
(``images.json``), with podman's configuration beside it. ``COMPOSE_RUNTIME`` chooses
outright: ``containers`` (refused, saying why, where they cannot run) or ``processes``.
Deciding is pure (:func:`choose_runtime`); the reads are :func:`demo_runtime`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from composespawner.launchers.stack_images import images_in_record

CACHE = Path.home() / ".cache" / "composespawner"
IMAGES_RECORD = CACHE / "images.json"
# Podman's configuration as make images wrote it: runc, cgroupfs, storage in the cache.
PODMAN_CONFIG = {
    "CONTAINERS_CONF": CACHE / "containers" / "containers.conf",
    "CONTAINERS_STORAGE_CONF": CACHE / "containers" / "storage.conf",
    "CONTAINERS_REGISTRIES_CONF": CACHE / "containers" / "registries.conf",
}
PODMAN_CHECK_TIMEOUT = 30.0  # seconds for `podman info`
RUNTIMES = ("containers", "processes")


class RuntimeRefused(Exception):
    """``COMPOSE_RUNTIME`` asks for what this machine cannot run; the message says why."""


@dataclass(frozen=True)
class Runtime:
    """The demo's runtime: what the hub's config reads, and the sentence the demo says."""

    name: str
    said: str
    env: dict[str, str] = field(default_factory=dict)


def stack_images(record: Mapping[str, object]) -> dict[str, str]:
    """Each stack's CPU image by digest, from ``images.json``."""
    return images_in_record(record, "cpu")


def choose_runtime(
    asked: str, images: Mapping[str, str], podman_problem: str | None, podman_env: Mapping[str, str]
) -> Runtime:
    """The runtime for ``COMPOSE_RUNTIME=asked`` ("" chooses) on a machine with ``images``
    built, where podman runs (``podman_problem`` None) or not (why)."""
    if asked and asked not in RUNTIMES:
        raise RuntimeRefused(f"COMPOSE_RUNTIME is containers or processes, not {asked!r}")
    if asked == "processes":
        return Runtime("processes", "notebooks run as local processes (COMPOSE_RUNTIME=processes)")
    problem = podman_problem or (None if images else "no stack image is built (make images)")
    if problem is not None:
        if asked == "containers":
            raise RuntimeRefused(f"COMPOSE_RUNTIME=containers, but {problem}")
        return Runtime("processes", f"notebooks run as local processes: {problem}")
    stacks = ", ".join(sorted(images))
    return Runtime(
        "containers",
        f"notebooks run in containers of their own (podman), from the images of {stacks}",
        {
            "COMPOSE_STACK_IMAGES": json.dumps(dict(images), sort_keys=True),
            # Read at each start too: a stack whose image is still being built joins then.
            "COMPOSE_STACK_IMAGES_FILE": str(IMAGES_RECORD),
            **podman_env,
        },
    )


def demo_runtime(environ: Mapping[str, str]) -> Runtime:
    """:func:`choose_runtime` for this machine and ``environ``."""
    asked = environ.get("COMPOSE_RUNTIME", "")
    if asked == "processes":
        return choose_runtime(asked, {}, None, {})
    try:
        images = stack_images(json.loads(IMAGES_RECORD.read_text()))
    except (OSError, ValueError):
        images = {}
    podman_env = {k: str(v) for k, v in PODMAN_CONFIG.items() if v.is_file()}
    problem = podman_problem({**environ, **podman_env}) if images else None
    return choose_runtime(asked, images, problem, podman_env)


def podman_problem(env: Mapping[str, str]) -> str | None:
    """Why rootful podman cannot run notebooks here, or None."""
    if os.geteuid() != 0:
        return "the demo is not running as root (notebook containers need rootful podman)"
    podman = shutil.which("podman")
    if podman is None:
        return "podman is not installed (make images installs it)"
    try:
        done = subprocess.run(
            [podman, "info", "--format", "{{.Host.OCIRuntime.Name}}"],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=PODMAN_CHECK_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"podman does not answer ({e})"
    if done.returncode != 0:
        return f"podman does not run here: {done.stderr.strip()[-300:]}"
    return None
