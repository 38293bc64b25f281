"""The run manifest: what a server ran on, written when it starts, to run it again.

Every server gets one: its stack (id, lock hash, image digest), the composed
machine (host, each GPU's model and id), the environment composespawner gave
the notebook and when it started. The notebook finds it read-only at
``~/.composespawner/<server>.run.json`` (``$COMPOSE_RUN_MANIFEST``); the hub
keeps it in the server's state and the ledger beside the machine, where the
portal shows it. From any manifest, :func:`relaunch_options` gives the
options of a start on the same stack and GPU model — or says why that can no
longer be had.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from composespawner.domain.catalog import Catalog, Stack
from composespawner.domain.machine import ComposedMachine

VERSION = 1


def run_manifest(
    *,
    user: str,
    server: str,
    options: Mapping[str, Any],
    stack: Stack | None,
    variant: str,
    machine: ComposedMachine,
    environment: Mapping[str, str],
    started_at: datetime,
    image: str | None = None,
) -> dict[str, Any]:
    """The manifest of a server starting now (``variant``: the stack's build it runs;
    ``image``: the image it runs, by digest, where the launcher says)."""
    build = None if stack is None else (stack.cpu if variant == "cpu" else stack.gpu)
    repository, _, digest = (image or "").partition("@")
    return {
        "version": VERSION,
        "user": user,
        "server": server,
        "started_at": started_at.isoformat(timespec="seconds"),
        "options": dict(options),
        "stack": None
        if stack is None
        else {
            "id": stack.id,
            "label": stack.label,
            "variant": variant,
            "lock_sha256": build.lock_sha256 if build else None,
            "image": repository or stack.image or None,
            "image_digest": digest or ((build.digest or None) if build else None),
        },
        "machine": {
            "id": machine.machine_id,
            "host": machine.host,
            "zone": machine.zone,
            "gpus": [{"id": d.block_id, "model": d.model} for d in machine.gpus],
            "nic": None if machine.nic is None else machine.nic.model,
            "scratch_gb": sum(d.capacity_gb or 0 for d in machine.drives),
        },
        "environment": dict(sorted(environment.items())),
    }


class NotRelaunchable(ValueError):
    """The manifest's stack or GPU model cannot be had again; the message says why."""


def relaunch_options(manifest: Mapping[str, Any], catalog: Catalog) -> dict[str, Any]:
    """Options that start a server like the manifest's: same stack lock and GPU model.

    Refused when the catalog no longer pins that stack by the same lock (and
    image digest, where both name one): another lock is another stack.
    """
    if manifest.get("version") != VERSION:
        raise NotRelaunchable("This is not a run manifest this hub can read.")
    options = dict(manifest.get("options") or {})
    recorded = manifest.get("stack")
    if recorded:
        stack = catalog.stack(str(recorded.get("id")))
        variant = recorded.get("variant")
        build = None if stack is None else (stack.cpu if variant == "cpu" else stack.gpu)
        if stack is None or build is None:
            raise NotRelaunchable(
                f"The stack {recorded.get('label') or recorded.get('id')!r} is no longer offered,"
                " so this run cannot be repeated identically."
            )
        if build.lock_sha256 != recorded.get("lock_sha256") or (
            # Where the catalog pins no digest (a site names its images elsewhere),
            # the lock is what says the stack is the same.
            recorded.get("image_digest")
            and build.digest
            and build.digest != recorded["image_digest"]
        ):
            raise NotRelaunchable(
                f"The {stack.label} stack has changed since this run (its lock is now"
                f" {build.lock_sha256[:12]}…, the run's was"
                f" {str(recorded.get('lock_sha256'))[:12]}…): start a new server on it instead."
            )
        options["stack"] = stack.id
    return options  # the GPU model and count the run was started with
