"""``composespawner reclaimer``: the hub-managed service that gives idle GPUs back.

It reads the hub's config file as the reconciler does (the ledger, the fabric and
the catalog, and the site's reclaim policy, ``c.ComposeSettings.reclaim_policy``, which the
portal reads too), and its own section, ``c.ReclaimerApp``: where each host's GPU
activity is read, and how often. The pass itself is
:class:`~composespawner.services.reclaimer.Reclaimer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import ssl
import time

from traitlets import Bool, Enum, Float, TraitError, Unicode, default

from composespawner.activity import ActivitySource
from composespawner.activity.agent import AgentActivity, ssh_settings
from composespawner.activity.dcgm import DcgmExporter
from composespawner.activity.nvml import NvmlSource
from composespawner.domain.reclaim import ReclaimPolicy
from composespawner.launchers.accounts import DEFAULT_NOTEBOOK_ACCOUNT
from composespawner.ledger import Machine
from composespawner.services.application import ComposeApplication
from composespawner.services.kernels import NotebookKernels
from composespawner.services.reclaimer import INTERVAL, Reclaimer
from composespawner.services.settings import build_composer


class ReclaimerApp(ComposeApplication):
    """The reclaimer as a hub-managed service: ``composespawner reclaimer -f CONFIG``."""

    name = "composespawner reclaimer"
    description = """Give idle GPUs back to the pool while their servers run on: detach a
    GPU nothing has held for a while, warn about one that does no work, and after the
    warning shut down the server's kernels and take it. Reads the hub's config file for
    the ledger, fabric and catalog; the hub's public URL (--hub-url) and
    $JUPYTERHUB_API_TOKEN reach the notebook servers' kernels."""

    interval = Float(
        INTERVAL,
        config=True,
        help="""Seconds between passes. Keep it well under the policy's max_gap (the
        longest gap between readings a window may span), or no window ever fills.""",
    )
    activity_source = Enum(
        ["dcgm", "nvml", "agent"],
        "dcgm",
        config=True,
        help="""Where GPU activity is read: 'dcgm', each host's DCGM exporter over HTTP
        (dcgm_url_template); 'nvml', this machine's own GPUs (a site of one host, where
        the reclaimer runs beside its GPUs); 'agent', each bare compute host's agent over
        the SSH launcher's links (c.SSHLauncher.hosts, ssh_key, known_hosts), which reads
        NVML on its host. 'nvml' and 'agent' name the kernels holding each GPU, so a
        reclaim ends only those; with 'dcgm' it ends every kernel of the server.""",
    )
    notebook_account = Unicode(
        "",
        config=True,
        help="""With activity_source 'nvml': the one account every notebook runs as (a
        site whose local launcher has shared_account). Empty: each user's notebooks run
        as their own account, named as they are. A process holding a GPU is taken at its
        word that it is a kernel (its connection file on its command line) only when it
        runs as that account: another user's process naming a kernel is never one.
        By default what the config's ComposeSpawner (or LocalLauncher) says.""",
    )

    @default("notebook_account")
    def _the_launchers_account(self) -> str:
        for section in ("ComposeSpawner", "LocalLauncher"):
            launcher = self.config[section]
            if launcher.get("shared_account"):
                account = launcher.get("notebook_account", DEFAULT_NOTEBOOK_ACCOUNT)
                # Run as the hub's own account where the hub is not root (as this is).
                return str(account) if account and os.geteuid() == 0 else _own_account()
        return ""

    dcgm_url_template = Unicode(
        "http://{host_id}:9400/metrics",
        config=True,
        help="""A host's DCGM exporter, {host_id} the host's ComputerSystem Id. The
        default fits hosts whose system Ids are their names; the simulated fabric serves
        one per system at http://<fabric>/dcgm/{host_id}/metrics.""",
    )
    activity_timeout = Float(
        10.0,
        config=True,
        help="""Seconds one host's reading may take. A host that does not answer in time
        counts as unknown (none of its GPUs is touched), never as idle.""",
    )
    hub_url = Unicode(
        "",
        config=True,
        help="""The hub's public URL (as users reach it: its proxy), where each server's
        kernels API is. Empty: kernels cannot be shut down, so idle GPUs are warned about
        but never reclaimed.""",
    )
    hub_ca_bundle = Unicode(
        "",
        config=True,
        help="""A CA bundle (PEM) to check hub_url's certificate with, where it is not one
        the system trusts (a self-signed or campus CA). Empty: the system's CAs.""",
    )
    kernels_timeout = Float(10.0, config=True, help="Seconds for one call to a kernels API.")
    once = Bool(False, config=True, help="Make one pass, print what it did as JSON, and exit.")
    aliases = {
        **ComposeApplication.aliases,
        "interval": "ReclaimerApp.interval",
        "activity-source": "ReclaimerApp.activity_source",
        "dcgm-url-template": "ReclaimerApp.dcgm_url_template",
        "hub-url": "ReclaimerApp.hub_url",
    }
    flags = {"once": ({"ReclaimerApp": {"once": True}}, once.help)}

    @default("log_format")
    def _default_log_format(self) -> str:
        return "[%(levelname)1.1s %(asctime)s reclaimer] %(message)s"

    def site_policy(self) -> ReclaimPolicy:
        """The configured policy; a clear exit at start when it cannot be used."""
        try:
            policy = self.settings.site_reclaim_policy()
        except TraitError as e:
            raise SystemExit(f"{self.name}: {e}") from None
        if self.interval >= policy.max_gap:
            raise SystemExit(
                f"{self.name}: interval ({self.interval:g} s) must be less than the policy's"
                f" max_gap ({policy.max_gap:g} s): readings further apart never add up to a"
                " window, so nothing would ever be given back"
            )
        return policy

    def source(self) -> ActivitySource:
        if self.activity_source == "nvml":
            return NvmlSource(self.activity_timeout)
        if self.activity_source == "agent":
            ssh = ssh_settings(self.config, self.log)
            unset = [name for name in ("hosts", "ssh_key", "known_hosts") if not getattr(ssh, name)]
            if unset:
                # No known_hosts would have asyncssh trust ~/.ssh/known_hosts instead.
                raise SystemExit(
                    f"{self.name}: activity_source 'agent' reads each host through its agent"
                    f" as the SSH launcher reaches it: set c.SSHLauncher.{unset[0]}"
                )
            return AgentActivity(ssh, self.activity_timeout, log=self.log)
        template = self.dcgm_url_template
        if "{host_id}" not in template:
            raise SystemExit(
                f"{self.name}: dcgm_url_template {template!r} has no {{host_id}}: every host"
                " would be read from one exporter"
            )
        return DcgmExporter(lambda host: template.format(host_id=host), self.activity_timeout)

    def check(self) -> tuple[ReclaimPolicy, ActivitySource]:
        """The policy and the source, or a stop saying what to change in a config that
        cannot run. A hub config runs it too, so a reclaimer that could not start stops
        the hub at its start instead of being restarted by it over and over."""
        policy, source = self.site_policy(), self.source()
        if self.hub_ca_bundle:
            try:
                ssl.create_default_context(cafile=self.hub_ca_bundle)
            except (OSError, ssl.SSLError) as e:
                raise SystemExit(
                    f"{self.name}: hub_ca_bundle {self.hub_ca_bundle!r} cannot be used: {e}"
                ) from None
        return policy, source

    def start(self) -> None:
        policy, source = self.check()  # config errors before anything runs
        kernels = self._kernels()
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
            asyncio.run(self._run(policy, source, kernels))

    async def _run(
        self, policy: ReclaimPolicy, source: ActivitySource, kernels: NotebookKernels | None
    ) -> None:
        # The hub stops its services with SIGINT, then SIGTERM: either way the pass in
        # progress is cancelled and the clients closed.
        main = asyncio.current_task()
        assert main is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        composer = build_composer(self.settings, self.log, for_spawns=False)
        reclaimer = Reclaimer(
            composer,
            source,
            site_policy=policy,
            interval=self.interval,
            kernels=kernels,
            read_timeout=self.activity_timeout + 5.0,  # the source's own timeout fires first
            notebook_uids=self._notebook_uids if self.activity_source == "nvml" else None,
            log=self.log,
        )
        self.log.info(
            "Reclaiming idle GPUs every %.0f s, activity from %s, policy %s",
            self.interval,
            self.activity_source,
            json.dumps(policy.as_dict()),
        )
        try:
            if self.once:
                actions = await reclaimer.sweep(time.time())
                print(json.dumps([a.summary() for a in actions], indent=1))
            else:
                await reclaimer.run_forever(self.interval)
        finally:
            if isinstance(source, DcgmExporter | AgentActivity):
                await source.close()
            if kernels is not None:
                await kernels.close()
            await composer.close()

    def _notebook_uids(self, machine: Machine) -> frozenset[int] | None:
        """The account ``machine``'s notebook runs as here; None where there is none."""
        try:
            return frozenset({pwd.getpwnam(self.notebook_account or machine.user_name).pw_uid})
        except KeyError:
            return None

    def _kernels(self) -> NotebookKernels | None:
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not (self.hub_url and token):
            self.log.warning(
                "No hub URL or $JUPYTERHUB_API_TOKEN: idle GPUs are warned about and"
                " detached when unheld, but never reclaimed from kernels"
            )
            return None
        return NotebookKernels(self.hub_url, token, self.kernels_timeout, self.hub_ca_bundle)


def _own_account() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name
