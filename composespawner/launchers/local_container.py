"""The container launcher: each notebook in a podman container from its stack's image.

Everything the local launcher does stays (the port on the host's loopback, the home
and the run manifest in it, the kit merged as the notebook's account, the exit seen
at once through the process's pidfd, the state a restarted hub finds its notebooks
by); what runs is ``podman run`` attached, so that podman's own process is the
notebook's, and the notebook is in a container of its own (:mod:`.containers` says
what it is held to and cannot reach). Podman, not the launcher, makes its cgroups.

A stack's image is pulled by digest the first time a notebook on this host runs it,
once however many start together, and kept. A site names the images in its catalog
(``image`` and each build's ``digest``) or here (:attr:`PodmanLauncher.stack_images`).
Podman's own configuration is the host's (``/etc/containers``, or ``CONTAINERS_CONF``
and ``CONTAINERS_STORAGE_CONF`` in the hub's environment): runc, and a registry it
may pull from.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import secrets
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from subprocess import Popen
from typing import Any, ClassVar

from traitlets import Enum, Float, Unicode

from composespawner.domain.catalog import Stack
from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.cgroups import host_share, pids_limit
from composespawner.launchers.containers import (
    ISOLATED_NETWORK,
    STOP_SECONDS,
    ContainerSpec,
    cdi_devices,
    container_name,
    forwarded_names,
    image_command,
    notebook_listens_everywhere,
    run_arguments,
)
from composespawner.launchers.gpu_devices import UnknownGpuNode, device_nodes, gpu_minors
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.relay import HubRelays
from composespawner.launchers.relayed import hub_addresses, inside_command
from composespawner.launchers.stack_images import StackImages

PULL_TIMEOUT = 1800.0  # seconds a first pull of a stack's image may take (gigabytes)
PODMAN_TIMEOUT = 60.0  # seconds for podman's other calls (exists, stop, rm)


class PodmanError(Exception):
    """A podman call failed or timed out; the message says which and why."""


async def run_podman(podman: str, args: Sequence[str], within: float) -> str:
    """``podman args``' output; :class:`PodmanError` when it fails or takes too long."""
    process = await asyncio.create_subprocess_exec(
        podman,
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), within)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise PodmanError(f"podman {args[0]} took more than {within:.0f} s") from None
    if process.returncode != 0:
        said = err.decode(errors="replace").strip()[-500:]
        raise PodmanError(f"podman {' '.join(args[:2])} failed ({process.returncode}): {said}")
    return out.decode(errors="replace")


