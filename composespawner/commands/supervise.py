"""Processes of the demo: the fabric beside the hub, and services that die with the hub.

``composespawner demo`` runs the fabric simulator beside the hub, as a real
fabric outlives its hub: it starts the simulator, then the hub; on Ctrl-C or
SIGTERM it stops the hub first (whose shutdown stops the notebooks and gives
their devices back over the fabric), then the simulator. Both children get
sessions of their own, so a terminal's Ctrl-C reaches only this process and
the order holds.

``composespawner with-hub --hub-pid PID -- CMD`` runs a hub-managed service that
ends when the hub does, even when the hub is SIGKILLed: the kernel signals it
(``PR_SET_PDEATHSIG``), no process has to watch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

from composespawner.commands.demo_runtime import Runtime, RuntimeRefused, demo_runtime
from composespawner.commands.embedded import (
    CONFIG_FILE,
    DEMO_FABRIC_PASSWORD,
    DEMO_FABRIC_USERNAME,
    PACKAGE,
    config_dir,
    simulator_command,
)
from composespawner.launchers.accounts import (
    DEFAULT_NOTEBOOK_ACCOUNT,
    AccountError,
    account_reaching,
)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
FABRIC_START_TIMEOUT = 30.0  # seconds for the simulator to answer
FABRIC_STOP_TIMEOUT = 10.0  # seconds for it to save its state and exit on SIGTERM


class DemoError(Exception):
    """The demo cannot start; the message says what to do."""


# -- services that end with the hub ---------------------------------------------------


def die_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` when our parent dies; refuse if it already has.

    Linux only. The signal follows the death of the parent *thread* that
    started us: JupyterHub starts its services from its event loop's thread,
    which lives as long as the hub.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    # Checked after prctl: a parent that died before it sends nothing.
    if os.getppid() != parent_pid:
        raise DemoError(f"the hub (pid {parent_pid}) is gone; not starting its service")


def exec_with_hub(hub_pid: int, command: Sequence[str]) -> NoReturn:
    """Become ``command``, bound to end when the hub ``hub_pid`` ends (it survives exec).

    The hub stops a service with SIGINT, then SIGTERM 10 s later. A hub started
    in the background of a script (``make demo &``, nohup) passes SIGINT on
    ignored, and an ignored signal stays ignored across exec: the service would
    sit out each stop's 10 s. It gets the default back here.
    """
    die_with_parent(hub_pid)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    os.execvp(command[0], list(command))


# -- the demo: the fabric beside the hub ---------------------------------------------


@dataclass(frozen=True)
class DemoPlan:
    """What ``composespawner demo`` runs, decided from the environment alone."""

    state: Path
    fabric_port: int
    simulator: list[str]
    hub: list[str]
    env: dict[str, str]
    said: str = ""  # where the notebooks run, and why


def demo_plan(
    environ: Mapping[str, str],
    bin_dir: Path,
    hub_args: Sequence[str],
    runtime: Runtime | None = None,
) -> DemoPlan:
    """The demo's processes and environment (the config reads the same variables), its
    notebooks in ``runtime`` (None: local processes)."""
    runtime = runtime or Runtime("processes", "notebooks run as local processes")
    state = Path(environ.get("COMPOSE_STATE_DIR", ".demo")).resolve()
    homes = Path(environ.get("COMPOSE_HOMES_DIR", ".demo-homes")).resolve()
    port = int(environ.get("COMPOSE_FABRIC_PORT", "8010"))
    env = {
        "COMPOSE_FABRIC_USERNAME": DEMO_FABRIC_USERNAME,
        "COMPOSE_FABRIC_PASSWORD": DEMO_FABRIC_PASSWORD,
        **environ,
        "COMPOSE_STATE_DIR": str(state),
        "COMPOSE_HOMES_DIR": str(homes),
        "COMPOSE_FABRIC_EXTERNAL": "1",  # the config starts no simulator of its own
        **runtime.env,
        "COMPOSE_RUNTIME": runtime.name,
    }
    simulator = simulator_command(
        bin_dir / "composespawner",
        port=port,
        state_file=state / "fabric-state.json",
        extra=environ.get("COMPOSE_FABRIC_ARGS", "").split(),
    )
    hub = [str(bin_dir / "jupyterhub"), "-f", str(config_dir() / CONFIG_FILE), *hub_args]
    return DemoPlan(
        state=state, fabric_port=port, simulator=simulator, hub=hub, env=env, said=runtime.said
    )


def run_demo(plan: DemoPlan) -> int:
    """Run the simulator, then the hub until it exits; the hub's exit status."""
    plan.state.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.geteuid() == 0:
        homes = Path(plan.env["COMPOSE_HOMES_DIR"])
        homes.mkdir(parents=True, exist_ok=True)
        prepare_notebook_account(Path(plan.hub[0]).parent, homes)
    check_port_free(plan.fabric_port)
    if plan.said:
        print(f"composespawner demo: {plan.said}", file=sys.stderr, flush=True)
    with _SignalsToHub() as signals:
        simulator = _start(plan.simulator, plan)
        try:
            _wait_for_fabric(simulator, plan.fabric_port)
            signals.hub = _start(plan.hub, plan)
            return signals.hub.wait()
        finally:
            _stop(simulator)


