"""Shared pieces of the load benchmarks (spawn_storm, release_latency).

A hub under load here is the real demo hub of ``harness.hub`` with three
things changed, all through the harness's extra config and environment:

* notebooks are :mod:`benchmarks.standin_notebook` (a stdlib HTTP answer), so
  hundreds of servers fit on two cores and the spawner's own cost shows;
* the fabric simulator serves a generated inventory big enough for the load;
* the stock side swaps in JupyterHub's SimpleLocalProcessSpawner, as
  ``spawn_to_lab`` does, on the same hub, proxy, simulator and stand-in.

Also here: the fabric and ledger checks (who holds what), percentiles and the
hub log's error count.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from composespawner.ledger import Ledger, Machine
from fabricsim.inventory import HOST_ID_DIGITS
from harness.hub import ADMIN_TOKEN, Hub

RESULTS = Path(__file__).with_name("results")
STANDIN = Path(__file__).with_name("standin_notebook.py")
# -I: no user site, no PYTHON* variables: the stand-in starts in ~30 ms.
STANDIN_COMMAND = (sys.executable, "-I", str(STANDIN))
STANDIN_ENV = {"COMPOSE_NOTEBOOK_CMD": " ".join(STANDIN_COMMAND)}
# Same swap as benchmarks/spawn_to_lab.py's BASELINE_CONFIG (not imported: that
# module needs Playwright).
STOCK_SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = c.ComposeSpawner.home_dir_template
"""
GPU_MODEL = "NVIDIA T4"  # hub_config/catalog.toml's fabric model of "t4"
# Every benchmark host, as the demo's: 64 cores and 512 GiB, 16 device slots (the catalog's).
HOST_CORES = 64
HOST_MEMORY_GIB = 512
HOST_SLOTS = 16


# -- the generated fabric ----------------------------------------------------------


@dataclass(frozen=True)
class FabricSize:
    """A benchmark fabric: ``zones`` racks, each alike."""

    zones: int
    hosts_per_zone: int
    gpus_per_zone: int
    nics_per_zone: int = 0  # 25 Gb/s cards
    drives_per_zone: int = 0  # 1920 GB NVMe

    @property
    def hosts(self) -> int:
        return self.zones * self.hosts_per_zone

    @property
    def gpus(self) -> int:
        return self.zones * self.gpus_per_zone


def fabric_for(machines: int, *, per_zone: int = 10, spare: float = 0.25) -> FabricSize:
    """Room for ``machines`` one-T4 machines with ``spare`` headroom, ``per_zone`` hosts a rack."""
    zones = max(1, math.ceil(machines * (1 + spare) / per_zone))
    return FabricSize(zones=zones, hosts_per_zone=per_zone, gpus_per_zone=per_zone)


def shared_fabric_for(
    machines: int, *, per_host: int = 8, hosts_per_zone: int = 5, spare: float = 0.25
) -> FabricSize:
    """Room for ``machines`` one-T4 machines sharing hosts, ``per_host`` on each (200 users:
    25 hosts in 5 racks), and T4s with ``spare`` headroom."""
    zones = max(1, math.ceil(machines / (per_host * hosts_per_zone)))
    gpus = math.ceil(machines * (1 + spare) / zones)
    return FabricSize(zones=zones, hosts_per_zone=hosts_per_zone, gpus_per_zone=gpus)


def inventory_toml(size: FabricSize) -> str:
    """An inventory in hub_config/fabric_inventory.toml's schema: rack ``z`` is ``bench-z``."""
    parts = [
        "[service]",
        'name = "Benchmark fabric"',
        'uuid = "6b1d3c9e-8a57-4f0e-9c2d-5e4b7a1f0b02"',
    ]
    for z in range(1, size.zones + 1):
        rack = f"bench-{z:02d}"
        parts += [
            f'\n[[zones]]\nid = "{rack}"\nname = "Benchmark rack {z} fabric"',
            f'\n[[chassis]]\nid = "{rack}"\nname = "Benchmark rack {z}"\ntype = "Rack"',
            f'\n[[hosts]]\nprefix = "b{z:02d}-host"\ncount = {size.hosts_per_zone}'
            f'\nzone = "{rack}"\nchassis = "{rack}"',
            f"cores = {HOST_CORES}\nmemory_gib = {HOST_MEMORY_GIB}",
            _device_group(f"b{z:02d}-t4", size.gpus_per_zone, rack, "gpu", GPU_MODEL, 16),
        ]
        if size.nics_per_zone:
            parts.append(
                _device_group(
                    f"b{z:02d}-nic25", size.nics_per_zone, rack, "nic", "BCM57414 25GbE", 25
                )
            )
        if size.drives_per_zone:
            parts.append(
                _device_group(
                    f"b{z:02d}-nvme", size.drives_per_zone, rack, "nvme", "PM1733 1.92TB", 1920
                )
            )
    return "\n".join(parts) + "\n"


