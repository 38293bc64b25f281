"""A real JupyterHub for tests: the demo config, free ports, a private state dir.

The hub runs as a subprocess with configurable-http-proxy, the fabric simulator
as a hub-managed service and real notebook servers; or, with ``demo_command``,
as ``composespawner demo`` runs it: the simulator beside the hub, both started
and stopped by that command. Teardown stops the hub and then kills anything
still running from the state dir (notebooks run with it as their working
directory), so no process outlives a test module.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests

from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT, reach_problem
from composespawner.ledger import Ledger
from harness.paths import HUB_CONFIG, ROOT
from harness.ports import free_port, free_ports
from harness.simulator import CONSOLE_SCRIPT, SimulatorProcess

T = TypeVar("T")
PASSWORD = "test-password-1"
ADMIN_TOKEN = "composespawner-test-admin-token-0123456789"
FABRIC_AUTH = ("admin", "test-fabric-password")
PORTAL = "/services/compose/"  # where the hub's proxy serves the GPU portal


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (requests.RequestException, OSError) as e:
            last_error = e
        time.sleep(every)  # polling a condition, not standing in for one
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_error})"
    )


@dataclass
class Hub:
    url: str
    fabric_url: str
    state: Path
    homes: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    api: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        self.api.headers["Authorization"] = f"token {ADMIN_TOKEN}"

    # -- crashing and restarting ---------------------------------------------

    def crash(self) -> None:
        """SIGKILL the hub with its proxy and services, as when its container dies.

        Notebook servers live on, as pods do when a hub on Kubernetes dies;
        ``restart`` finds them again through the state the hub saved.
        """
        survivors = {pid for pid in _descendants(self.proc.pid) if _is_notebook(pid)}
        doomed = [self.proc.pid, *(p for p in _descendants(self.proc.pid) if p not in survivors)]
        for pid in doomed:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        wait_for(lambda: not any(alive(p) for p in doomed[1:]), 10, "the hub's children to die")

    def kill_hub(self) -> None:
        """SIGKILL the hub process alone, as the kernel's OOM killer would.

        Whatever it started is left to end on its own (or not: that is under test).
        """
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Start the hub again on the same ports and state; wait until it answers."""
        assert self.proc.poll() is not None, "restart() after crash() or a stop"
        self.proc = start_hub(self.command, self.state, self.env, self.log_path)
        wait_for(lambda: _up(self), 60, "the restarted hub to answer")

    def processes(self, *words: str) -> list[int]:
        """Live processes started from the state dir whose command line has all ``words``."""
        return [
            pid
            for pid in leftover_pids(self.state, group=-1)
            if alive(pid) and all(word in _cmdline(pid) for word in words)
        ]

    # -- hub REST API ------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        return self.api.request(method, f"{self.url}/hub/api{path}", **kwargs)

    def user(self, name: str) -> dict[str, Any]:
        response = self.request("GET", f"/users/{name}", params={"include_stopped_servers": "0"})
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def server(self, user: str, name: str = "") -> dict[str, Any] | None:
        servers: dict[str, Any] = self.user(user).get("servers", {})
        return servers.get(name)

    def spawn(self, user: str, options: dict[str, Any], name: str = "") -> requests.Response:
        return self.request("POST", f"/users/{user}/servers/{name}", json={"user_options": options})

    def wait_ready(self, user: str, name: str = "", timeout: float = 90) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            server = self.server(user, name)
            if server is None:
                raise AssertionError(f"{user}/{name} stopped while starting:\n{self.log_tail()}")
            return server if server.get("ready") else None

        return wait_for(ready, timeout, f"{user}/{name} to be ready")

    def stop(self, user: str, name: str = "") -> None:
        response = self.request("DELETE", f"/users/{user}/servers/{name}")
        assert response.status_code in (202, 204), response.text
        self.wait_gone(user, name)

    def wait_gone(self, user: str, name: str = "", timeout: float = 60) -> None:
        wait_for(lambda: self.server(user, name) is None, timeout, f"{user}/{name} to stop")

    def wait_released(self, machine_id: str, timeout: float = 30) -> None:
        """Wait until the ledger says ``released``: a stop leaves the release to the
        background, and the ledger frees the devices last, once the fabric confirmed."""
        ledger = Ledger(self.ledger_url())
        try:

            def released() -> bool:
                machine = ledger.machine(machine_id)
                return machine is not None and machine.state == "released"

            wait_for(released, timeout, f"machine {machine_id} to be released")
        finally:
            ledger.close()

    def spawn_watching(
        self, user: str, options: dict[str, Any], name: str = ""
    ) -> tuple[requests.Response, list[dict[str, Any]]]:
        """Spawn, and read the spawn's progress events while it is pending.

        The hub only streams a spawn's events while it is pending (afterwards it
        sends just "ready"), so the stream is opened as soon as the spawn starts.
        """
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(self.spawn, user, options, name)
            events = wait_for(lambda: self._progress_while_pending(user, name), 30, "progress")
            return answer.result(timeout=60), events

    def _progress_while_pending(self, user: str, name: str) -> list[dict[str, Any]] | None:
        server = f"servers/{name}" if name else "server"
        events = []
        with self.request("GET", f"/users/{user}/{server}/progress", stream=True) as response:
            if response.status_code != 200:
                return None  # not pending yet
            for line in response.iter_lines(decode_unicode=True):
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        # A stream of only the final event means we came too late for the rest.
        return events if len(events) > 1 else None

    # -- browser-like sessions ------------------------------------------------

    def login(self, user: str, password: str = PASSWORD) -> requests.Session:
        session = requests.Session()
        page = session.get(f"{self.url}/hub/login", timeout=30)
        page.raise_for_status()
        xsrf = session.cookies.get("_xsrf")
        response = session.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": xsrf},
            timeout=30,
            allow_redirects=False,
        )
        assert response.status_code == 302, f"login of {user} failed: {response.status_code}"
        return session

    # -- the fabric's Redfish tree ------------------------------------------------

    def redfish(self, path: str) -> dict[str, Any]:
        response = requests.get(f"{self.fabric_url}{path}", auth=FABRIC_AUTH, timeout=10)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def attached(self, host: str) -> list[str]:
        """Device blocks attached to a host, its own compute block left out."""
        links = self.redfish(f"/redfish/v1/Systems/{host}")["Links"]["ResourceBlocks"]
        blocks = [link["@odata.id"].rsplit("/", 1)[1] for link in links]
        return [b for b in blocks if b != f"{host}-block"]

    def composed_hosts(self) -> dict[str, list[str]]:
        systems = self.redfish("/redfish/v1/Systems")["Members"]
        hosts = [m["@odata.id"].rsplit("/", 1)[1] for m in systems]
        return {h: attached for h in hosts if (attached := self.attached(h))}

    def block_state(self, block: str) -> str:
        block_json = self.redfish(f"/redfish/v1/CompositionService/ResourceBlocks/{block}")
        return str(block_json["CompositionStatus"]["CompositionState"])

    # -- the ledger ------------------------------------------------------------------

    def ledger_url(self) -> str:
        """The production config's (COMPOSE_LEDGER_URL), else the demo's SQLite file."""
        return (
            self.env.get("COMPOSE_LEDGER_URL")
            or f"sqlite:///{self.state / 'composespawner.sqlite'}"
        )

    def server_host(self, user: str, name: str = "") -> str:
        """The compute host of a user's live machine, as the ledger records it."""
        ledger = Ledger(self.ledger_url())
        try:
            machine = ledger.live_machine(user, name)
        finally:
            ledger.close()
        assert machine is not None, f"{user}/{name} has no live machine"
        assert machine.host_id, f"{user}/{name}'s machine has no host yet"
        return machine.host_id

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def wait_for_portal(hub: Hub, timeout: float = 60) -> None:
    """Until the GPU portal (a service the hub starts) answers: an anonymous call is sent
    to log in (302) or refused (403)."""

    def answers() -> bool:
        response = requests.get(f"{hub.url}{PORTAL}api/me", timeout=5, allow_redirects=False)
        return response.status_code in (302, 403)

    wait_for(answers, timeout, "the portal to answer")


