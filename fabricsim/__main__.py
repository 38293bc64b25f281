"""Command line: ``fabricsim --inventory FILE`` (or ``python -m fabricsim``).

Also reached as ``composespawner fabric-simulator ...``. Serves the simulated
fabric on 127.0.0.1 until SIGTERM or SIGINT, over https with ``--tls-cert`` and
``--tls-key`` (as real fabric managers answer), else plain http. Run by JupyterHub as a managed
service, it binds to ``JUPYTERHUB_SERVICE_URL`` unless ``--port`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import ssl
import sys
from urllib.parse import urlsplit

from .app import make_app
from .inventory import InventoryError, load_inventory
from .persistence import StateFile
from .quirks import ERROR_BODIES, ServiceQuirks
from .simulator import Simulator, SimulatorConfig
from .state import COMPOSITION_MODES, FabricState, StateFileError

log = logging.getLogger("fabricsim")

DEFAULT_IP = "127.0.0.1"
DEFAULT_PORT = 8010


def main(argv: list[str] | None = None) -> int:
    """Run the simulator; the process exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s",
    )
    ip, port = bind_address(args.ip, args.port, os.environ.get("JUPYTERHUB_SERVICE_URL"))
    try:
        simulator = build_simulator(args)
        tls = tls_context(args.tls_cert, args.tls_key)
    except (InventoryError, StateFileError, TLSOptionError, SwitchError) as err:
        log.error("%s", err)
        return 2
    asyncio.run(serve(simulator, ip, port, tls))
    return 0


class TLSOptionError(ValueError):
    """``--tls-cert`` / ``--tls-key`` given alone, or not a usable certificate and key."""


class SwitchError(ValueError):
    """A switch given with a composition mode it does not apply to."""


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The server's TLS context, or None for plain http."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise TLSOptionError("--tls-cert and --tls-key go together: give both or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise TLSOptionError(f"cannot serve TLS with {cert} and {key}: {err}") from err
    return context


def bind_address(ip: str | None, port: int | None, service_url: str | None) -> tuple[str, int]:
    """Where to listen: options first, then JupyterHub's service URL, then defaults."""
    url = urlsplit(service_url) if service_url else None
    if port is None and url is not None and url.port is not None:
        port = url.port
        ip = ip or url.hostname
    return ip or DEFAULT_IP, port if port is not None else DEFAULT_PORT


def build_simulator(args: argparse.Namespace) -> Simulator:
    if args.zone_capabilities and args.composition != "specific":
        raise SwitchError(
            "--zone-capabilities needs --composition specific: only there is POST to Systems"
        )
    if args.composed_blocks_read_only and args.composition == "expandable":
        raise SwitchError(
            "--composed-blocks-read-only needs --composition specific or action: "
            "only there are systems composed of blocks"
        )
    state = FabricState(
        load_inventory(args.inventory),
        epoch=secrets.token_hex(4),
        composition=args.composition,
        not_expandable=args.not_expandable,
    )
    state_file = StateFile(args.state_file) if args.state_file else None
    if state_file is not None:
        for problem in state_file.load_into(state):
            log.warning("state file %s: %s", state_file.path, problem)
        # Written at once: an unwritable path shows now, not at the first attach.
        state_file.save(state.to_json())
    config = SimulatorConfig(
        username=args.username,
        password=args.password,
        async_tasks=args.async_tasks,
        task_duration_s=args.task_duration,
        faults_api=args.faults_api,
        quirks=ServiceQuirks(
            zone_capabilities=args.zone_capabilities,
            composed_blocks_read_only=args.composed_blocks_read_only,
            stale_block_status=args.stale_block_status,
            error_bodies=args.error_bodies,
        ),
    )
    return Simulator(state, config, state_file=state_file)


async def serve(simulator: Simulator, ip: str, port: int, tls: ssl.SSLContext | None) -> None:
    """Listen until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = make_app(simulator).listen(port, address=ip, ssl_options=tls)
    inventory = simulator.state.inventory
    log.info(
        "Redfish fabric simulator on %s://%s:%d/redfish/v1/ (%d hosts, %d devices%s%s%s%s)",
        "https" if tls else "http",
        ip,
        port,
        len(inventory.hosts),
        len(inventory.devices),
        ", async tasks" if simulator.config.async_tasks else "",
        f", {simulator.state.composition} composition",
        ", faults API" if simulator.config.faults_api else "",
        "".join(f", {quirk}" for quirk in simulator.describe_quirks()),
    )
    await stop.wait()
    log.info("stopping")
    server.stop()
    # Clients (the hub) keep idle connections open; waiting for them to hang up
    # would stall the hub's shutdown until it escalates to SIGKILL.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.close_all_connections(), timeout=1.0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabricsim",
        description="A Redfish composable-fabric simulator for composespawner's tests and demo.",
    )
    parser.add_argument("--inventory", required=True, help="inventory TOML file")
    parser.add_argument("--ip", default=None, help=f"address to bind (default {DEFAULT_IP})")
    parser.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--state-file", help="JSON file keeping attachments across restarts")
    parser.add_argument("--username", default=os.environ.get("COMPOSE_FABRIC_USERNAME", "admin"))
    parser.add_argument(
        "--password", default=os.environ.get("COMPOSE_FABRIC_PASSWORD", "fabric-password")
    )
    parser.add_argument(
        "--composition",
        choices=COMPOSITION_MODES,
        default="expandable",
        help="how systems are composed: devices added to standing hosts (expandable), "
        "POST of whole systems to Systems (specific), or CompositionService.Compose "
        "manifests (action); default expandable",
    )
    parser.add_argument(
        "--zone-capabilities",
        action="store_true",
        help="with --composition specific: advertise POST of composed systems the way older "
        "services do, on each ResourceZone's Links.CapabilitiesObjects, not by "
        "@Redfish.CollectionCapabilities on Systems",
    )
    parser.add_argument(
        "--composed-blocks-read-only",
        action="store_true",
        help="with --composition specific or action: refuse PATCH of a composed system's "
        "Links.ResourceBlocks (PropertyNotWritable), as services do whose composed systems "
        "keep their blocks until deleted; the Oem mark can still be patched",
    )
    parser.add_argument(
        "--not-expandable",
        action="append",
        default=[],
        metavar="HOST",
        help="with --composition expandable: this host's system is no expandable system (no "
        "ExpandableSystem use case, no Add/RemoveResourceBlock actions; its Oem can still be "
        "patched), like a service's fixed servers; repeatable",
    )
    parser.add_argument(
        "--stale-block-status",
        action="store_true",
        help="composed blocks keep reading CompositionState Unused with no "
        "Links.ComputerSystems, as services that update only the system do; a second claim "
        "is still refused",
    )
    parser.add_argument(
        "--error-bodies",
        choices=ERROR_BODIES,
        default="redfish",
        help="what error answers carry: a Redfish error object (redfish, the default), or, as "
        "looser services and the web servers in front of them answer, plain text, an HTML "
        "page, or JSON that is no Redfish error",
    )
    parser.add_argument(
        "--async-tasks",
        action="store_true",
        help="answer writes (attach, detach, compose, decompose) with 202 and a task monitor",
    )
    parser.add_argument(
        "--task-duration",
        type=float,
        default=0.2,
        help="seconds an asynchronous task runs (default 0.2)",
    )
    parser.add_argument(
        "--faults-api",
        action="store_true",
        help="serve the test-only /sim/faults, /sim/state and /sim/activity",
    )
    parser.add_argument("--tls-cert", help="PEM certificate (chain) to serve https with")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG level")
    return parser


if __name__ == "__main__":
    sys.exit(main())