def host_ids(size: FabricSize) -> list[str]:
    """The hosts :func:`inventory_toml` makes, as the simulator names them."""
    return [
        f"b{z:02d}-host-{n:0{HOST_ID_DIGITS}d}"
        for z in range(1, size.zones + 1)
        for n in range(1, size.hosts_per_zone + 1)
    ]


def _device_group(prefix: str, count: int, rack: str, kind: str, model: str, size: int) -> str:
    size_key = {"gpu": "memory_gib", "nic": "speed_gbps", "nvme": "capacity_gb"}[kind]
    manufacturer = {"gpu": "NVIDIA", "nic": "Broadcom", "nvme": "Samsung"}[kind]
    return (
        f'\n[[devices]]\nprefix = "{prefix}"\ncount = {count}\nkind = "{kind}"'
        f'\nchassis = "{rack}"\nzones = ["{rack}"]\nmanufacturer = "{manufacturer}"'
        f'\nmodel = "{model}"\n{size_key} = {size}'
    )


def load_config(*, spawn_limit: int, page_limit: int) -> str:
    """Extra hub config: the hub's limits for a crowd."""
    return f"""
c.JupyterHub.concurrent_spawn_limit = {spawn_limit}
c.JupyterHub.api_page_max_limit = {max(page_limit, 200)}
"""


def load_env(inventory: Path) -> dict[str, str]:
    """Hub environment: stand-in notebooks, the simulator serving ``inventory``.

    The demo config appends $COMPOSE_FABRIC_ARGS to the simulator's command
    after its own ``--inventory``, and the last one given wins. (An extra config
    file cannot edit the demo's service list: it is loaded as a separate config
    and merged, so it sees no list to change.)
    """
    return {**STANDIN_ENV, "COMPOSE_FABRIC_ARGS": f"--inventory {inventory}"}


# -- talking to the hub -------------------------------------------------------------


def api_session(connections: int) -> requests.Session:
    """An admin-token session whose pool keeps ``connections`` connections (one per thread)."""
    session = requests.Session()
    # A kept-alive connection the proxy closes just as we reuse it fails with no
    # answer; GET and DELETE of a server are safe to send again (never POST).
    retry = Retry(total=3, allowed_methods=frozenset({"GET", "DELETE"}), status_forcelist=())
    adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(connections, 10), max_retries=retry)
    session.mount("http://", adapter)
    session.headers["Authorization"] = f"token {ADMIN_TOKEN}"
    return session


def create_users(hub: Hub, names: list[str]) -> None:
    """Users the demo authenticator does not list, made by the admin API."""
    response = hub.request("POST", "/users", json={"usernames": names}, timeout=120)
    if response.status_code not in (201, 409):
        raise RuntimeError(f"creating users failed: {response.status_code} {response.text}")


def active_servers(hub: Hub, session: requests.Session, limit: int) -> dict[str, dict[str, Any]]:
    """user → default server model, for every user whose default server exists (any state)."""
    response = session.get(
        f"{hub.url}/hub/api/users", params={"state": "active", "limit": str(limit)}, timeout=60
    )
    response.raise_for_status()
    servers = {}
    for user in response.json():
        server = user.get("servers", {}).get("")
        if server is not None:
            servers[user["name"]] = server
    return servers


# -- what the fabric and the ledger say -----------------------------------------------


@dataclass
class FabricView:
    """Every host's attached device blocks and composition mark, from one expanded read."""

    attached: dict[str, list[str]]  # host → device blocks (its own block left out)
    tagged: set[str]  # hosts carrying a composition mark
    capacity: dict[str, tuple[int, int]] = field(default_factory=dict)  # host → cores, GiB

    @property
    def holders_by_block(self) -> dict[str, list[str]]:
        hosts: dict[str, list[str]] = {}
        for host, blocks in self.attached.items():
            for block in blocks:
                hosts.setdefault(block, []).append(host)
        return hosts


def fabric_view(hub: Hub) -> FabricView:
    systems = hub.redfish("/redfish/v1/Systems?$expand=.")["Members"]
    attached: dict[str, list[str]] = {}
    tagged = set()
    capacity = {}
    for system in systems:
        host = system["Id"]
        cores = system.get("ProcessorSummary", {}).get("CoreCount", 0)
        capacity[host] = (cores, system.get("MemorySummary", {}).get("TotalSystemMemoryGiB", 0))
        links = system.get("Links", {}).get("ResourceBlocks", [])
        blocks = [link["@odata.id"].rsplit("/", 1)[1] for link in links]
        devices = [b for b in blocks if b != f"{host}-block"]
        if devices:
            attached[host] = devices
        if system.get("Oem", {}).get("ComposeSpawner"):
            tagged.add(host)
    return FabricView(attached=attached, tagged=tagged, capacity=capacity)


