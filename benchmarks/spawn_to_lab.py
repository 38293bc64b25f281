"""From form submit to JupyterLab loaded, composespawner versus the stock spawner.

Both run in one go on the demo config: the same hub, proxy and JupyterLab; the
baseline swaps in JupyterHub's SimpleLocalProcessSpawner (no form, no fabric).
For composespawner the compose step (ledger 'requested' to 'composed') is
reported too. Writes benchmarks/results/spawn_to_lab.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from composespawner.ledger import Ledger
from tests.hubharness import Hub, notebook_pid, process_env, running_hub, wait_for
from tests.support.browser import CHROMIUM, FLAGS, log_in

RUNS = 5
RESULTS = Path(__file__).with_name("results")
# The stock spawner runs JupyterLab as the hub's account: as root (here) it
# must be let, where composespawner switches to its notebook account.
BASELINE_CONFIG = """
import os
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = c.ComposeSpawner.home_dir_template
if os.getuid() == 0:
    c.SimpleLocalProcessSpawner.args = ["--allow-root"]
"""


def submit_and_wait(page: Page, hub: Hub, with_form: bool) -> float:
    """Seconds from the action that starts the spawn to JupyterLab's main area showing.

    With a form that is the submit; without one, opening /hub/spawn itself starts
    the server (the home page's "Start My Server"), so the clock starts before it.
    """
    if with_form:
        page.goto(f"{hub.url}/hub/spawn")
        page.check("#gpu-t4")
        page.select_option("#gpu_count", "2")
        started = time.perf_counter()
        page.click("form button[type=submit]")
    else:
        started = time.perf_counter()
        page.goto(f"{hub.url}/hub/spawn")
    page.wait_for_url("**/user/student1/lab**", timeout=120_000)
    page.locator("#jp-main-dock-panel").wait_for(state="visible", timeout=120_000)
    return time.perf_counter() - started


def steps(hub: Hub) -> tuple[float, float]:
    """Seconds of the compose step (requested → composed) and the launch (launching → running)."""
    machine_id = process_env(notebook_pid(hub, "student1"))["COMPOSE_MACHINE_ID"]
    ledger = Ledger(hub.ledger_url())
    try:
        events = {e.to_state: e.at for e in ledger.events(machine_id)}
    finally:
        ledger.close()
    compose = events["composed"] - events["requested"]
    launch = events["running"] - events["launching"]
    return compose.total_seconds(), launch.total_seconds()


def measure(
    with_form: bool, extra_config: str = ""
) -> tuple[list[float], list[float], list[float]]:
    totals: list[float] = []
    composes: list[float] = []
    launches: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_hub(Path(tmp), extra_config) as hub,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_context().new_page()
        log_in(page, hub, "student1")
        for _ in range(RUNS):
            totals.append(submit_and_wait(page, hub, with_form))
            if with_form:
                compose, launch = steps(hub)
                composes.append(compose)
                launches.append(launch)
            hub.stop("student1")
            wait_for(lambda: hub.composed_hosts() == {}, 30, "devices back")
        browser.close()
    return totals, composes, launches


def main() -> None:
    ours, composes, launches = measure(with_form=True)
    base, _, _ = measure(with_form=False, extra_config=BASELINE_CONFIG)
    result = {
        "runs": RUNS,
        "compose_median_s": statistics.median(ours),
        "compose_step_median_s": statistics.median(composes),
        "launch_step_median_s": statistics.median(launches),
        "baseline_median_s": statistics.median(base),
        "median_ratio": statistics.median(ours) / statistics.median(base),
        "compose_runs_s": ours,
        "baseline_runs_s": base,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spawn_to_lab.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':28}{'median s':>10}")
    print(f"{'composespawner (submit→lab)':28}{result['compose_median_s']:>10.2f}")
    print(f"{'  of which compose step':28}{result['compose_step_median_s']:>10.3f}")
    print(f"{'  of which notebook launch':28}{result['launch_step_median_s']:>10.2f}")
    print(f"{'stock spawner (start→lab)':28}{result['baseline_median_s']:>10.2f}")
    print(f"{'ratio':28}{result['median_ratio']:>10.2f}")


if __name__ == "__main__":
    main()
