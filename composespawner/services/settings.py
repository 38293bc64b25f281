"""The composition root: one settings object, one factory.

Every process that works on the pool (the hub's spawners, the reconciler, the
coming portal) reads the same knobs from the same config file and builds its
ledger, fabric client and :class:`~composespawner.services.composer.Composer` here, and
nowhere else.

The knobs live on :class:`ComposeSettings`. The spawner inherits them, so a
hub config sets them as ``c.ComposeSpawner.<knob>`` (or ``c.ComposeSettings``
for every process at once); :func:`settings_from_config` reads both sections for
the processes that are not spawners.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from datetime import UTC, tzinfo
from typing import Any
from weakref import WeakSet
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from prometheus_client import REGISTRY, CollectorRegistry
from traitlets import Dict, Float, Integer, TraitError, Unicode, default, validate
from traitlets.config import Config, LoggingConfigurable

from composespawner.domain.catalog import Catalog
from composespawner.domain.quotas import QuotaRule
from composespawner.domain.reclaim import SITE_DEFAULT, ReclaimPolicy, parse_policy, policy_problems
from composespawner.fabric.redfish import RedfishFabric, RedfishTimeouts
from composespawner.ledger import Ledger
from composespawner.services.composer import Composer
from composespawner.services.metrics import MeasuredFabric, PoolCollector, measure_compose

# Config sections that carry the settings, least specific first: the
# spawner's own section wins, as it does for the spawner itself.
SECTIONS = ("ComposeSettings", "ComposeMixin", "ComposeSpawner", "ComposeKubeSpawner")


class ComposeSettings(LoggingConfigurable):
    """What every composespawner process needs to know about the pool."""

    catalog_file = Unicode(
        "catalog.toml",
        config=True,
        help="""TOML file listing what the spawn form offers (GPU models, networks,
        scratch sizes, co-located chassis). Relative paths are taken from the hub's
        working directory. Change it to offer different hardware.""",
    )
    ledger_url = Unicode(
        "sqlite:///composespawner.sqlite",
        config=True,
        help="""SQLAlchemy URL of the ledger (who holds which device). SQLite suits one
        hub; use postgresql+psycopg://... when the hub runs with PostgreSQL or in
        several replicas. Bring its schema up to date with `composespawner upgrade-db`
        before starting a new version of the hub.""",
    )
    fabric_url = Unicode(
        "http://127.0.0.1:8010",
        config=True,
        help="Base URL of the fabric's Redfish service (the part before /redfish/v1).",
    )
    fabric_ca_bundle = Unicode(
        "",
        config=True,
        help="""Path to a PEM file of the CA certificates that sign the fabric's https
        certificate; empty trusts the system's CAs. Set it when your fabric manager's
        certificate comes from a site or vendor CA. Certificates are always verified.""",
    )
    fabric_username = Unicode(
        config=True, help="Redfish account; default $COMPOSE_FABRIC_USERNAME or 'admin'."
    )
    fabric_password = Unicode(
        config=True,
        help="Redfish password; default $COMPOSE_FABRIC_PASSWORD. Prefer the environment.",
    )
    fabric_request_timeout = Float(
        10.0, config=True, help="Seconds one Redfish request may take before it is retried."
    )
    fabric_operation_timeout = Float(
        60.0,
        config=True,
        help="""Seconds one fabric operation (an attach, with its retries and task polling)
        may take. Raise it for fabrics whose attach takes long.""",
    )
    fabric_max_requests = Integer(
        64,
        config=True,
        help="""Most Redfish requests in flight to the fabric at once, over all spawns.
        Lower it (8-16) for BMC-class services that fail under fan-out; raise it if
        spawns queue behind each other during a rush (a class starting at once).""",
    )
    hub_id = Unicode(
        config=True,
        help="""This hub's name in the fabric's composition tags. The reconciler only
        touches compositions carrying it, so every hub sharing a fabric needs its own.""",
    )
    max_gpus_per_user = Integer(
        4,
        config=True,
        help="""The site default of GPUs one user may hold at once, over all their
        servers (0: no limit). Admins can change it, and set cohort and user quotas
        over it, in the portal. Checked in the same transaction as the claim, so
        racing spawns cannot exceed it.""",
    )
    site_timezone = Unicode(
        "UTC",
        config=True,
        help="""The IANA time zone cohort session times are given in (e.g. "Europe/Berlin"):
        a session "Mon 09:00-11:00" reserves its GPUs from 09:00 there.""",
    )

    @validate("site_timezone")
    def _valid_timezone(self, proposal: Any) -> str:
        name = str(proposal["value"])
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise TraitError(f"site_timezone: no time zone {name!r}; use an IANA name") from None
        return name

    fabric_wait_timeout = Float(
        5.0,
        config=True,
        help="""Seconds a user's spawn or stop waits on the fabric before going on without
        it. A spawn waits this long for the inventory (to check the request and place
        it) or for its server's last machine to be given back, then is refused with 503
        and nothing claimed; a stop waits this long for the release, which then goes on
        in the background. Raise it for a fabric whose inventory read takes longer under
        load.""",
    )
    inventory_cache_seconds = Float(
        3.0,
        config=True,
        help="How long the spawn form may show a fabric inventory before asking again.",
    )

    reclaim_policy = Dict(
        config=True,
        help="""The site's policy for giving idle GPUs back while their servers run (the
        reclaimer service acts on it; the portal and JupyterLab tell users about it), any
        of: detach_after, warn_after, reclaim_after (seconds; null turns that step off),
        keep_for (seconds one Keep press holds a warned GPU), keeps_allowed (presses per
        GPU per server start; null: any, 0: none), busy_percent, memory_floor_mib, max_gap
        (seconds between readings a window may span). Fields left out keep the defaults:
        detach after 600 s with nothing holding the GPU, warn after 1800 s and reclaim
        after 3600 s without work. A cohort's own values, set by admins in the portal,
        win for its members.""",
    )

    @validate("reclaim_policy")
    def _usable_policy(self, proposal: Any) -> dict[str, Any]:
        problems = policy_problems(proposal["value"], over=SITE_DEFAULT)
        if problems:
            raise TraitError(f"reclaim_policy cannot be used: {'; '.join(problems.values())}")
        return dict(proposal["value"])

    def site_reclaim_policy(self) -> ReclaimPolicy:
        """The site's reclaim policy: the defaults under ``reclaim_policy``'s values."""
        return parse_policy(self.reclaim_policy, over=SITE_DEFAULT)

    @default("hub_id")
    def _default_hub_id(self) -> str:
        return f"jupyterhub@{socket.gethostname()}"

    @default("fabric_username")
    def _default_fabric_username(self) -> str:
        return os.environ.get("COMPOSE_FABRIC_USERNAME", "admin")

    @default("fabric_password")
    def _default_fabric_password(self) -> str:
        return os.environ.get("COMPOSE_FABRIC_PASSWORD", "")


def setting_names() -> tuple[str, ...]:
    return tuple(sorted(ComposeSettings.class_own_traits(config=True)))


def settings_from_config(config: Config, log: logging.Logger | None = None) -> ComposeSettings:
    """The settings a hub config gives its spawners, for a process that is not one."""
    names = set(setting_names())
    values: dict[str, Any] = {}
    for section in SECTIONS:
        if section in config:
            values.update({k: v for k, v in config[section].items() if k in names})
    return ComposeSettings(config=Config({"ComposeSettings": values}), **_log(log))


def open_ledger(settings: ComposeSettings) -> Ledger:
    """The ledger, refused with an actionable message if its schema is not current."""
    ledger = Ledger(settings.ledger_url, usage_zone=ZoneInfo(settings.site_timezone))
    try:
        ledger.check_schema()
    except BaseException:
        ledger.close()
        raise
    return ledger


def upgrade_ledger(url: str, zone: tzinfo = UTC) -> tuple[str | None, str | None]:
    """Bring the ledger at ``url`` to this version's schema (usage it fills in split into
    ``zone``'s days, the site's); the revisions before and after."""
    ledger = Ledger(url, usage_zone=zone)
    try:
        before = ledger.schema_revision()
        ledger.upgrade()
        return before, ledger.schema_revision()
    finally:
        ledger.close()


def open_fabric(settings: ComposeSettings, log: logging.Logger) -> RedfishFabric:
    return RedfishFabric(
        settings.fabric_url,
        username=settings.fabric_username,
        password=settings.fabric_password,
        ca_bundle=settings.fabric_ca_bundle or None,
        timeouts=RedfishTimeouts(
            request=settings.fabric_request_timeout, operation=settings.fabric_operation_timeout
        ),
        log=log,
        max_in_flight=settings.fabric_max_requests,
    )


class MeasuredComposer(Composer):
    """A :class:`Composer` whose composes are timed, and refusals and failures counted."""

    compose = measure_compose(Composer.compose)


def build_composer(
    settings: ComposeSettings, log: logging.Logger, *, for_spawns: bool = True
) -> Composer:
    """A composer over fresh clients, measured; the caller closes it (``await composer.close()``).

    ``for_spawns``: a user is waiting, so fabric reads give up after
    ``fabric_wait_timeout``; a service (the reconciler) waits the fabric out.
    """
    return MeasuredComposer(
        ledger=open_ledger(settings),
        fabric=MeasuredFabric(open_fabric(settings, log)),
        catalog=Catalog.from_file(settings.catalog_file),
        hub_id=settings.hub_id,
        snapshot_ttl=settings.inventory_cache_seconds,
        fabric_wait=settings.fabric_wait_timeout if for_spawns else None,
        site_quota=QuotaRule("site", gpus_held=settings.max_gpus_per_user or None),
        timezone=ZoneInfo(settings.site_timezone),
        log=log,
    )


_shared: dict[tuple[Any, ...], tuple[Composer, asyncio.Task[None]]] = {}
_metrics_in: WeakSet[CollectorRegistry] = WeakSet()  # the registries the pool's metrics joined


def register_pool_metrics(registry: CollectorRegistry = REGISTRY) -> None:
    """Show the pool as this process's shared composers see it, in ``registry`` (the
    default one is what JupyterHub serves at /hub/metrics); once per registry.

    Called when the hub's spawners first ask for a composer (:func:`shared_composer`),
    never on import: a process that imports these modules and builds no shared
    composer (the portal, the reconciler, a test) registers nothing.
    """
    if registry not in _metrics_in:
        registry.register(PoolCollector(lambda: [c.readout() for c, _ in _shared.values()]))
        _metrics_in.add(registry)


def shared_composer(settings: ComposeSettings, log: logging.Logger) -> Composer:
    """The one composer of this event loop for these settings (every spawner shares it).

    Keyed by every setting, credentials and timeouts included, so a changed
    value never reuses a composer built from the old one. It is closed when
    the hub shuts down: JupyterHub cancels every pending task then, and the
    task made here closes the composer when it is cancelled (as KubeSpawner
    closes its shared Kubernetes clients). The first call registers the pool's
    metrics, so the hub serves them from its spawners' first use on.
    """
    register_pool_metrics()
    loop = asyncio.get_running_loop()
    key = (loop, *(_hashable(getattr(settings, name)) for name in setting_names()))
    if key not in _shared:
        composer = build_composer(settings, log)
        closer = loop.create_task(_close_at_shutdown(key, composer), name="close composer")
        _shared[key] = (composer, closer)
    return _shared[key][0]


def _hashable(value: Any) -> Any:
    """A setting as part of a key: a Dict setting (the reclaim policy) as its JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


async def _close_at_shutdown(key: tuple[Any, ...], composer: Composer) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        del _shared[key]
        await composer.close()


def _log(log: logging.Logger | None) -> dict[str, Any]:
    return {"log": log} if log is not None else {}
