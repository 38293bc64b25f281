"""The pool's metrics: counted where things happen, read from the hub's state at scrape time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from composespawner.domain.catalog import Catalog
from composespawner.domain.hardware import Device, Inventory
from composespawner.domain.quotas import QuotaRule
from composespawner.domain.request import MachineRequest
from composespawner.fabric.base import FabricUnreachable
from composespawner.ledger import Actor, Ledger
from composespawner.services.composer import Composer
from composespawner.services.failures import ComposeRefused
from composespawner.services.metrics import MeasuredFabric, PoolCollector, device_counts
from composespawner.services.settings import MeasuredComposer
from harness.paths import HUB_CONFIG
from tests.support.inprocess import InProcessFabric

TWO_T4 = MachineRequest(gpu_model="t4", gpu_count=2, network="shared", scratch_gb=0)


def _gpu(block: str, state: str = "free", zone: str = "rack-1") -> Device:
    return Device(block, "gpu", "NVIDIA T4", frozenset({zone}), "c1", state)  # type: ignore[arg-type]


def test_device_counts_tell_held_from_free_from_someone_elses() -> None:
    inventory = Inventory(
        devices=(
            _gpu("a", "attached"),
            _gpu("b"),
            _gpu("c", "attached"),  # attached by a client that is not us
            _gpu("d", zone="rack-2"),
        )
    )

    counts = device_counts(inventory, {"a": "m1"})

    assert counts == {
        ("gpu", "NVIDIA T4", "rack-1", "held"): 1,
        ("gpu", "NVIDIA T4", "rack-1", "free"): 1,
        ("gpu", "NVIDIA T4", "rack-1", "unavailable"): 1,
        ("gpu", "NVIDIA T4", "rack-2", "free"): 1,
    }


@pytest.fixture
async def composer(tmp_path: Path) -> AsyncIterator[Composer]:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.upgrade()
    composer = MeasuredComposer(  # as the hub builds it: composes measured
        ledger=ledger,
        fabric=MeasuredFabric(InProcessFabric.from_inventory(HUB_CONFIG / "fabric_inventory.toml")),
        catalog=Catalog.from_file(HUB_CONFIG / "catalog.toml"),
        hub_id="hub-a",
    )
    yield composer
    await composer.close()


def _scrape(composer: Composer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: [composer.readout()]))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _held_t4s(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "composespawner_devices" and ("state", "held") in labels
        if ("model", "NVIDIA T4") in labels
    )


async def test_a_scrape_shows_the_devices_a_compose_holds_and_the_reconcilers_actions(
    composer: Composer,
) -> None:
    machine = await composer.compose(
        user="u1",
        groups=frozenset(),
        server="",
        request=TWO_T4,
        progress=lambda message: None,
    )
    composer.ledger.record_reconcile_action("reattach", "error", "test", host_id=machine.host)

    held = _scrape(composer)
    await composer.release(machine.machine_id, reason="stopped")
    await composer.pool.inventory()  # what the scrape after the release asked for in the background
    freed = _scrape(composer)

    assert _held_t4s(held) == 2
    assert _held_t4s(freed) == 0
    action = (
        "composespawner_reconciler_actions_total",
        (("kind", "reattach"), ("outcome", "error")),
    )
    assert freed[action] == 1
    assert freed[("composespawner_releases_pending_retry", ())] == 0


async def test_fabric_errors_are_counted_by_operation_and_error() -> None:
    class Unreachable(InProcessFabric):
        async def detach(self, system_id: str, block_id: str) -> None:
            raise FabricUnreachable("test: no answer")

    fabric = MeasuredFabric(Unreachable.from_inventory(HUB_CONFIG / "fabric_inventory.toml"))
    name, labels = (
        "composespawner_fabric_request_errors_total",
        {
            "operation": "detach",
            "error": "FabricUnreachable",
        },
    )
    before = REGISTRY.get_sample_value(name, labels) or 0.0

    with pytest.raises(FabricUnreachable):
        await fabric.detach("host-01", "r1-t4-1")

    assert REGISTRY.get_sample_value(name, labels) == before + 1


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_composes_are_timed_and_refusals_counted_by_reason(composer: Composer) -> None:
    composed = _sample("composespawner_compose_duration_seconds_count")
    refused = _sample("composespawner_compose_refusals_total", reason="quota-exceeded")

    await composer.compose(
        user="u1",
        groups=frozenset(),
        server="",
        request=TWO_T4,
        progress=lambda message: None,
    )
    composer.ledger.policy.set_quota_rule(QuotaRule("user", "u1", gpus_held=3), Actor("admin"))
    with pytest.raises(ComposeRefused):
        await composer.compose(
            user="u1",
            groups=frozenset(),
            server="second",
            request=TWO_T4,
            progress=lambda message: None,
        )

    assert _sample("composespawner_compose_duration_seconds_count") == composed + 1
    assert _sample("composespawner_compose_refusals_total", reason="quota-exceeded") == refused + 1