def prepare_notebook_account(bin_dir: Path, *homes: Path) -> None:
    """As root, notebooks run as an unprivileged account: create it, and let it reach
    what it runs (this Python, the kit merge from this package, the homes),
    wherever the checkout is, root's private home included."""
    needed = [Path(sys.executable), bin_dir / "jupyterhub-singleuser", PACKAGE, *homes]
    try:
        account_reaching(DEFAULT_NOTEBOOK_ACCOUNT, needed)
    except AccountError as e:
        raise DemoError(str(e)) from e


def check_port_free(port: int) -> None:
    """Refuse a port something listens on; a port held only by closing connections is free.

    The probe binds as the simulator will (``SO_REUSEADDR``, asyncio's default for
    servers), so the TIME_WAIT connections a demo stopped a moment ago leaves behind
    do not stop the next one, while a live listener still does.
    """
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            raise DemoError(
                f"Port {port}, the fabric simulator's, is in use ({e.strerror}): an earlier "
                f"demo may still run (`ss -ltnp 'sport = :{port}'` shows what holds it). "
                "Stop it, or set COMPOSE_FABRIC_PORT to a free port."
            ) from e


def _start(command: list[str], plan: DemoPlan) -> subprocess.Popen[bytes]:
    parent = os.getpid()
    return subprocess.Popen(
        command,
        env=plan.env,
        cwd=plan.state,
        # Own sessions: a terminal's Ctrl-C reaches only us, and we choose the order.
        start_new_session=True,
        # If we are killed outright, the hub and the fabric still end.
        preexec_fn=lambda: die_with_parent(parent),
    )


def _wait_for_fabric(simulator: subprocess.Popen[bytes], port: int) -> None:
    url = f"http://127.0.0.1:{port}/redfish/v1/"
    deadline = time.monotonic() + FABRIC_START_TIMEOUT
    while time.monotonic() < deadline:
        if simulator.poll() is not None:
            raise DemoError(
                f"The fabric simulator exited with status {simulator.returncode} "
                "(its messages are above)."
            )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)  # polling a condition: the simulator is still starting
    raise DemoError(f"The fabric simulator did not answer on {url} within {FABRIC_START_TIMEOUT}s.")


class _SignalsToHub:
    """SIGINT and SIGTERM go to the hub once it runs (its shutdown stops its servers).

    Before the hub runs they abort the start, and the simulator is stopped.
    """

    def __init__(self) -> None:
        self.hub: subprocess.Popen[bytes] | None = None
        self.before: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def forward(self, signum: int, frame: FrameType | None) -> None:
        if self.hub is None:
            raise KeyboardInterrupt
        if self.hub.poll() is None:
            self.hub.send_signal(signum)

    def __enter__(self) -> _SignalsToHub:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.before[signum] = signal.signal(signum, self.forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=FABRIC_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def notebook_account_main() -> int:
    """``composespawner notebook-account``: as root, what the demo and the tests need."""
    if os.geteuid() != 0:
        return 0  # notebooks run as the hub's own account
    try:
        prepare_notebook_account(Path(sys.executable).parent)
    except DemoError as e:
        print(f"composespawner notebook-account: {e}", file=sys.stderr)
        return 1
    return 0


def demo_main(hub_args: Sequence[str]) -> int:
    """``composespawner demo``: the embedded default, fabric and hub."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "jupyterhub").exists():
        print("jupyterhub is not installed next to this Python; run `make demo`.", file=sys.stderr)
        return 1
    try:
        return run_demo(demo_plan(os.environ, bin_dir, hub_args, demo_runtime(os.environ)))
    except (DemoError, RuntimeRefused) as e:
        print(f"composespawner demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # stopped before the hub ran
