"""From form submit to JupyterLab loaded, composespawner versus the stock spawner.

Both run in one go on the demo config: the same hub, proxy and JupyterLab (the
default stack's environment, which ``make stacks`` builds); the baseline swaps
in JupyterHub's SimpleLocalProcessSpawner (no form, no fabric, no stack).
For composespawner the compose step (ledger 'requested' to 'composed') is
reported too. A third hub runs the same with ``compose-ssh``: the notebook starts on
its composed host (a real sshd on a loopback address of its own, the host agent as
the hub key's forced command) as the user's own account. Writes
benchmarks/results/spawn_to_lab.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from benchmarks.interrupt import interrupt_on_sigterm
from composespawner.domain.catalog import Catalog
from composespawner.launchers.environments import StackEnvironments, default_root
from composespawner.ledger import Ledger
from harness.browser import CHROMIUM, FLAGS, log_in
from harness.hub import HUB_CONFIG, Hub, notebook_pid, process_env, running_hub, wait_for
from harness.sshhosts import SSHHosts, ssh_hosts

RUNS = 15
RESULTS = Path(__file__).with_name("results")
# The stock spawner runs JupyterLab as the hub's account: as root (here) it
# must be let, where composespawner switches to its notebook account.
BASELINE_CONFIG = """
import os
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = c.ComposeSpawner.home_dir_template
c.SimpleLocalProcessSpawner.cmd = [{server!r}]
if os.getuid() == 0:
    c.SimpleLocalProcessSpawner.args = ["--allow-root"]
"""


def default_stack_server() -> str:
    """The default stack's jupyterhub-singleuser: the JupyterLab composespawner starts."""
    stack = Catalog.from_file(HUB_CONFIG / "catalog.toml").stacks[0]
    assert stack.common is not None
    environment = StackEnvironments(default_root(), stack.common).ready(stack)
    if environment is None:
        raise SystemExit(f"The {stack.label} stack is not built: run `make stacks` first")
    return str(environment.bin / "jupyterhub-singleuser")


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


def steps(hub: Hub, hosts: SSHHosts | None) -> tuple[float, float]:
    """Seconds of the compose step (requested → composed) and the launch (launching → running)."""
    if hosts is None:
        pid = notebook_pid(hub, "student1")
    else:  # on a compute host (this machine): its agent knows the process
        found = hosts.notebook("student1")
        assert found is not None, "no notebook of student1's on any host"
        pid = int(found[1]["pid"])
    machine_id = process_env(pid)["COMPOSE_MACHINE_ID"]
    ledger = Ledger(hub.ledger_url())
    try:
        events = {e.to_state: e.at for e in ledger.events(machine_id)}
    finally:
        ledger.close()
    compose = events["composed"] - events["requested"]
    launch = events["running"] - events["launching"]
    return compose.total_seconds(), launch.total_seconds()


@dataclass
class Side:
    """One hub and its browser context, measured turn about with the other."""

    hub: Hub
    page: Page
    with_form: bool
    hosts: SSHHosts | None = None  # compose-ssh's compute hosts
    first_s: float = 0.0
    totals: list[float] = field(default_factory=list)
    composes: list[float] = field(default_factory=list)
    launches: list[float] = field(default_factory=list)

    def spawn_and_stop(self) -> float:
        total = submit_and_wait(self.page, self.hub, self.with_form)
        if self.with_form:
            compose, launch = steps(self.hub, self.hosts)
            self.composes.append(compose)
            self.launches.append(launch)
        # Leave JupyterLab first, as a user closes the tab: a lab page left open
        # keeps polling its stopped server while the other hub is being timed.
        self.page.goto("about:blank")
        self.hub.stop("student1")
        wait_for(lambda: self.hub.composed_hosts() == {}, 30, "devices back")
        return total