def notebook_pid(hub: Hub, user: str, name: str = "") -> int:
    """The notebook's process id, from the spawner state the hub keeps."""
    response = hub.request("GET", f"/users/{user}", params={"include_stopped_servers": "0"})
    state = response.json()["servers"][name]["state"]
    return int(state["pid"])


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def fabric_on_its_own(tmp: Path, *args: str) -> SimulatorProcess:
    """The fabric simulator as production runs it, beside the hub (start it with ``with``).

    It keeps its state in ``tmp`` and takes the hub's credentials; pass its
    ``port`` to ``running_hub(fabric_port=...)``.
    """
    return SimulatorProcess(
        ["--state-file", str(tmp / "fabric-state.json"), *args],
        tmp / "fabric.log",
        command=CONSOLE_SCRIPT,
        credentials=FABRIC_AUTH,
    )


@contextmanager
def running_hub(
    tmp: Path,
    extra_config: str = "",
    *,
    fabric_port: int | None = None,
    demo_command: bool = False,
    **env_overrides: str,
) -> Iterator[Hub]:
    """Start the demo hub on free ports with its state in ``tmp``; stop everything after.

    ``extra_config`` is appended to the config (after the demo's), ``env_overrides``
    to the environment the demo config reads. With ``fabric_port`` the fabric is
    already running there (the test started it) and the hub starts no simulator.
    With ``demo_command`` the hub runs under ``composespawner demo``, which starts
    the simulator beside it; ``Hub.proc`` is then that command's process.
    """
    state = tmp / "state"
    state.mkdir(parents=True)
    homes = _homes_dir()
    extra = tmp / "test_config.py"
    extra.write_text(TEST_ADMIN_CONFIG + extra_config)
    ports = free_ports("hub", "proxy", "api", "fabric", "portal")
    if fabric_port is not None:
        ports["fabric"] = fabric_port
        env_overrides = {"COMPOSE_FABRIC_EXTERNAL": "1", **env_overrides}
    env = {
        **os.environ,
        "COMPOSE_STATE_DIR": str(state),
        "COMPOSE_HOMES_DIR": str(homes),
        "COMPOSE_HUB_PORT": str(ports["hub"]),
        "COMPOSE_PROXY_API_PORT": str(ports["proxy"]),
        "COMPOSE_HUB_API_PORT": str(ports["api"]),
        "COMPOSE_FABRIC_PORT": str(ports["fabric"]),
        "COMPOSE_PORTAL_PORT": str(ports["portal"]),
        "COMPOSE_DEMO_PASSWORD": PASSWORD,
        "COMPOSE_FABRIC_USERNAME": FABRIC_AUTH[0],
        "COMPOSE_FABRIC_PASSWORD": FABRIC_AUTH[1],
        "COMPOSE_POLL_INTERVAL": "2",
        # The demo's reclaimer takes a GPU nothing holds after 2 minutes, and every
        # simulated GPU is held by nothing: a test of the reclaimer turns it on.
        "COMPOSE_RECLAIM": "0",
        "COMPOSE_EXTRA_CONFIG": str(extra),
        "PYTHONWARNINGS": "ignore",
        **env_overrides,
    }
    bin_dir = Path(sys.executable).parent
    if demo_command:
        command = [str(bin_dir / "composespawner"), "demo"]
    else:
        command = [str(bin_dir / "jupyterhub"), "-f", str(HUB_CONFIG / "jupyterhub_config.py")]
    hub = Hub(
        url=f"http://localhost:{ports['hub']}",
        fabric_url=f"http://127.0.0.1:{ports['fabric']}",
        state=state,
        homes=homes,
        proc=start_hub(command, state, env, tmp / "hub.log"),
        log_path=tmp / "hub.log",
        env=env,
        command=command,
    )
    try:
        wait_for(lambda: _up(hub), 60, "the hub and the fabric simulator to answer")
        yield hub
    finally:
        try:
            _shut_down(hub)
        finally:
            shutil.rmtree(homes)


