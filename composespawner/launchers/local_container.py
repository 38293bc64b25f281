"""The container launcher: each notebook in a podman container from its stack's image.

Everything the local launcher does stays (the port on the host's loopback, the home
and the run manifest in it, the kit merged as the notebook's account, the exit seen
at once through a pidfd, the state a restarted hub finds its notebooks by); what runs
is a container of its own (:mod:`.containers` says what it is held to and cannot
reach), created and started through podman's API (:mod:`.podman_api`), as
DockerSpawner asks Docker's. Podman, not the launcher, makes its cgroups; the
container's first process (podman's init) is the one watched for the exit.

A stack's image is pulled by digest the first time a notebook on this host runs it,
once however many start together, and kept. A site names the images in its catalog
(``image`` and each build's ``digest``) or here (:attr:`PodmanLauncher.stack_images`).
Podman's own configuration is the host's (``/etc/containers``, or ``CONTAINERS_CONF``
and ``CONTAINERS_STORAGE_CONF`` in the hub's environment): runc, and a registry it
may pull from.
"""

from __future__ import annotations

import asyncio
import pwd
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from traitlets import Enum, Unicode

from composespawner.launchers.base import SpawnRefused
from composespawner.launchers.cgroups import host_share, pids_limit
from composespawner.launchers.containers import (
    ISOLATED_NETWORK,
    STOP_SECONDS,
    ContainerSpec,
    cdi_devices,
    container_name,
    create_body,
    forwarded_names,
    image_command,
    notebook_listens_everywhere,
)
from composespawner.launchers.gpu_devices import UnknownGpuNode, device_nodes, gpu_minors
from composespawner.launchers.jupyterhub_internals import log_name
from composespawner.launchers.local import LocalLauncher
from composespawner.launchers.local_process import process_started, watch_exit
from composespawner.launchers.podman_api import CALL_TIMEOUT, PodmanError
from composespawner.launchers.podman_images import PodmanImages
from composespawner.launchers.relay import HubRelays
from composespawner.launchers.relayed import hub_addresses, inside_command

LAST_LINES = 20  # of a notebook's output, logged when it exits unasked
# Podman's states of a container whose notebook is not running (and will not, unasked).
ENDED = frozenset({"configured", "created", "exited", "stopped"})


