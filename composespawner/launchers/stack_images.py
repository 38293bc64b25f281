"""Which image a stack's notebooks run, by digest: the launchers that run images share it.

A site names the images in its catalog (``image`` and each build's ``digest``), in its
configuration (``stack_images``) or in the record its image builds write
(``stack_images_file``, read at each start: an image built after the hub started is run
without a restart); each stack has a CPU and a GPU image, and ``stack_variant`` says which
this hub's notebooks run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from traitlets import Dict, Enum, Unicode
from traitlets.config import LoggingConfigurable

from composespawner.domain.catalog import Stack
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.containers import image_for


class StackImages(LoggingConfigurable):
    """The stack images knobs, and the image of a stack by them."""

    stack_images = Dict(
        value_trait=Unicode(),
        config=True,
        help="""The image each stack's notebooks run, by stack id, pinned by digest
        (registry/repository@sha256:…). A stack not named here runs the catalog's
        (its image and the build's digest); a stack with neither cannot be chosen.""",
    )
    stack_variant = Enum(
        ("cpu", "gpu"),
        "gpu",
        config=True,
        help="""Which of each stack's images notebooks run: gpu (CUDA's libraries; the
        host's driver comes in through the devices) or cpu (for hosts without GPUs).""",
    )

    stack_images_file = Unicode(
        "",
        config=True,
        help="""A record of built images (``make images``' images.json: each entry's
        stack, variant and image by digest), read at each start; what it names comes
        after stack_images. Empty: none.""",
    )

    def image_of(self, stack: Stack) -> str | None:
        """The image ``stack``'s notebooks run, by digest; None where none is."""
        build = stack.cpu if self.stack_variant == "cpu" else stack.gpu
        catalog = f"{stack.image}@{build.digest}" if stack.image and build and build.digest else ""
        return image_for({**self._recorded(), **self.stack_images}, stack.id, catalog)

    # The record as last read: (path, mtime_ns, size) and its images. A start asks three
    # times (its checks, its time, its launch), a storm many: a stat, not a parse, each.
    _record_seen: tuple[tuple[str, int, int], dict[str, str]] | None = None

    def _recorded(self) -> dict[str, str]:
        if not self.stack_images_file:
            return {}
        try:
            with open(self.stack_images_file) as file:
                found = os.fstat(file.fileno())
                seen = (self.stack_images_file, found.st_mtime_ns, found.st_size)
                if self._record_seen is not None and self._record_seen[0] == seen:
                    return self._record_seen[1]
                images = images_in_record(json.load(file), self.stack_variant)
        except (OSError, ValueError) as e:
            self.log.warning("cannot read the images' record %s: %s", self.stack_images_file, e)
            return {}
        self._record_seen = (seen, images)
        return images

    def check_image(self, stack: Stack) -> str:
        """``stack``'s image; refused (503) where it has none by digest."""
        image = self.image_of(stack)
        if image is not None:
            return image
        self.log.error(
            "stack %s has no %s image by digest: set c.%s.stack_images[%r] or its digest"
            " in the catalog",
            stack.id,
            self.stack_variant,
            type(self).__name__,
            stack.id,
        )
        raise SpawnRefused(
            f"The {stack.label} stack cannot run on this hub yet: its image has not"
            " been published. Choose another stack, or ask the hub's administrators.",
            reason="stack",
            status_code=503,
        )

    def stack_lock_env(self, stack: Stack | None, image: str | None) -> dict[str, str]:
        """What the notebook is told of its stack's image: the image and the lock's hash."""
        env: dict[str, str] = {}
        if image is not None:
            env["COMPOSE_STACK_IMAGE"] = image
        build = None if stack is None else (stack.cpu if self.stack_variant == "cpu" else stack.gpu)
        if build is not None:
            env["COMPOSE_STACK_LOCK_SHA256"] = build.lock_sha256
        return env


def images_in_record(record: Mapping[str, object], variant: str) -> dict[str, str]:
    """Each stack's ``variant`` image by digest, from a record of built images
    (``{name: {"stack", "variant", "image"}}``); entries that are not such are skipped."""
    found = {}
    for entry in record.values():
        if not isinstance(entry, dict) or entry.get("variant") != variant:
            continue
        stack, image = entry.get("stack"), entry.get("image")
        if isinstance(stack, str) and isinstance(image, str) and "@sha256:" in image:
            found[stack] = image
    return found