@dataclass
class HolderCheck:
    """Devices with more than one holder, and what the fabric and ledger still hold."""

    double_holders: list[str] = field(default_factory=list)
    ledger_held: list[str] = field(default_factory=list)  # device blocks, host blocks left out
    fabric_attached: list[str] = field(default_factory=list)
    tagged_hosts: list[str] = field(default_factory=list)
    live_machines: int = 0
    # Hosts whose live machines hold more cores, memory or slots than the fabric says
    # the host has: the ledger's figures checked against the fabric's, not its own.
    over_capacity: list[str] = field(default_factory=list)


def wait_released(hub: Hub, timeout: float = 120.0) -> float:
    """Seconds until the ledger has no live machine left, or ``timeout``.

    A stop returns once the notebook is down; the machine's release goes on in
    the background. Leaks are counted once the releases had time to end.
    """
    started = time.monotonic()
    ledger = Ledger(hub.ledger_url())
    try:
        while ledger.live_machines() and time.monotonic() - started < timeout:
            time.sleep(0.1)  # polling the ledger, bounded by the timeout
    finally:
        ledger.close()
    return time.monotonic() - started


def check_holders(
    hub: Hub, server_devices: Mapping[str, Iterable[str]] | None = None
) -> HolderCheck:
    """Compare the fabric's attachments, the ledger's holders and what servers were told.

    A device is double-held when it is attached to two hosts, attached to a host
    other than the one of the ledger machine holding it, or in the environment
    of two running servers (``server_devices``: server → COMPOSE_DEVICE_IDS).
    """
    view = fabric_view(hub)
    ledger = Ledger(hub.ledger_url())
    try:
        holders = ledger.holders()
        machines = {m.id: m for m in ledger.live_machines()}
    finally:
        ledger.close()
    doubles = {b for b, hosts in view.holders_by_block.items() if len(hosts) > 1}
    for block, hosts in view.holders_by_block.items():
        machine = machines.get(holders.get(block, ""))
        if machine is not None and machine.host_id not in hosts:
            doubles.add(block)
    told = Counter(d for devices in (server_devices or {}).values() for d in devices)
    doubles |= {d for d, n in told.items() if n > 1}
    return HolderCheck(
        double_holders=sorted(doubles),
        ledger_held=sorted(b for b in holders if not b.endswith("-block")),
        fabric_attached=sorted(view.holders_by_block),
        tagged_hosts=sorted(view.tagged),
        live_machines=len(machines),
        over_capacity=over_capacity(view, list(machines.values())),
    )


def over_capacity(view: FabricView, machines: Iterable[Machine]) -> list[str]:
    """Hosts whose machines (by the ledger) hold more than the host has (by the fabric)."""
    held: dict[str, list[int]] = {}
    for machine in machines:
        if machine.host_id is None:
            continue
        cores, memory = view.capacity.get(machine.host_id, (0, 0))
        share = held.setdefault(machine.host_id, [0, 0])
        share[0] += cores if machine.cores is None else machine.cores  # a whole host
        share[1] += memory if machine.memory_gib is None else machine.memory_gib
    over = set()
    for host, (cores, memory) in held.items():
        has_cores, has_memory = view.capacity.get(host, (0, 0))
        if cores > has_cores or memory > has_memory:
            over.add(host)
    over |= {host for host, blocks in view.attached.items() if len(blocks) > HOST_SLOTS}
    return sorted(over)


# -- numbers ------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1-99), linear between closest ranks; NaN when empty."""
    if len(values) < 2:
        return values[0] if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` as strict JSON: a number that could not be measured (NaN) is null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_no_nan(result), indent=2, allow_nan=False) + "\n")


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def ratio(ours: float, stock: float) -> float:
    return ours / stock if stock > 0 else math.nan


_LOG_LEVEL = re.compile(r"^\[([EW]) ")


def hub_log_problems(hub: Hub) -> dict[str, int]:
    """Error and warning lines in the hub's log (the hub, proxy and services write there)."""
    counts = Counter(
        m.group(1)
        for line in hub.log_path.read_text(errors="replace").splitlines()
        if (m := _LOG_LEVEL.match(line))
    )
    return {"errors": counts["E"], "warnings": counts["W"]}


def keep_log(hub: Hub, folder: Path | None, name: str) -> None:
    """Copy the hub's log (it lives in a temporary folder) to ``folder``, if given."""
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hub.log_path, folder / name)