class PodmanLauncher(StackImages, LocalLauncher):
    """Run each notebook in a container of its own, from its stack's image by digest."""

    podman = Unicode(
        "podman",
        config=True,
        help="""The podman command (rootful: the hub runs as root). Its configuration is
        the host's: runc as the runtime, and the registry the images come from.""",
    )
    image_pull_timeout = Float(
        PULL_TIMEOUT,
        config=True,
        help="""Seconds the first pull of a stack's image on this host may take, on top
        of start_timeout for the start that pulls it. After it, the image is kept.""",
    )
    container_network = Unicode(
        ISOLATED_NETWORK,
        config=True,
        help="""Podman's --network for notebooks. The default gives each notebook a
        network of its own that reaches neither its neighbours nor the host's loopback
        services; the hub's proxy reaches it at its port, published on the hub's
        loopback.""",
    )
    gpu_devices = Enum(
        ("nodes", "cdi"),
        "nodes",
        config=True,
        help="""How a notebook gets its GPUs: nodes (/dev/nvidiaN of its own GPUs, found
        from their UUIDs as the driver lists them, with nvidiactl and nvidia-uvm), or
        cdi (nvidia.com/gpu=<UUID>, where NVIDIA's CDI spec is generated with
        --device-name-strategy=uuid: it brings the driver's libraries too).""",
    )

    relay_dir = Unicode(
        "/run/composespawner-relay",
        config=True,
        help="""Where the hub serves its API and the GPU portal to notebooks' containers,
        a Unix socket for each (mounted read-only into every container): their own
        network does not reach the host's loopback, where those listen.""",
    )
    device_dir = Unicode(
        "/dev",
        config=True,
        help="""Where the GPUs' device nodes are (nvidiaN, nvidiactl, nvidia-uvm), with
        gpu_devices = "nodes". Change it only where they are made elsewhere.""",
    )

    # Pulls under way or done, by image: one pull per image on this host.
    _pulls: ClassVar[dict[str, asyncio.Future[None]]] = {}
    _container: str = ""  # the container's name, until it is removed
    _container_removal: asyncio.Future[None] | None = None

    # -- the stack's image -----------------------------------------------------

    def check_stack(self, stack: Stack) -> None:
        self.check_image(stack)

    def extra_start_time(self, stack: Stack | None) -> float:
        image = None if stack is None else self.image_of(stack)
        pulled = image is not None and image in self._pulls and self._pulls[image].done()
        return 0.0 if image is None or pulled else self.image_pull_timeout

    async def prepare_launch(self) -> None:
        self.run_image = self._run_manifest = self._manifest_file = None
        if self.stack is None:
            return
        self.run_image = self.check_image(self.stack)
        try:
            await asyncio.shield(self._pull_once(self.run_image, self.stack))
        except PodmanError as e:
            self.log.error("%s: cannot pull %s: %s", log_name(self), self.run_image, e)
            raise SpawnRefused(
                f"The {self.stack.label} stack's image could not be fetched to this host."
                " Try again in a few minutes; if it keeps failing, tell the hub's"
                " administrators.",
                reason="stack",
                status_code=503,
            ) from e

    def _pull_once(self, image: str, stack: Stack) -> asyncio.Future[None]:
        pull = self._pulls.get(image)
        if pull is None or (pull.done() and pull.exception() is not None):
            pull = self._pulls[image] = asyncio.ensure_future(self._pull(image, stack))
        return pull

    async def _pull(self, image: str, stack: Stack) -> None:
        with contextlib.suppress(PodmanError):
            await run_podman(self.podman, ("image", "exists", image), PODMAN_TIMEOUT)
            return
        self.launch_progress(f"fetching the {stack.label} image (first use on this host)", 30)
        await run_podman(self.podman, ("pull", "--quiet", image), self.image_pull_timeout)

    def launcher_env(self) -> dict[str, str]:
        return {**super().launcher_env(), **self.stack_lock_env(self.stack, self.run_image)}

    # -- the container ---------------------------------------------------------

    def notebook_process(
        self, command: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """``podman run`` of the notebook's container; podman's environment: the hub's
        (podman's own configuration) and the notebook's, of which the container gets
        only the notebook's names."""
        if self.run_image is None:
            raise SpawnRefused(
                "Choose a stack for your server: on this hub every notebook runs in one.",
                reason="stack",
                status_code=400,
            )
        uid = self.notebook_uid()
        if uid is None or uid == 0:
            raise SpawnRefused(
                "Your account cannot run a notebook on this hub. Tell its administrators.",
                reason="account",
                status_code=503,
            )
        home = self._home() if self.shared_account else self._system_home()
        if "JUPYTERHUB_SERVICE_URL" in env:
            url = notebook_listens_everywhere(env["JUPYTERHUB_SERVICE_URL"])
            env["JUPYTERHUB_SERVICE_URL"] = url
        relayed = hub_addresses(env)
        if relayed:
            command = inside_command(Path(self.relay_dir), relayed, command)
        self._container = container_name(self.user.name, self.name, secrets.token_hex(4))
        spec = ContainerSpec(
            name=self._container,
            image=self.run_image,
            uid=uid,
            gid=pwd.getpwuid(uid).pw_gid,
            home=home,
            port=self.port,
            command=tuple(command),
            environment=forwarded_names(env),
            share=self.share,
            pids=pids_limit(self.share or host_share(), self.pids_per_gib),
            devices=self._devices(),
            network=self.container_network,
            host_ip=self.ip or "127.0.0.1",
            labels=(("io.composespawner.user", self.user.name),),
            read_only_mounts=(self.relay_dir,) if relayed else (),
        )
        # Podman's own HOME stays the hub's (root's): the container's is given by value.
        return [self.podman, *run_arguments(spec)], {**os.environ, **env, "HOME": _own_home()}

    async def start(self) -> Any:
        """The local launcher's start, once the hub serves its services to containers."""
        await HubRelays.serve(Path(self.relay_dir), hub_addresses(self.get_env()))
        return await super().start()

    def _devices(self) -> tuple[str, ...]:
        gpus = self.notebook_gpus()
        if self.gpu_devices == "cdi":
            return cdi_devices(gpus)
        try:
            minors = gpu_minors(gpus, Path(self.nvidia_proc_dir))
            return device_nodes(minors, Path(self.device_dir))
        except UnknownGpuNode as e:
            self.log.error("%s: %s", log_name(self), e)
            raise SpawnRefused(
                "Your server's GPUs cannot be given to it on this host. Its devices were"
                " given back; try again, or tell the hub's administrators.",
                reason="devices",
                status_code=503,
            ) from e

    def _in_stack(self, command: list[str]) -> list[str]:
        """The image's own notebook server for the configured one."""
        return image_command(command)

    def popen_in_share(
        self, popen: Callable[..., Popen[bytes]], cmd: Sequence[str], kwargs: dict[str, Any]
    ) -> Popen[bytes]:
        """Podman holds the container to its share itself: no cgroup of the launcher's."""
        return popen(list(cmd), **kwargs)

    def make_preexec_fn(self, name: str) -> Any:
        """Podman runs as the hub's account (root); the container as the notebook's."""
        del name
        return None

    # -- ending ----------------------------------------------------------------

    async def stop(self, now: bool = False) -> None:
        """Stop the container (SIGTERM, SIGKILL after podman's timeout); podman's own
        process then exits with it, and the local launcher's stop finds it done."""
        if self._container:
            seconds = "0" if now else str(STOP_SECONDS)
            try:
                await run_podman(
                    self.podman,
                    ("stop", "--ignore", "--time", seconds, self._container),
                    PODMAN_TIMEOUT,
                )
            except PodmanError as e:
                self.log.warning("%s: %s; ending podman's process", log_name(self), e)
            else:
                await self._podman_exited()
        await super().stop(now=now)

    async def _podman_exited(self) -> None:
        """Wait for podman's process to end with its container (the local launcher's stop
        would signal it otherwise, for a container no longer there)."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, PODMAN_TIMEOUT)

    def remove_leftovers(self) -> asyncio.Future[None]:
        """The local launcher's, and the container, should podman's process have ended
        without it (killed): no container outlives its notebook. Done once every removal
        asked for before it is done too (a stop's is the last)."""
        container, self._container = self._container, ""
        before = super().remove_leftovers()
        earlier = self._container_removal
        removal = asyncio.ensure_future(self._remove_container(container, before, earlier))
        self._container_removal = removal
        return removal

    async def _remove_container(
        self,
        container: str,
        before: asyncio.Future[None],
        earlier: asyncio.Future[None] | None,
    ) -> None:
        await before
        if container:
            try:
                await run_podman(
                    self.podman,
                    ("rm", "--force", "--ignore", "--time", "0", container),
                    PODMAN_TIMEOUT,
                )
            except PodmanError as e:
                self.log.warning(
                    "%s: %s; remove it with: podman rm --force %s", log_name(self), e, container
                )
        if earlier is not None:
            await asyncio.wait([earlier])

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self._container:
            state["container"] = self._container
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        container = state.get("container")
        self._container = container if isinstance(container, str) else ""


def _own_home() -> str:
    return os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
