"""The demo command's plan, and with-hub's refusal when the hub is already gone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from composespawner.commands.embedded import config_dir
from composespawner.commands.supervise import DemoError, check_port_free, demo_plan


def test_the_demo_runs_the_fabric_beside_the_hub_with_one_set_of_credentials(
    tmp_path: Path,
) -> None:
    plan = demo_plan(
        {"COMPOSE_STATE_DIR": str(tmp_path), "COMPOSE_FABRIC_PORT": "9123"},
        Path("/venv/bin"),
        ["--debug"],
    )
    assert plan.env["COMPOSE_FABRIC_EXTERNAL"] == "1"  # the hub starts no simulator itself
    assert plan.env["COMPOSE_STATE_DIR"] == str(tmp_path)
    assert plan.fabric_port == 9123
    assert plan.simulator[:2] == ["/venv/bin/composespawner", "fabric-simulator"]
    assert plan.simulator[plan.simulator.index("--port") + 1] == "9123"
    assert plan.simulator[plan.simulator.index("--state-file") + 1] == str(
        tmp_path / "fabric-state.json"
    )
    assert plan.hub == [
        "/venv/bin/jupyterhub",
        "-f",
        str(config_dir() / "jupyterhub_config.py"),
        "--debug",
    ]
    assert plan.env["COMPOSE_FABRIC_PASSWORD"]


def test_the_demo_keeps_credentials_given_in_the_environment(tmp_path: Path) -> None:
    environ = {"COMPOSE_STATE_DIR": str(tmp_path), "COMPOSE_FABRIC_PASSWORD": "s3cret"}
    assert demo_plan(environ, Path("/b"), []).env["COMPOSE_FABRIC_PASSWORD"] == "s3cret"


@pytest.mark.timeout(30)
def test_with_hub_refuses_to_start_a_service_whose_hub_is_gone() -> None:
    # pid 1 is nobody's parent here: as if the hub died before the service started.
    composespawner = str(Path(sys.executable).parent / "composespawner")
    done = subprocess.run(
        [composespawner, "with-hub", "--hub-pid=1", "--", "true"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 1
    assert "the hub (pid 1) is gone" in done.stderr


@pytest.mark.timeout(30)
def test_a_service_started_with_sigint_ignored_gets_it_back_so_the_hub_can_stop_it() -> None:
    # As from a hub started in a script's background: SIGINT comes ignored, and an
    # ignored signal would stay ignored across exec.
    composespawner = str(Path(sys.executable).parent / "composespawner")
    report = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run(
        [
            composespawner,
            "with-hub",
            f"--hub-pid={os.getpid()}",
            "--",
            sys.executable,
            "-c",
            report,
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def _leave_time_wait_on(port: int) -> None:
    """Serve one connection on the port and close it server side first, as the simulator does."""
    with (
        socket.create_server(("127.0.0.1", port)) as server,
        socket.create_connection(("127.0.0.1", port), timeout=5) as client,
    ):
        accepted, _ = server.accept()
        accepted.close()  # the side that closes first keeps TIME_WAIT
        client.recv(1)  # the close reached the client before it closes too


@pytest.mark.timeout(30)
def test_a_port_left_in_time_wait_by_a_stopped_demo_is_free() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    _leave_time_wait_on(port)
    # The condition the demo met after Ctrl-C: a plain bind is refused ...
    with socket.socket() as plain, pytest.raises(OSError, match="in use"):
        plain.bind(("127.0.0.1", port))
    # ... but nothing listens, so the next demo may start.
    check_port_free(port)


@pytest.mark.timeout(30)
def test_a_port_something_listens_on_is_refused_with_what_to_do() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(DemoError, match=f"Port {port}.*COMPOSE_FABRIC_PORT"):
            check_port_free(port)