@contextmanager
def running_production_hub(
    tmp: Path, settings: dict[str, str], ca_bundle: Path, extra_config: str = ""
) -> Iterator[Hub]:
    """Deploy and start ``hub_config/production_config.py`` as its docs say, on free ports.

    ``settings`` are its environment (the production config's header lists them)
    beyond the ports, the state and homes folders and COMPOSE_PUBLIC_URL, which
    this sets: https://127.0.0.1:<port>, served with the certificate the
    settings name and trusted through ``ca_bundle``. As a deploy does, the
    ledger's schema is upgraded first (``composespawner upgrade-db``).
    """
    state = tmp / "state"
    state.mkdir(parents=True, mode=0o700)
    homes = _homes_dir()
    extra = tmp / "test_config.py"
    extra.write_text(TEST_ADMIN_CONFIG + extra_config)
    public = settings.get("COMPOSE_PUBLIC_URL")
    taken = {urlsplit(public).port or 443} if public else set()
    ports = free_ports("hub", "proxy", "api", "portal", avoid=taken)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")},
        "COMPOSE_PUBLIC_URL": f"https://127.0.0.1:{ports['hub']}",
        "COMPOSE_STATE_DIR": str(state),
        "COMPOSE_HOMES_DIR": str(homes),
        "COMPOSE_PROXY_API_PORT": str(ports["proxy"]),
        "COMPOSE_HUB_API_PORT": str(ports["api"]),
        "COMPOSE_PORTAL_PORT": str(ports["portal"]),
        "COMPOSE_EXTRA_CONFIG": str(extra),
        "PYTHONWARNINGS": "ignore",
        **settings,
    }
    bin_dir = Path(sys.executable).parent
    config = str(HUB_CONFIG / "production_config.py")
    subprocess.run(
        [str(bin_dir / "composespawner"), "upgrade-db", "-f", config],
        env=env,
        cwd=state,
        check=True,
        timeout=120,
        capture_output=True,
    )
    command = [str(bin_dir / "jupyterhub"), "-f", config]
    hub = Hub(
        url=env["COMPOSE_PUBLIC_URL"],
        fabric_url=settings["COMPOSE_FABRIC_URL"],
        state=state,
        homes=homes,
        proc=start_hub(command, state, env, tmp / "hub.log"),
        log_path=tmp / "hub.log",
        env=env,
        command=command,
    )
    try:
        with serving(hub, ca_bundle):
            yield hub
    finally:
        shutil.rmtree(homes)


