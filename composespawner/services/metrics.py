"""Prometheus metrics of the pool, served by the hub at ``/hub/metrics``.

JupyterHub exports prometheus_client's default registry there (with the
``read:metrics`` scope). Counters and histograms are updated where things
happen: the composition root (``settings``) wraps the fabric in
:class:`MeasuredFabric` and composes in :func:`measure_compose`. The pool's
state (devices by model and zone, releases waiting, the reconciler's actions)
is a :class:`~composespawner.services.pool.PoolReadout` each composer fills
when Prometheus scrapes, from what the hub already knows, so a scrape never
waits on the fabric; :class:`PoolCollector` only formats it, and joins the
registry when the hub's first spawner starts (``settings.register_pool_metrics``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter as Tally
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from composespawner.domain.hardware import CompositionTag, Device, HostMark, Inventory
from composespawner.fabric.base import Fabric, FabricError, Progress
from composespawner.services.failures import ComposeFailed, ComposeRefused
from composespawner.services.pool import PoolReadout

T = TypeVar("T")
P = ParamSpec("P")

# Composing takes from tens of milliseconds (a simulator) to minutes (a slow fabric).
_COMPOSE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

COMPOSE_DURATION = Histogram(
    "composespawner_compose_duration_seconds",
    "Seconds from a spawn's request to every device attached, for composes that succeeded",
    buckets=_COMPOSE_BUCKETS,
)
COMPOSE_REFUSALS = Counter(
    "composespawner_compose_refusals",
    "Spawns refused before anything was attached (quota, nothing fits, busy), by reason",
    ["reason"],
)
COMPOSE_FAILURES = Counter(
    "composespawner_compose_failures",
    "Composes that failed after the claim and were undone, by reason",
    ["reason"],
)
FABRIC_DURATION = Histogram(
    "composespawner_fabric_request_duration_seconds",
    "Seconds a fabric operation took (with its retries), by operation",
    ["operation"],
)
FABRIC_ERRORS = Counter(
    "composespawner_fabric_request_errors",
    "Fabric operations that failed, by operation and error",
    ["operation", "error"],
)


def measure_compose(
    compose: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Time ``Composer.compose`` and count its refusals and failures by reason."""

    @functools.wraps(compose)
    async def measured(*args: P.args, **kwargs: P.kwargs) -> T:
        started = time.monotonic()
        try:
            machine = await compose(*args, **kwargs)
        except ComposeRefused as e:
            COMPOSE_REFUSALS.labels(e.reason).inc()
            raise
        except (ComposeFailed, asyncio.CancelledError) as e:
            cause = e.__cause__ if isinstance(e, ComposeFailed) else e
            COMPOSE_FAILURES.labels(type(cause).__name__).inc()
            raise
        COMPOSE_DURATION.observe(time.monotonic() - started)
        return machine

    return measured


class MeasuredFabric:
    """A :class:`~composespawner.fabric.base.Fabric` that times and counts every operation."""

    def __init__(self, fabric: Fabric) -> None:
        self.inner = fabric

    async def inventory(self) -> Inventory:
        return await self._measure("inventory", self.inner.inventory)

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        return await self._measure("host_mark", self.inner.host_mark, system_id)

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._measure("join_host", self.inner.join_host, system_id, tag)

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        await self._measure("leave_host", self.inner.leave_host, system_id, tag)

    async def attach(self, system_id: str, block_id: str) -> None:
        await self._measure("attach", self.inner.attach, system_id, block_id)

    async def detach(self, system_id: str, block_id: str) -> None:
        await self._measure("detach", self.inner.detach, system_id, block_id)

    async def compose(
        self, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
    ) -> str:
        # Timed as a whole: the steps inside (marks, attachments) are the driver's.
        result: str = await self._measure(
            "compose", self.inner.compose, host, devices, tag, progress
        )
        return result

    async def decompose(self, host: str, blocks: Sequence[str], tag: CompositionTag) -> bool:
        result: bool = await self._measure("decompose", self.inner.decompose, host, blocks, tag)
        return result

    def seconds_since_answer(self) -> float:
        return self.inner.seconds_since_answer()

    async def close(self) -> None:
        await self.inner.close()

    async def _measure(self, operation: str, call: Callable[..., Any], *args: Any) -> Any:
        started = time.monotonic()
        try:
            return await call(*args)
        except FabricError as e:
            FABRIC_ERRORS.labels(operation, type(e).__name__).inc()
            raise
        finally:
            FABRIC_DURATION.labels(operation).observe(time.monotonic() - started)


# ---------------------------------------------------------------------------
# The pool's state, read at scrape time
# ---------------------------------------------------------------------------

DeviceKey = tuple[str, str, str, str]  # kind, model, zone, state


def device_counts(inventory: Inventory, holders: Mapping[str, str]) -> Tally[DeviceKey]:
    """Devices by kind, model, zone and state: ``held`` (in our ledger), ``free``, ``unavailable``.

    ``unavailable`` is anything else: attached by someone who is not this hub,
    disabled, reserved, failed.
    """
    counts: Tally[DeviceKey] = Tally()
    for device in inventory.devices:
        if device.block_id in holders:
            state = "held"
        elif device.state == "free":
            state = "free"
        else:
            state = "unavailable"
        counts[(device.kind, device.model, ",".join(sorted(device.zones)), state)] += 1
    return counts


@dataclass
class _PoolFamilies:
    devices: GaugeMetricFamily = field(
        default_factory=lambda: GaugeMetricFamily(
            "composespawner_devices",
            "Devices in the pool by kind, model, zone and state (held, free, unavailable)",
            labels=["kind", "model", "zone", "state"],
        )
    )
    inventory_age: GaugeMetricFamily = field(
        default_factory=lambda: GaugeMetricFamily(
            "composespawner_inventory_age_seconds",
            "Age of the fabric inventory the device counts come from",
        )
    )
    releases_pending: GaugeMetricFamily = field(
        default_factory=lambda: GaugeMetricFamily(
            "composespawner_releases_pending_retry",
            "Releases going on in the background that the fabric has not confirmed yet",
        )
    )
    reconciler_actions: CounterMetricFamily = field(
        default_factory=lambda: CounterMetricFamily(
            "composespawner_reconciler_actions",
            "What the reconciler did, by kind and outcome (done or error), from the ledger",
            labels=["kind", "outcome"],
        )
    )

    def __iter__(self) -> Iterator[Metric]:
        yield from (self.devices, self.inventory_age, self.releases_pending)
        yield self.reconciler_actions

    def add(self, pool: PoolReadout) -> None:
        self.releases_pending.add_metric([], pool.releases_pending)
        if pool.holders is None:
            return  # the ledger could not be read: no counts rather than wrong ones
        for (kind, outcome), n in sorted(pool.reconciler_actions.items()):
            self.reconciler_actions.add_metric([kind, outcome], n)
        if pool.inventory is not None:
            self.inventory_age.add_metric([], pool.inventory_age)
            for labels, n in sorted(device_counts(pool.inventory, pool.holders).items()):
                self.devices.add_metric(list(labels), n)


class PoolCollector(Collector):
    """The pool as the hub's composers see it, read when Prometheus scrapes."""

    def __init__(self, readouts: Callable[[], Iterable[PoolReadout]]) -> None:
        """``readouts``: what each composer reads out (``Composer.readout``)."""
        self._readouts = readouts

    def describe(self) -> Iterator[Metric]:
        # Named without reading anything: the registry calls this at registration.
        yield from _PoolFamilies()

    def collect(self) -> Iterator[Metric]:
        families = _PoolFamilies()
        for pool in self._readouts():
            families.add(pool)
        yield from families
