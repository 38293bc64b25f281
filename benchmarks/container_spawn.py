"""Notebooks in containers: composespawner's (``compose-podman``) against the stock
spawner and against stock DockerSpawner, side by side in one run.

Three hubs, each the demo hub with one spawner:

* ``compose-podman``: the form's choices composed, then the notebook in a container of
  its own from the PyTorch CPU image by digest (``make images``);
* stock ``SimpleLocalProcessSpawner``: the same JupyterLab as a local process (the
  stack's environment, ``make stacks``), no container;
* stock DockerSpawner 14 on podman's Docker-compatible socket (``podman system
  service``), the same image by digest, on the host's network as DockerSpawner's
  documentation has it for a hub on loopback (its default bridge cannot reach a hub
  listening on loopback only).

``to_lab``: a student's click to JupyterLab's main area, in Chromium, 10 runs a side
turn about (each browser context's first load is kept apart). ``storm``: 40 students
start at once through the API with the stand-in notebook (inside the image for both
container sides), 3 rounds, the sides taking turns to go first; p95 submit → ready.
Gates: composespawner in containers at most 1.2× stock LocalProcessSpawner, and at
most 1.0× DockerSpawner, on both figures.

``python -m benchmarks container_spawn``. Writes benchmarks/results/container_spawn.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from benchmarks.hubload import (
    RESULTS,
    STANDIN,
    STOCK_SPAWNER_CONFIG,
    FabricSize,
    percentile,
    ratio,
    write_result,
)
from benchmarks.interrupt import interrupt_on_sigterm
from benchmarks.spawn_storm import run_side
from benchmarks.spawn_to_lab import BASELINE_CONFIG, Side, default_stack_server
from harness import images
from harness.browser import CHROMIUM, FLAGS, log_in
from harness.hub import running_hub

LAB_RUNS = 10
STORM_USERS = 40
STORM_ROUNDS = 3
STORM_FABRIC = FabricSize(zones=2, hosts_per_zone=4, gpus_per_zone=24)


def podman_config(image: str) -> str:
    return (
        'c.JupyterHub.spawner_class = "compose-podman"\n'
        f'c.PodmanLauncher.stack_images = {{"pytorch": {image!r}}}\n'
        'c.PodmanLauncher.stack_variant = "cpu"\n'
    )


def docker_config(image: str, socket_url: str) -> str:
    """Stock DockerSpawner, on the host's network as its documentation says for a hub on
    loopback: its own get_ip_and_port override, and a free port per start."""
    return f"""
from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port


class HostNetworkDockerSpawner(DockerSpawner):
    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        return self.host_ip, self.port


c.JupyterHub.spawner_class = HostNetworkDockerSpawner
c.DockerSpawner.image = {image!r}
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.network_name = "host"
c.DockerSpawner.ip = "127.0.0.1"  # on the host's network: its loopback, as every server here
c.DockerSpawner.use_internal_ip = True  # no port to publish on the host's own network
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]  # the image's (the demo's is a host path)
c.DockerSpawner.remove = True
c.DockerSpawner.client_kwargs = {{"base_url": {socket_url!r}}}
"""


def standin_in_image() -> str:
    """The stand-in notebook, run by the image's Python (its file is not in the image)."""
    command = ["python", "-I", "-c", STANDIN.read_text()]
    return f"c.Spawner.cmd = {command!r}\nc.DockerSpawner.cmd = {command!r}\n"


def to_lab(image: str, socket_url: str) -> dict[str, Any]:
    stock_config = BASELINE_CONFIG.format(server=default_stack_server())
    with ExitStack() as stack:

        def folder() -> Path:
            return Path(stack.enter_context(tempfile.TemporaryDirectory()))

        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        stack.callback(browser.close)

        def side(config: str, with_form: bool) -> Side:
            hub = stack.enter_context(running_hub(folder(), config))
            page = browser.new_context().new_page()
            log_in(page, hub, "student1")
            made = Side(hub, page, with_form)
            made.first_s = made.spawn_and_stop()
            return made

        ours = side(podman_config(image), True)
        stock = side(stock_config, False)
        docker = side(docker_config(image, socket_url), False)
        sides = [ours, stock, docker]
        for run in range(LAB_RUNS):
            for one in sides[run % 3 :] + sides[: run % 3]:  # who goes first turns about
                one.totals.append(one.spawn_and_stop())
    medians = [statistics.median(s.totals) for s in sides]
    return {
        "runs": LAB_RUNS,
        "containers_median_s": medians[0],
        "stock_median_s": medians[1],
        "dockerspawner_median_s": medians[2],
        "vs_stock_ratio": medians[0] / medians[1],
        "vs_dockerspawner_ratio": medians[0] / medians[2],
        "containers_runs_s": ours.totals,
        "stock_runs_s": stock.totals,
        "dockerspawner_runs_s": docker.totals,
        "first_loads_s": [s.first_s for s in sides],
    }


