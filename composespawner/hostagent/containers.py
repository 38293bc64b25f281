"""The agent's container runtime (``runtime = "containers"``): each notebook in a podman
container of its own, from its stack's image by digest.

What the container is held to and cannot reach is :mod:`composespawner.launchers.containers`'s,
the same as on a one-host hub. Here the agent runs ``podman run`` attached, as root, in
a session of its own, its output into the notebook's log through the log sink; podman's
process is the notebook's record (its pid and start time), so the poll, the stop, the
exit watch, the list and the orphans after an outage work as they do for processes, and
a container whose podman was killed is removed when its record ends.

Podman's own environment is the agent's, never the request's (a hub's variable must not
configure a root podman: ``CONTAINERS_CONF``, a registry, ``TMPDIR``): the notebook's
variables reach the container through an environment file in the agent's state folder,
root's alone, which goes when the notebook ends. Podman's configuration is the host's
(``/etc/containers``, or the variables ``podman_command`` sets with ``env``).

The image is pulled the first time a notebook on this host runs it, outside the state
lock (a pull takes minutes; the lock is for deciding), and kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import secrets
import select
import shutil
import subprocess
import sys
from pathlib import Path

from composespawner.domain.hardware import Share
from composespawner.hostagent.config import AgentConfig
from composespawner.hostagent.decisions import notebook_env
from composespawner.hostagent.starting import Say, StartFailed, deliver, popen_logged
from composespawner.launchers.agent_protocol import StartNotebook, reply
from composespawner.launchers.cgroups import pids_limit
from composespawner.launchers.containers import (
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
from composespawner.launchers.relayed import hub_addresses, inside_command

PODMAN_TIMEOUT = 60.0  # seconds for podman's quick calls (exists, stop, rm)
RELAY_READY_TIMEOUT = 15.0  # seconds for a notebook's relay to serve its sockets
# What podman's own process is given: enough to find conmon and runc, root's home (a
# root podman reading a user's ~/.config is not to be thought of).
PODMAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
}
RELAY = "composespawner.launchers.relay"  # the agent's Python runs it (-m): its package
log = logging.getLogger("composespawner.hostagent")


def podman(config: AgentConfig, args: list[str], within: float) -> subprocess.CompletedProcess[str]:
    """``podman args`` (its output; a failure is the caller's to judge); StartFailed when
    it cannot run or takes more than ``within`` seconds."""
    try:
        return subprocess.run(
            [*config.podman_command, *args],
            capture_output=True,
            text=True,
            env=PODMAN_ENV,
            stdin=subprocess.DEVNULL,
            timeout=within,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StartFailed(f"podman {args[0]}: {e}") from e


def pulled_marker(config: AgentConfig, image: str) -> Path:
    """The state folder's note that ``image`` was pulled on this host."""
    return config.state_dir / "images" / hashlib.sha256(image.encode()).hexdigest()[:32]


def pull_once(config: AgentConfig, image: str, say: Say) -> str:
    """``image`` in this host's store: pulled by digest the first time, then kept; the
    pull policy its ``podman run`` takes (:attr:`ContainerSpec.pull`).

    Once pulled, a note in the state folder says so and no podman is asked again (a
    start costs a podman the less); should the image have gone since (a prune), the
    run pulls it again itself, without the progress line.
    """
    marker = pulled_marker(config, image)
    if marker.exists():
        return "missing"
    if podman(config, ["image", "exists", image], PODMAN_TIMEOUT).returncode != 0:
        say(reply(progress="fetching the stack's image (first use on this host)", percent=30))
        done = podman(config, ["pull", "--quiet", image], config.image_pull_timeout)
        if done.returncode != 0:
            raise StartFailed(f"cannot pull {image}: {done.stderr.strip()[-300:]}")
    marker.parent.mkdir(mode=0o700, exist_ok=True)
    marker.write_text(image + "\n")
    return "never"


def env_file_text(env: dict[str, str], names: tuple[str, ...]) -> str:
    """Podman's ``--env-file`` for the variables ``names`` of ``env``: one ``NAME=value``
    a line, the value as it is (a line break cannot be written, and is refused)."""
    broken = [name for name in names if "\n" in env[name] or "\r" in env[name]]
    if broken:
        raise StartFailed(
            f"env: {', '.join(broken)} hold a line break, which a container's"
            " environment cannot be given"
        )
    return "".join(f"{name}={env[name]}\n" for name in names)


def devices(config: AgentConfig, gpus: tuple[str, ...]) -> tuple[str, ...]:
    """The ``--device`` values of a notebook holding ``gpus`` (this host's UUIDs)."""
    if config.gpu_devices == "cdi":
        return cdi_devices(gpus)
    try:
        return device_nodes(gpu_minors(gpus, config.nvidia_proc_dir), config.device_dir)
    except UnknownGpuNode as e:
        raise StartFailed(str(e)) from e


class ContainerStart:
    """One notebook's container being started: its env file and relay made first, so
    that a failure anywhere undoes what was made (:meth:`undo`)."""

    def __init__(
        self,
        config: AgentConfig,
        request: StartNotebook,
        account: pwd.struct_passwd,
        pull: str = "never",
    ):
        self.config, self.request, self.account = config, request, account
        self.pull = pull  # podman run's pull policy (pull_once's answer)
        self.container = container_name(request.user, request.server, secrets.token_hex(4))
        self.env_file = config.state_dir / f"{request.machine}.env"
        self.relay_folder = relay_folder(config, request.machine)
        self.cgroups: tuple[Path, ...] = ()  # podman makes the container's own
        self.relay: subprocess.Popen[bytes] | None = None
        self._relay_end: int | None = None  # the pipe's end podman holds: the relay's life

    def plan(self, share: Share) -> tuple[Path, ...]:
        """No cgroups of the agent's: podman makes the container's (its name is chosen)."""
        del share
        return ()

    def popen(self, port: int, share: Share, log_path: Path) -> subprocess.Popen[bytes]:
        """``podman run`` of the notebook, attached; its Popen."""
        request, account, listen = self.request, self.account, self.config.listen_address
        extra = {**deliver(request, account, None), "COMPOSE_STACK_IMAGE": str(request.image)}
        env = notebook_env(
            request.env,
            (account.pw_name, account.pw_dir, account.pw_shell),
            request.gpus,
            (listen, port),
            "",
            extra,
        )
        env["JUPYTERHUB_SERVICE_URL"] = notebook_listens_everywhere(env["JUPYTERHUB_SERVICE_URL"])
        self._write_env_file(env_file_text(env, forwarded_names(env)))
        command = [*image_command(self.config.notebook_command), *self.request.args]
        relayed = hub_addresses(env)
        if relayed:
            self._start_relay(relayed)
            command = inside_command(self.relay_folder, relayed, command)
        spec = ContainerSpec(
            name=self.container,
            image=str(self.request.image),
            uid=self.account.pw_uid,
            gid=self.account.pw_gid,
            home=self.account.pw_dir,
            port=port,
            command=tuple(command),
            share=share,
            pids=pids_limit(share, self.config.pids_per_gib),
            devices=devices(self.config, self.request.gpus),
            network=self.config.container_network,
            host_ip=listen,
            labels=(("io.composespawner.machine", self.request.machine),),
            read_only_mounts=(str(self.relay_folder),) if relayed else (),
            env_file=str(self.env_file),
            pull=self.pull,
        )
        args = [*self.config.podman_command, *run_arguments(spec)]
        passed = () if self._relay_end is None else (self._relay_end,)
        try:
            return popen_logged(args, PODMAN_ENV, log_path, None, pass_fds=passed)
        finally:
            self._close_relay_end()

    def _write_env_file(self, text: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with os.fdopen(os.open(self.env_file, flags, 0o600), "w") as file:
            file.write(text)

    def _start_relay(self, addresses: tuple[tuple[str, int], ...]) -> None:
        """The hub's loopback services as sockets in the notebook's relay folder, served
        until podman's process (which holds the pipe's other end) and conmon are gone."""
        self.relay_folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        reader, self._relay_end = os.pipe()
        words = [f"{host}:{port}" for host, port in addresses]
        said = self.config.state_dir / f"{self.request.machine}.relay.log"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        said_fd = os.open(said, flags, 0o600)
        try:
            self.relay = subprocess.Popen(
                [sys.executable, "-I", "-m", RELAY, str(self.relay_folder), *words],
                stdin=reader,
                stdout=subprocess.PIPE,
                stderr=said_fd,
                env={},
                start_new_session=True,
            )
        finally:
            os.close(reader)
            os.close(said_fd)
        assert self.relay.stdout is not None
        if _read_line(self.relay.stdout.fileno(), RELAY_READY_TIMEOUT) != b"serving\n":
            why = said.read_text(errors="replace").strip().splitlines()[-1:] or ["no answer"]
            raise StartFailed(f"the hub's relay for the notebook did not start: {why[0]}")

    def _close_relay_end(self) -> None:
        if self._relay_end is not None:
            os.close(self._relay_end)
            self._relay_end = None

    def undo(self) -> None:
        """What this start made, gone: the container, the relay, the env file."""
        self._close_relay_end()
        remove_container(self.config, self.container, self.request.machine)
        if self.relay is not None:
            self.relay.kill()
            self.relay.wait()


def relay_folder(config: AgentConfig, machine: str) -> Path:
    """Where a notebook's relay sockets are: short, as a Unix socket's path must be."""
    return config.relay_dir / hashlib.sha256(machine.encode()).hexdigest()[:12]


def _read_line(fd: int, within: float) -> bytes:
    """What ``fd`` has to read within ``within`` seconds (b"" if nothing)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(within * 1000)):
        return b""
    return os.read(fd, 64)


def stop_container(config: AgentConfig, name: str, grace: float) -> None:
    """SIGTERM to the notebook, SIGKILL after ``grace`` seconds; podman's process ends
    with it. A podman that fails is logged: the record's end removes the container."""
    seconds = str(int(min(grace, STOP_SECONDS)))
    with contextlib.suppress(StartFailed):
        done = podman(config, ["stop", "--ignore", "--time", seconds, name], grace + PODMAN_TIMEOUT)
        if done.returncode != 0:
            log.warning("podman stop %s: %s", name, done.stderr.strip()[-300:])


def remove_container(config: AgentConfig, name: str, machine: str) -> None:
    """The container gone (it is, once podman's process ended it: ``--rm``), with its
    environment file and relay folder."""
    if name:
        try:
            removal = ["rm", "--force", "--ignore", "--time", "0", name]
            done = podman(config, removal, PODMAN_TIMEOUT)
            if done.returncode != 0:
                log.error("cannot remove container %s: %s", name, done.stderr.strip()[-300:])
        except StartFailed as e:
            log.error("cannot remove container %s: %s; remove it with podman rm -f", name, e)
    for leftover in (f"{machine}.env", f"{machine}.relay.log"):
        with contextlib.suppress(FileNotFoundError):
            (config.state_dir / leftover).unlink()
    shutil.rmtree(relay_folder(config, machine), ignore_errors=True)
