"""composespawner-lab as a user meets it: a real JupyterLab in Chromium, its server side
talking to a strict fake portal (tests/support/fake_portal.py).

The extension is installed into a scratch environment prefix by the same step that
installs it into the stacks' environments (``install_lab_extension``), and the venv's
``jupyter lab`` finds it there through ``JUPYTER_PATH``/``JUPYTER_CONFIG_PATH``: the
prebuilt frontend, the server extension switched on by its config file, nothing else.
``make labextension`` (a prerequisite of ``make pytest``) builds it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Page, expect

from composespawner.launchers.environments import LAB_PACKAGE, install_lab_extension
from harness.browser import shot
from harness.hub import wait_for
from harness.ports import free_port
from tests.support.fake_portal import FakePortal

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

TOKEN = "lab-test-token-0123456789"  # the notebook's own JUPYTERHUB_API_TOKEN
LAB_TOKEN = "lab-login-token-0123456789"  # the browser's login to this JupyterLab
SECONDS = 10_000  # ms Playwright waits for what a 1 s poll should show


@dataclass
class Lab:
    url: str
    portal: FakePortal
    log: Path
    home: Path


def _jupyter_env(
    tmp: Path, prefix: Path, site_packages: Path, portal: FakePortal
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "COMPOSE_"))}
    return {
        **env,
        "HOME": str(tmp / "home"),  # grow writes ~/.composespawner/default.json here
        "PYTHONPATH": str(site_packages),
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "COMPOSE_PORTAL_URL": portal.url,
        "JUPYTERHUB_API_TOKEN": TOKEN,
        "COMPOSE_LAB_POLL_SECONDS": "1",
    }


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # its kernels, if any outlived it


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    prefix = tmp / "env"
    site_packages = prefix / "lib" / "site-packages"
    assert install_lab_extension(prefix, site_packages), (
        f"The extension is not built in {LAB_PACKAGE}: run `make labextension`."
    )
    (tmp / "home").mkdir()
    (tmp / "root").mkdir()
    port = free_port()
    with FakePortal(TOKEN) as portal:
        log = tmp / "lab.log"
        command = [
            *(sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1"),
            *(f"--port={port}", f"--IdentityProvider.token={LAB_TOKEN}"),
            *(f"--ServerApp.root_dir={tmp / 'root'}", "--ServerApp.port_retries=0"),
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                env=_jupyter_env(tmp, prefix, site_packages, portal),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(
                lambda: _up(process, url, log), timeout=90, what=f"JupyterLab at {url} ({log})"
            )
            yield Lab(url, portal, log, tmp / "home")
        finally:
            _stop(process)


def _up(process: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()}")
    answer = requests.get(f"{url}/api/status", params={"token": LAB_TOKEN}, timeout=2)
    return answer.status_code == 200


def _open(page: Page, lab: Lab) -> None:
    lab.portal.reset()
    page.goto(f"{lab.url}/lab?token={LAB_TOKEN}")
    expect(page.locator(".jp-ComposeStatus")).to_contain_text("host-01", timeout=60_000)


def _calls(lab: Lab, method: str, path_end: str) -> list[object]:
    return [body for m, p, body in lab.portal.calls() if m == method and p.endswith(path_end)]


def test_server_side_asks_the_portal_with_the_notebooks_token(lab: Lab) -> None:
    """The server extension's endpoints: the portal's machine, and no write without XSRF."""
    lab.portal.reset()
    machine = requests.get(
        f"{lab.url}/compose/machine", params={"token": LAB_TOKEN}, timeout=10
    ).json()
    assert machine["host"] == "host-01"
    assert [g["id"] for g in machine["gpus"]] == ["gpu-0"]
    # No XSRF token, no write: as the server's own APIs.
    refused = requests.post(f"{lab.url}/compose/grow", json={"count": 1}, timeout=10)
    assert refused.status_code == 403
    assert not _calls(lab, "POST", "/gpus")
    assert lab.portal.refused() == []


def test_status_bar_and_panel_add_and_give_back(lab: Lab, page: Page) -> None:
    _open(page, lab)
    lab.portal.idle("gpu-0", 12 * 60)
    status = page.locator(".jp-ComposeStatus")
    expect(status).to_have_text("host-01 · 1× T4 · idle 12 min", timeout=SECONDS)
    status.click()  # opens the side panel
    panel = page.locator("#composespawner-machine")
    expect(panel).to_be_visible()
    panel.get_by_role("button", name="Add a GPU").click()
    expect(status).to_have_text(re.compile(r"^host-01 · 2× T4"), timeout=SECONDS)
    assert _calls(lab, "POST", "/api/me/server/gpus") == [{"count": 1}]
    expect(page.get_by_text("Your server has 2 GPU(s) now.").first).to_be_visible()
    # As client.grow() does: the server's manifest says what it holds now.
    assert "gpu-1" in (lab.home / ".composespawner" / "default.json").read_text()
    row = panel.locator('[data-gpu="gpu-1"]')
    row.get_by_role("button", name="Give back").click()
    expect(panel.locator('[data-gpu="gpu-1"]')).to_have_count(0, timeout=SECONDS)
    assert _calls(lab, "DELETE", "/api/me/server/gpus/gpu-1") == [None]
    # The user's own give-back is not news: no "went back to the pool" for it.
    expect(page.get_by_text("went back to the pool")).to_have_count(0)
    shot(page, "lab-extension-panel")
    assert lab.portal.refused() == []


def test_warning_shows_once_and_keep_reaches_the_portal(lab: Lab, page: Page) -> None:
    _open(page, lab)
    lab.portal.warn("gpu-0", reclaim_at=time.time() + 25 * 60)
    warning = page.locator(".Toastify__toast", has_text="goes back to the pool")
    expect(warning).to_have_count(1, timeout=SECONDS)
    expect(warning).to_contain_text("To keep it, use it or press Keep.")
    expect(warning.get_by_role("button", name="Keep")).to_be_visible()
    # Polled again and again meanwhile: still one notification for one warning.
    polls = len(_calls(lab, "GET", "/gpus"))
    wait_for(lambda: len(_calls(lab, "GET", "/gpus")) >= polls + 3, 15, "three more polls")
    expect(warning).to_have_count(1)
    page.locator(".jp-ComposeStatus").click()
    keep = page.locator("#composespawner-machine").get_by_role("button", name="Keep")
    expect(keep).to_have_count(1, timeout=SECONDS)
    keep.click()
    wait_for(lambda: _calls(lab, "POST", "/gpus/gpu-0/keep"), 10, "the Keep at the portal")
    expect(page.get_by_text("Kept T4 (gpu-0) for another hour.").first).to_be_visible()
    expect(keep).to_have_count(0, timeout=SECONDS)  # the portal lifted the warning
    expect(warning).to_have_count(0, timeout=SECONDS)  # and its notification went with it
    shot(page, "lab-extension-keep")
    assert lab.portal.refused() == []


def test_a_gpu_taken_while_lab_is_open_is_said(lab: Lab, page: Page) -> None:
    _open(page, lab)
    lab.portal.grow_quietly()
    expect(page.locator(".jp-ComposeStatus")).to_contain_text("2× T4", timeout=SECONDS)
    lab.portal.take("gpu-0")  # as the reclaimer detaches an idle GPU
    expect(page.get_by_text("went back to the pool")).to_have_count(1, timeout=SECONDS)
    expect(page.locator(".jp-ComposeStatus")).to_contain_text("1× T4")
    assert lab.portal.refused() == []
