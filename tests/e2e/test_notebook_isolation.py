"""A notebook of the demo cannot read the hub's secrets, even when the hub runs as root.

Each check opens a file with the notebook process's own credentials (uid, gid,
groups, read from /proc), as code in the notebook would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hub import Hub, notebook_pid, process_env, running_hub

pytestmark = pytest.mark.e2e
# Exit status 13 (EACCES) when refused, 0 when the file could be read.
PROBE = """
import sys
try:
    open(sys.argv[1], "rb").read(1)
except PermissionError:
    sys.exit(13)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub")) as hub:
        yield hub


def credentials(pid: int) -> tuple[int, int, list[int]]:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    uid = int(status["Uid"].split()[1])  # effective
    gid = int(status["Gid"].split()[1])
    return uid, gid, [int(g) for g in status["Groups"].split()]


def readable_as(pid: int, path: Path) -> bool:
    uid, gid, groups = credentials(pid)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        user=uid,
        group=gid,
        extra_groups=groups,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode in (0, 13), done.stderr
    return done.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the hub runs notebooks as itself when not root")
@pytest.mark.timeout(180)
def test_a_root_hubs_notebook_runs_unprivileged_and_cannot_read_the_hubs_state(hub: Hub) -> None:
    response = hub.spawn("student1", {"gpu_model": "t4", "gpu_count": 1})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready("student1")
    pid = notebook_pid(hub, "student1")

    uid, _, groups = credentials(pid)
    assert uid != 0
    assert 0 not in groups
    assert "COMPOSE_FABRIC_PASSWORD" not in process_env(pid)
    home = hub.homes / "student1"
    assert readable_as(pid, Path(f"/proc/{pid}/environ"))  # the probe itself works
    assert home.stat().st_uid == uid
    assert home.stat().st_mode & 0o777 == 0o700
    for secret in (
        Path(f"/proc/{hub.proc.pid}/environ"),  # the hub's: the fabric password is in it
        hub.state / "jupyterhub_cookie_secret",
        hub.state / "jupyterhub.sqlite",
        hub.state / "composespawner.sqlite",
        hub.state / "fabric-state.json",
    ):
        assert secret.exists(), secret
        assert not readable_as(pid, secret), f"the notebook can read {secret}"

    lab = hub.login("student1").get(f"{hub.url}/user/student1/lab", timeout=30)
    assert lab.status_code == 200
    assert "JupyterLab" in lab.text
    hub.stop("student1")