class PodmanLauncher(PodmanImages, LocalLauncher):
    """Run each notebook in a container of its own, from its stack's image by digest."""

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

    _container: str = ""  # the container's name, until it is removed
    _container_removal: asyncio.Future[None] | None = None
    _exit_status: int | None = None  # the container's, once its end was seen

    # -- the stack's image -----------------------------------------------------

    async def prepare_launch(self) -> None:
        self.run_image = self._run_manifest = self._manifest_file = None
        if self.stack is None:
            return
        self.run_image = self.check_image(self.stack)
        try:
            await self.pull_once(self.run_image, self.stack, self.launch_progress)
        except PodmanError as e:
            self.log.error("%s: cannot pull %s: %s", log_name(self), self.run_image, e)
            raise SpawnRefused(
                f"The {self.stack.label} stack's image could not be fetched to this host."
                " Try again in a few minutes; if it keeps failing, tell the hub's"
                " administrators.",
                reason="stack",
                status_code=503,
            ) from e

    def launcher_env(self) -> dict[str, str]:
        return {**super().launcher_env(), **self.stack_lock_env(self.stack, self.run_image)}

    # -- the container ---------------------------------------------------------

    async def start(self) -> Any:
        """The local launcher's start, once the hub serves its services to containers."""
        await HubRelays.serve(Path(self.relay_dir), hub_addresses(self.get_env()))
        return await super().start()

    async def launch(
        self, command: list[str], env: dict[str, str], make_files: Callable[[], None]
    ) -> None:
        """Create and start the notebook's container, its files made first; watch its
        first process for the exit. Nothing is left of a start that fails."""
        spec = self.container_spec(command, env)
        body = create_body(spec, env)
        self.log.info("Spawning %s in container %s", " ".join(command), spec.name)
        api = await self.podman_api()
        await asyncio.to_thread(make_files)
        self._container, self._exit_status = spec.name, None
        try:
            await api.create(body)
            await api.start(spec.name)
            found = await api.inspect(spec.name)
        except PodmanError as e:
            self.log.error("%s: container %s did not start: %s", log_name(self), spec.name, e)
            await self.remove_leftovers()
            raise SpawnRefused(
                "Your server's container could not be started on this host. Its devices"
                " were given back; try again in a few minutes, or tell the hub's"
                " administrators.",
                reason="container",
                status_code=503,
            ) from e
        except BaseException:  # cancelled (the start's timeout): no container left
            self.remove_leftovers()
            raise
        pid = int((found or {}).get("State", {}).get("Pid") or 0)
        if pid:
            self.pid, self._pid_started = pid, process_started(pid)
            watch_exit(pid, lambda: self._exited(spec.name), self.log, log_name(self))

    def container_spec(self, command: list[str], env: dict[str, str]) -> ContainerSpec:
        """The notebook's container; ``env``'s service URL made one it can listen on."""
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
        return ContainerSpec(
            name=container_name(self.user.name, self.name, secrets.token_hex(4)),
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

    # -- ending ----------------------------------------------------------------

    def _exited(self, container: str) -> None:
        """The container's first process ended: its status, then the machine given back
        and the container removed (not a newer start's)."""
        if self._container == container:
            self._exit_seen = asyncio.ensure_future(self._container_ended(container))

    async def _container_ended(self, container: str) -> None:
        status = await self._ended_status(container)
        if self._container == container:
            self._exit_status = status
        await self.notebook_exited(status)
        if self._container == container:
            self.remove_leftovers()

    async def _ended_status(self, container: str) -> int | None:
        """The ended container's exit status (podman's: 137 for SIGKILL), its last output
        logged where it failed; None where podman cannot say."""
        try:
            api = await self.podman_api()
            status = await api.wait(container, CALL_TIMEOUT)
            if status != 0:
                said = await api.logs_tail(container, LAST_LINES)
                self.log.warning(
                    "%s: container %s exited (%d); its last output:\n%s",
                    log_name(self),
                    container,
                    status,
                    said.rstrip() or "(none)",
                )
        except PodmanError as e:
            if self._container == container:  # not removed meanwhile by a stop or a poll
                self.log.warning("%s: container %s ended: %s", log_name(self), container, e)
            return None
        return status

    async def poll(self) -> int | None:
        """None while the container runs (or podman cannot say: unknown is not dead);
        its exit status once it has ended, its leftovers then removed."""
        if self._container and self._exit_status is None:
            try:
                found = await (await self.podman_api()).inspect(self._container)
            except PodmanError as e:
                self.log.warning("%s: %s; taken to be running", log_name(self), e)
                return None
            state = (found or {}).get("State", {})
            if found is not None and state.get("Status") not in ENDED:
                return None
            self._exit_status = int(state.get("ExitCode") or 0)
        status = self._exit_status if self._exit_status is not None else 0
        await self.remove_leftovers()
        self.clear_state()
        return status

    async def stop(self, now: bool = False) -> None:
        """Stop the container (SIGTERM, SIGKILL after its timeout), then what the local
        launcher does (the pid, should podman not answer, and the leftovers)."""
        if self._container and self._exit_status is None:
            try:
                api = await self.podman_api()
                await api.stop(self._container, 0 if now else STOP_SECONDS)
            except PodmanError as e:
                self.log.warning("%s: %s; ending its process", log_name(self), e)
        await super().stop(now=now)

    async def _signal(self, sig: int) -> bool:
        """LocalProcessSpawner's, for a stop podman did not answer: the container's first
        process, where podman named one; never pid 0, the hub's own process group."""
        if not self.pid:
            return False
        signalled: bool = await super()._signal(sig)
        return signalled

    def remove_leftovers(self) -> asyncio.Future[None]:
        """The local launcher's, and the container: no container outlives its notebook.
        Done once every removal asked for before it is done too (a stop's is the last)."""
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
                await (await self.podman_api()).remove(container)
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

    def clear_state(self) -> None:
        super().clear_state()
        self._exit_status = None