@contextmanager
def serving(hub: Hub, ca_bundle: Path) -> Iterator[Hub]:
    """A started HTTPS hub, once it answers; stopped as an admin would, nothing left running."""
    hub.api.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify
    hub.api.verify = str(ca_bundle)
    try:
        wait_for(lambda: _answers(hub, f"{hub.url}/hub/health"), 90, "the hub to answer")
        yield hub
    finally:
        _shut_down(hub)


def _answers(hub: Hub, url: str) -> bool:
    if hub.proc.poll() is not None:
        raise AssertionError(f"the hub exited with {hub.proc.returncode}:\n{hub.log_tail()}")
    return hub.api.get(url, timeout=2).status_code == 200


def _homes_dir() -> Path:
    """Homes outside pytest's private (0700) tmp: a root hub's notebooks must reach them."""
    if os.geteuid() == 0:
        _check_notebook_account()
    homes = Path(tempfile.mkdtemp(prefix="composespawner-homes-"))
    homes.chmod(0o755)
    return homes


def _check_notebook_account() -> None:
    try:
        account = pwd.getpwnam(DEFAULT_NOTEBOOK_ACCOUNT)
    except KeyError:
        raise AssertionError(
            f"As root, notebooks run as {DEFAULT_NOTEBOOK_ACCOUNT!r}, which does not exist: "
            "`make install-test` creates it."
        ) from None
    problem = reach_problem(account, [Path(sys.executable)])
    assert problem is None, f"{problem} (`make install-test` does that)"


