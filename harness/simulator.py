"""The fabric simulator as a process of the test's own, and its ``/sim`` switches over HTTP.

``SimulatorProcess`` starts ``fabricsim`` (or the ``composespawner
fabric-simulator`` console script, as production does) on a free port of
127.0.0.1, over https with :mod:`harness.tls` files if given, logging to a
file; it waits for the Redfish service root to answer with one bounded poll
and, on ``stop()`` (or leaving its ``with``), sends SIGTERM and SIGKILL after a
timeout, so that no simulator outlives its test.

``SimulatorSwitches`` drives the test-only API of a simulator run with
``--faults-api`` (see ``fabricsim/faults.py``): the fault switches of
``/sim/faults`` and the fabric's own view in ``/sim/state``, which no fault touches.
"""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from harness.paths import HUB_CONFIG, ROOT
from harness.ports import free_port
from harness.tls import TLSFiles

INVENTORY = HUB_CONFIG / "fabric_inventory.toml"
# The simulator's own defaults: what its tests (tests/fabric_sim) log in with.
CREDENTIALS = ("admin", "fabric-password")
MODULE = (sys.executable, "-m", "fabricsim")
CONSOLE_SCRIPT = (str(Path(sys.executable).parent / "composespawner"), "fabric-simulator")
READY_WITHIN_S = 30.0  # a cold start on 2 busy cores takes a few seconds
READY_EVERY_S = 0.05
STOP_WITHIN_S = 10.0
SWITCH_TIMEOUT_S = 10.0

# Every fault setting off, as ``GET /sim/faults`` shows it after a DELETE.
NO_FAULTS: dict[str, Any] = {
    "latency_s": 0.0,
    "error_rate": 0.0,
    "seed": 0,
    "fail_after_attachments": None,
    "task_failure": False,
    "drop_connections": False,
    "unreachable_for_s": 0.0,
    "stale_etags": False,
    "disabled_blocks": [],
}


@dataclass(frozen=True)
class SimulatorSwitches:
    """The ``/sim`` API of the simulator at ``url`` (no auth, no faults apply to it)."""

    url: str
    ca_bundle: Path | None = None  # for https: the CA that signed the simulator's certificate

    def faults(self, **settings: Any) -> None:
        """Replace every fault setting (omitted ones are off); its counters restart."""
        answer = self._call("PUT", "/sim/faults", json=settings)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {**NO_FAULTS, **settings}, answer.json()

    def clear_faults(self) -> None:
        answer = self._call("DELETE", "/sim/faults")
        assert answer.status_code == 200, answer.text

    def state(self) -> dict[str, Any]:
        """The fabric as the simulator knows it: ``hosts``, ``composed``, ``disabled_blocks``."""
        answer = self._call("GET", "/sim/state")
        assert answer.status_code == 200, answer.text
        document: dict[str, Any] = answer.json()
        return document

    def reset(self) -> None:
        """Detach everything, clear every tag and fault (for tests sharing one simulator)."""
        answer = self._call("DELETE", "/sim/state")
        assert answer.status_code == 204, answer.text

    def attached(self) -> dict[str, list[str]]:
        """Devices attached per host, for hosts that have any."""
        hosts = self.state()["hosts"].items()
        return {host: state["attached"] for host, state in hosts if state["attached"]}

    def tagged(self) -> dict[str, Any]:
        """The composition tag per host, for hosts that have one."""
        return {host: state["tag"] for host, state in self.state()["hosts"].items() if state["tag"]}

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        verify: str | bool = str(self.ca_bundle) if self.ca_bundle else True
        return requests.request(
            method, f"{self.url}{path}", verify=verify, timeout=SWITCH_TIMEOUT_S, **kwargs
        )


class SimulatorProcess:
    """One simulator subprocess on a free port; restartable with the same arguments.

    ``args`` come after ``--inventory`` and ``--port`` (leave the port out with
    ``port_option=False``: the simulator then binds where ``env`` tells it).
    """

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        tls: TLSFiles | None = None,
        command: Sequence[str] = MODULE,
        credentials: tuple[str, str] = CREDENTIALS,
        env: Mapping[str, str] | None = None,
        port_option: bool = True,
        port: int | None = None,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.tls = tls
        self.log_path = log_path
        self.credentials = credentials
        self.command = [*command, "--inventory", str(INVENTORY)]
        self.command += ["--port", str(self.port)] if port_option else []
        self.command += [*args]
        if tls is not None:
            self.command += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
        self.env = {
            **os.environ,
            "COMPOSE_FABRIC_USERNAME": credentials[0],
            "COMPOSE_FABRIC_PASSWORD": credentials[1],
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def switches(self) -> SimulatorSwitches:
        """Its ``/sim`` API (served only when started with ``--faults-api``)."""
        return SimulatorSwitches(self.url, self.tls.ca_bundle if self.tls else None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> None:
        """Start it and wait until its service root answers; stop it and fail if it does not."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int:
        """SIGTERM (SIGCONT first, in case a test froze it), SIGKILL if it lingers; its status.

        A simulator that had to be killed fails the test, after it is gone.
        """
        process, self.process = self.process, None
        if process is None:
            return 0
        with suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            return process.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_WITHIN_S)
            raise AssertionError(
                f"the simulator ignored SIGTERM for {STOP_WITHIN_S} s and was killed:\n{self.log()}"
            ) from None

    def restart(self) -> None:
        status = self.stop()
        assert status == 0, f"the simulator exited with {status}:\n{self.log()}"
        self.start()

    @contextmanager
    def hung(self) -> Iterator[None]:
        """The simulator frozen (SIGSTOP): it accepts connections and never answers."""
        assert self.process is not None, "hung() on a simulator that is not running"
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)

    def __enter__(self) -> SimulatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.process is not None
        context = self.tls.client_context() if self.tls else None
        deadline = time.monotonic() + READY_WITHIN_S
        while not _answers(f"{self.url}/redfish/v1/", context):
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the simulator exited with {self.process.returncode}:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the simulator did not answer within {READY_WITHIN_S} s:\n{self.log()}"
                )
            time.sleep(READY_EVERY_S)  # the poll's interval, bounded by the deadline


def _answers(url: str, context: ssl.SSLContext | None) -> bool:
    """Whether the service root answers 200 (it needs no login)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0, context=context) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return False