def measure() -> tuple[Side, Side, Side, Side]:
    """Two phases, each alternating one side with stock: first the local launcher (what
    the gate is on), then compose-ssh, whose hub and hosts start only for it.
    Each browser context's first load fetches JupyterLab's assets into an empty cache
    (1-3 s either way); that run is kept apart as ``first_s``, not timed.
    """
    stock_config = BASELINE_CONFIG.format(server=default_stack_server())
    with ExitStack() as stack:

        def folder() -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory()))

        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        stack.callback(browser.close)

        def side(hub: Hub, with_form: bool, hosts: SSHHosts | None = None) -> Side:
            page = browser.new_context().new_page()
            log_in(page, hub, "student1")
            made = Side(hub, page, with_form, hosts)
            made.first_s = made.spawn_and_stop()
            return made

        def alternate(pair: tuple[Side, Side]) -> None:
            for run in range(RUNS):
                # Who goes first alternates: a spawn right after a stop may pay for it.
                for one in pair if run % 2 == 0 else pair[::-1]:
                    one.totals.append(one.spawn_and_stop())

        stock = side(stack.enter_context(running_hub(folder(), stock_config)), False)
        ours = side(stack.enter_context(running_hub(folder())), True)
        alternate((ours, stock))
        # compose-ssh's hub and hosts only now: up beside the first pair, they made it
        # slower (1.19-1.23 where it was 1.01 alone, the same hour).
        hosts = stack.enter_context(ssh_hosts(folder(), users=("student1",)))
        ssh = side(stack.enter_context(running_hub(folder(), hosts.hub_config())), True, hosts)
        stock_beside_ssh = Side(stock.hub, stock.page, with_form=False)
        alternate((ssh, stock_beside_ssh))
        return ours, ssh, stock, stock_beside_ssh


def main() -> None:
    ours, ssh, stock, stock_beside_ssh = measure()
    result = {
        "runs": RUNS,
        "compose_median_s": statistics.median(ours.totals),
        "compose_step_median_s": statistics.median(ours.composes),
        "launch_step_median_s": statistics.median(ours.launches),
        "baseline_median_s": statistics.median(stock.totals),
        "median_ratio": statistics.median(ours.totals) / statistics.median(stock.totals),
        # Each run against the stock run next to it in time: the machine's own
        # slow spells (seconds at a time here) fall on both of a pair.
        "paired_median_ratio": statistics.median(
            a / b for a, b in zip(ours.totals, stock.totals, strict=True)
        ),
        "compose_runs_s": ours.totals,
        "baseline_runs_s": stock.totals,
        "compose_first_load_s": ours.first_s,
        "baseline_first_load_s": stock.first_s,
        # compose-ssh: the notebook started on its compute host by the host agent
        "ssh_median_s": statistics.median(ssh.totals),
        "ssh_compose_step_median_s": statistics.median(ssh.composes),
        "ssh_launch_step_median_s": statistics.median(ssh.launches),
        "ssh_median_ratio": statistics.median(ssh.totals)
        / statistics.median(stock_beside_ssh.totals),
        "ssh_baseline_median_s": statistics.median(stock_beside_ssh.totals),
        "ssh_vs_local_median_ratio": statistics.median(ssh.totals) / statistics.median(ours.totals),
        "ssh_runs_s": ssh.totals,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spawn_to_lab.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':28}{'median s':>10}")
    print(f"{'composespawner (submit→lab)':28}{result['compose_median_s']:>10.2f}")
    print(f"{'  of which compose step':28}{result['compose_step_median_s']:>10.3f}")
    print(f"{'  of which notebook launch':28}{result['launch_step_median_s']:>10.2f}")
    print(f"{'compose-ssh (submit→lab)':28}{result['ssh_median_s']:>10.2f}")
    print(f"{'  of which compose step':28}{result['ssh_compose_step_median_s']:>10.3f}")
    print(f"{'  of which notebook launch':28}{result['ssh_launch_step_median_s']:>10.2f}")
    print(f"{'stock spawner (start→lab)':28}{result['baseline_median_s']:>10.2f}")
    print(f"{'ratio':28}{result['median_ratio']:>10.2f}")
    print(f"{'ratio, run by run (median)':28}{result['paired_median_ratio']:>10.2f}")
    print(f"{'compose-ssh ratio':28}{result['ssh_median_ratio']:>10.2f}")
    print(f"{'compose-ssh / local':28}{result['ssh_vs_local_median_ratio']:>10.2f}")


if __name__ == "__main__":
    interrupt_on_sigterm()
    main()
