"""The SSH launcher's knobs (``c.SSHLauncher.*``), which the activity reader shares: the
hosts and their keys, the limits of the hub's connections, and how the hosts run notebooks.
"""

from __future__ import annotations

from typing import Any

from traitlets import Dict, Enum, Float, Integer, TraitError, Unicode, default, validate

from composespawner.domain.machine import ComposedMachine
from composespawner.launchers.environments import BUILD_TIMEOUT
from composespawner.launchers.ssh_links import LinkSettings
from composespawner.launchers.ssh_requests import parse_address
from composespawner.launchers.stack_images import StackImages


class SSHSettings(StackImages):
    """The SSH launcher's knobs (``c.SSHLauncher.*``): the hosts, the keys, the limits."""

    hosts = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""The hub's host table: each compute host's fabric ComputerSystem Id →
        the address the hub reaches its SSH server at, ``"address"`` or
        ``"address:port"`` (``"[v6-address]:port"``). The deployment writes it with
        known_hosts, from the same inventory. A host missing here cannot run notebooks.""",
    )
    ssh_user = Unicode(
        "root",
        config=True,
        help="""The account the hub logs in as on each host. Its authorized_keys allow
        the hub's key only the agent's forced command; the agent needs root to start
        notebooks as the users' accounts. Change it only with an agent set up for it.""",
    )
    ssh_key = Unicode(
        "",
        config=True,
        help="""Path of the hub's private SSH key (ed25519), readable by the hub alone.
        Its public half is on every host, for the forced command only.""",
    )
    known_hosts = Unicode(
        "",
        config=True,
        help="""Path of the known_hosts file with every host's key, written by the
        deployment. Required: a host that is not listed there, or shows another key,
        is never connected to (no trust on first use).""",
    )
    connect_timeout = Float(
        10,
        config=True,
        help="""Seconds to open an SSH connection to a host (TCP, handshake and login).
        Raise it for hosts behind slow links.""",
    )
    request_timeout = Float(
        30,
        config=True,
        help="""Seconds a stop or poll of a notebook on its host may take, connecting
        included. A start has the hub's start_timeout (plus stack_build_timeout when it
        may build its stack).""",
    )
    keepalive_interval = Float(
        15,
        config=True,
        help="""Seconds between keepalives on each host's connection; three missed
        ones close it (and it is made again on the next request). 0 sends none.""",
    )
    poll_host_every = Float(
        300,
        config=True,
        help="""Seconds between the hub's polls that ask a notebook's host itself. In
        between, a notebook whose host's exit watch is open (the agent reports every exit
        on it at once) is running without a channel of its own: a hub polling a class's
        servers every poll_interval would otherwise start an agent per server each time.""",
    )
    max_sessions = Integer(
        10,
        config=True,
        help="""The hosts' sshd MaxSessions: how many channels of the hub's connection to a
        host may be open at once (each start, stop and poll is one, and the exit watch).
        Requests beyond it wait their turn. Raise it with MaxSessions on the hosts.""",
    )
    stack_build_timeout = Float(
        BUILD_TIMEOUT,
        config=True,
        help="""Seconds the first start on a stack's lock may take, on top of
        start_timeout, on a host that has not built that stack's environment yet.""",
    )

    host_runtime = Enum(
        ("process", "containers"),
        "process",
        config=True,
        help="""How the hosts' agents run notebooks, as their config's ``runtime`` says
        (the deployment sets both): process (the host builds each stack's environment
        from its CPU lock and runs the notebook as the user, in cgroups) or containers
        (podman runs the stack's image by digest, stack_images and stack_variant, in a
        container of its own). A host that runs the other way refuses the start.""",
    )

    @default("stack_variant")
    def _variant_of_runtime(self) -> str:
        # A host of the process runtime builds the stack's CPU lock; images are the GPU one.
        return "gpu" if self.host_runtime == "containers" else "cpu"

    machine: ComposedMachine | None = None  # the mixin's; set before start

    def link_settings(self, where: str) -> LinkSettings:
        """How to reach the agent at ``where`` (an address of ``hosts``)."""
        address, port = parse_address(where)
        return LinkSettings(
            address=address,
            port=port,
            username=self.ssh_user,
            key=self.ssh_key,
            known_hosts=self.known_hosts,
            connect_timeout=self.connect_timeout,
            keepalive_interval=self.keepalive_interval,
            max_sessions=self.max_sessions,
        )

    @validate("hosts")
    def _valid_hosts(self, proposal: dict[str, Any]) -> dict[str, str]:
        hosts: dict[str, str] = proposal["value"]
        try:
            for where in hosts.values():
                parse_address(where)
        except ValueError as e:
            raise TraitError(f"c.SSHLauncher.hosts: {e}") from e
        return hosts