def start_hub(
    command: list[str], state: Path, env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            cwd=state,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _up(hub: Hub) -> bool:
    if hub.proc.poll() is not None:
        raise AssertionError(f"the hub exited with {hub.proc.returncode}:\n{hub.log_tail()}")
    health = requests.get(f"{hub.url}/hub/health", timeout=2)
    fabric = requests.get(f"{hub.fabric_url}/redfish/v1/", timeout=2)
    return health.status_code == 200 and fabric.status_code == 200


def _shut_down(hub: Hub) -> None:
    """Stop the hub the way an admin would; anything it leaves running fails the test."""
    stuck: list[str] = []  # what still ran when the hub had to be killed
    if hub.proc.poll() is None:
        hub.proc.send_signal(signal.SIGTERM)
        try:
            hub.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stuck = [_cmdline(pid) for pid in _descendants(hub.proc.pid)]
            os.killpg(hub.proc.pid, signal.SIGKILL)
            hub.proc.wait(timeout=10)
    # Swept either way: the proxy runs in a session of its own, beyond the killpg.
    leftovers = leftover_pids(hub.state, hub.proc.pid, also_under=hub.homes)
    for pid in leftovers:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not stuck, (
        f"the hub did not stop within 30 s of SIGTERM; still running: {stuck}\n{hub.log_tail()}"
    )
    assert not leftovers, f"processes outlived the hub: {[_cmdline(p) for p in leftovers]}"


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _is_notebook(pid: int) -> bool:
    """Whether the hub started ``pid`` (or its parent) as a user's server, not a service.

    Told by the environment the hub gave it, not by its command line: a notebook
    may still be in a wrapper (a test's launch hold, a stack's shell) when the hub
    dies, and it lives on as much as one that already answers.
    """
    try:
        env = process_env(pid)
    except OSError:
        return False  # gone already
    return "JUPYTERHUB_SERVER_NAME" in env and "JUPYTERHUB_SERVICE_NAME" not in env


def alive(pid: int) -> bool:
    try:
        state = (Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        return line or Path(f"/proc/{pid}/stat").read_text()[:200]  # exiting: no command line
    except OSError:
        return str(pid)


def leftover_pids(state: Path, group: int, also_under: Path | None = None) -> list[int]:
    """Processes in ``group`` or working in ``state`` (or ``also_under``: notebooks' homes)."""
    roots = tuple(str(root) for root in (state, also_under) if root is not None)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if _exited(entry):
                continue
            cwd = os.readlink(entry / "cwd")
            in_group = os.getpgid(int(entry.name)) == group
        except OSError:
            continue
        if in_group or cwd.startswith(roots):
            found.append(int(entry.name))
    return found


def _exited(proc: Path) -> bool:
    """A zombie (or one being reaped) has ended: only its exit status is left to collect,
    by a parent that may be gone (a container's init need not reap)."""
    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


# Loaded after the demo config: an admin token for the tests' REST calls.
TEST_ADMIN_CONFIG = f"""
c.JupyterHub.services.append({{"name": "test-admin", "api_token": "{ADMIN_TOKEN}"}})
c.JupyterHub.load_roles.append(
    {{"name": "test-admin", "scopes": ["admin:users", "admin:servers", "admin:server_state",
      "read:users:activity", "list:users", "users:activity", "read:metrics"],
      "services": ["test-admin"]}}
)
"""

__all__ = [
    "PORTAL",
    "ROOT",
    "Hub",
    "alive",
    "fabric_on_its_own",
    "free_port",
    "notebook_pid",
    "process_env",
    "running_hub",
    "wait_for",
    "wait_for_portal",
]