def storm(image: str, socket_url: str) -> dict[str, Any]:
    standin = standin_in_image()
    spawners = {
        "containers": ("ComposePodmanSpawner", podman_config(image) + standin),
        "stock": ("SimpleLocalProcessSpawner", STOCK_SPAWNER_CONFIG),
        "dockerspawner": ("DockerSpawner", docker_config(image, socket_url) + standin),
    }
    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(STORM_ROUNDS):
        order = list(spawners)
        order = order[n % 3 :] + order[: n % 3]
        summaries = {}
        for name in order:
            side = run_side(
                STORM_USERS,
                stock=name != "containers",
                spawn_limit=STORM_USERS,
                size=STORM_FABRIC,
                spawner=spawners[name],
                name_as="container_spawn",
            )
            summaries[name] = side.summary()
        rounds.append(summaries)

    def p95_ratio(other: str) -> float:
        return statistics.median(ratio(r["containers"]["p95_s"], r[other]["p95_s"]) for r in rounds)

    return {
        "users": STORM_USERS,
        "rounds": STORM_ROUNDS,
        "p95_vs_stock_ratio": p95_ratio("stock"),
        "p95_vs_dockerspawner_ratio": p95_ratio("dockerspawner"),
        "failures": sum(r["containers"]["failures"] for r in rounds),
        "stock_failures": sum(r["stock"]["failures"] for r in rounds),
        "dockerspawner_failures": sum(r["dockerspawner"]["failures"] for r in rounds),
        "p95_s": {name: percentile([r[name]["p95_s"] for r in rounds], 50) for name in spawners},
        "per_round": rounds,
    }


def main() -> None:
    built = images.built().get("pytorch-cpu")
    if built is None:
        raise SystemExit("No PyTorch CPU image: run `make images` first")
    # The hubs run podman as make images configured it (runc, the cache's storage).
    os.environ.update({k: v for k, v in images.podman_env().items() if k.startswith("CONTAINERS")})
    with images.podman_socket() as socket_url:
        lab = to_lab(built.by_digest, socket_url)
        crowd = storm(built.by_digest, socket_url)
    result = {
        "image": built.by_digest,
        "to_lab": lab,
        "storm": crowd,
        # the gates' figures
        "to_lab_vs_stock_ratio": lab["vs_stock_ratio"],
        "to_lab_vs_dockerspawner_ratio": lab["vs_dockerspawner_ratio"],
        "storm_p95_vs_stock_ratio": crowd["p95_vs_stock_ratio"],
        "storm_p95_vs_dockerspawner_ratio": crowd["p95_vs_dockerspawner_ratio"],
        "failures": crowd["failures"],
    }
    write_result(RESULTS / "container_spawn.json", result)
    print(f"{'':34}{'containers':>12}{'stock':>10}{'DockerSpawner':>15}")
    print(
        f"{'click → JupyterLab, median s':34}{lab['containers_median_s']:>12.2f}"
        f"{lab['stock_median_s']:>10.2f}{lab['dockerspawner_median_s']:>15.2f}"
    )
    p95 = crowd["p95_s"]
    print(
        f"{f'{STORM_USERS} at once, p95 s (median round)':34}{p95['containers']:>12.2f}"
        f"{p95['stock']:>10.2f}{p95['dockerspawner']:>15.2f}"
    )
    print(
        f"ratios: to lab {lab['vs_stock_ratio']:.2f}× stock, "
        f"{lab['vs_dockerspawner_ratio']:.2f}× DockerSpawner; storm p95 "
        f"{crowd['p95_vs_stock_ratio']:.2f}× stock, "
        f"{crowd['p95_vs_dockerspawner_ratio']:.2f}× DockerSpawner"
    )


if __name__ == "__main__":
    interrupt_on_sigterm()
    main()
