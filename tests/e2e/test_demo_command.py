"""``composespawner demo``: the fabric beside the hub, stopped after it.

Ctrl-C in a terminal signals the whole foreground process group. The demo must
stop the hub first, whose shutdown stops the notebooks and gives their devices
back over the fabric, and only then the fabric simulator.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hub import alive, free_ports, notebook_pid, running_hub

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_hub_and_its_notebooks_before_the_fabric(tmp_path: Path) -> None:
    with running_hub(tmp_path, demo_command=True) as hub:
        response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 2})
        assert response.status_code in (201, 202), response.text
        hub.wait_ready("student1")
        notebook = notebook_pid(hub, "student1")
        (jupyterhub,) = hub.processes("bin/jupyterhub -f")  # not the reconciler, which reads it
        (simulator,) = hub.processes("fabric-simulator")
        assert hub.composed_hosts(), "the notebook's machine is composed"

        os.killpg(hub.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        hub.proc.wait(timeout=120)

        assert hub.proc.returncode == 0, hub.log_tail()
        assert not any(alive(pid) for pid in (notebook, jupyterhub, simulator))
        # The simulator saves its state after every change: what it last saved is
        # what it held when it stopped. Every device was given back before that.
        saved = json.loads((hub.state / "fabric-state.json").read_text())
        assert {host: h["attached"] for host, h in saved["hosts"].items() if h["attached"]} == {}
        assert "released" in hub.log_path.read_text()
    # running_hub's teardown fails the test if any process of the demo is left.


@pytest.mark.timeout(60)
def test_the_demo_refuses_a_fabric_port_that_is_taken(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {
            **os.environ,
            "COMPOSE_STATE_DIR": str(tmp_path / "state"),
            "COMPOSE_FABRIC_PORT": str(port),
            # Should the fabric check fail, the hub would not take anyone's ports.
            **{
                name: str(number)
                for name, number in free_ports(
                    "COMPOSE_HUB_PORT",
                    "COMPOSE_PROXY_API_PORT",
                    "COMPOSE_HUB_API_PORT",
                    avoid={port},
                ).items()
            },
        }
        done = subprocess.run(
            [str(Path(sys.executable).parent / "composespawner"), "demo"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 1
    assert f"Port {port}, the fabric simulator's, is in use" in done.stderr
    assert "COMPOSE_FABRIC_PORT" in done.stderr
