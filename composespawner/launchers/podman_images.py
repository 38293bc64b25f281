"""This host's podman, as the container launcher uses it: the service it asks, and each
stack's image pulled there once.

A stack's image is pulled by digest the first time a notebook on this host runs it,
once however many start together, and kept. Which podman service: the site's
(``podman_service``), or the hub's own (:class:`~.podman_api.OwnPodmanService`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import ClassVar

from traitlets import Float, Unicode

from composespawner.domain.catalog import Stack
from composespawner.launchers.podman_api import OwnPodmanService, PodmanAPI
from composespawner.launchers.stack_images import StackImages

PULL_TIMEOUT = 1800.0  # seconds a first pull of a stack's image may take (gigabytes)
OWN_SERVICE = "/run/composespawner-podman/hub-{pid}.sock"  # the hub's own podman service


class PodmanImages(StackImages):
    """The podman service notebooks' containers are asked of, and the images there."""

    podman = Unicode(
        "podman",
        config=True,
        help="""The podman command, for the hub's own podman service where podman_service
        is empty (rootful: the hub runs as root). Its configuration is the host's: runc
        as the runtime, and the registry the images come from.""",
    )
    podman_service = Unicode(
        "",
        config=True,
        help="""The Unix socket of the podman service (podman's API) that runs notebooks'
        containers: /run/podman/podman.sock where the host runs podman.socket. Empty:
        the hub runs its own (podman system service), on a socket only root opens, and
        it ends with the hub; the containers go on.""",
    )
    image_pull_timeout = Float(
        PULL_TIMEOUT,
        config=True,
        help="""Seconds the first pull of a stack's image on this host may take, on top
        of start_timeout for the start that pulls it. After it, the image is kept.""",
    )

    # Pulls under way or done, by image: one pull per image on this host.
    _pulls: ClassVar[dict[str, asyncio.Future[None]]] = {}

    async def podman_api(self) -> PodmanAPI:
        """Podman's API: the site's service, or the hub's own, started if need be."""
        if self.podman_service:
            return PodmanAPI(self.podman_service)
        socket = OWN_SERVICE.format(pid=os.getpid())
        await OwnPodmanService.ensure(self.podman, socket, self.log)
        return PodmanAPI(socket)

    def check_stack(self, stack: Stack) -> None:
        self.check_image(stack)

    def extra_start_time(self, stack: Stack | None) -> float:
        image = None if stack is None else self.image_of(stack)
        pulled = image is not None and image in self._pulls and self._pulls[image].done()
        return 0.0 if image is None or pulled else self.image_pull_timeout

    async def pull_once(
        self, image: str, stack: Stack, progress: Callable[[str, int], None]
    ) -> None:
        """``image`` on this host: there already, or pulled now (one pull for every start
        that asks meanwhile; a failed one is tried again by the next start)."""
        pull = self._pulls.get(image)
        if pull is None or (pull.done() and pull.exception() is not None):
            pull = self._pulls[image] = asyncio.ensure_future(self._pull(image, stack, progress))
        await asyncio.shield(pull)

    async def _pull(self, image: str, stack: Stack, progress: Callable[[str, int], None]) -> None:
        api = await self.podman_api()
        if await api.image_exists(image):
            return
        progress(f"fetching the {stack.label} image (first use on this host)", 30)
        await api.pull(image, self.image_pull_timeout)
