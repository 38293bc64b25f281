"""The composition root: one settings object read by every process, one factory."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from composespawner.ledger import Ledger, SchemaNotCurrent
from composespawner.services.settings import (
    ComposeSettings,
    open_ledger,
    settings_from_config,
    shared_composer,
)
from composespawner.spawners.spawner import ComposeSpawner
from harness.paths import HUB_CONFIG

COMPOSESPAWNER = str(Path(sys.executable).parent / "composespawner")


def test_every_setting_is_a_spawner_knob() -> None:
    spawner_knobs = ComposeSpawner.class_traits(config=True)
    assert set(ComposeSettings.class_own_traits(config=True)) <= spawner_knobs.keys()


def test_services_read_the_spawners_section_which_wins_over_the_shared_one() -> None:
    config = Config()
    config.ComposeSettings.ledger_url = "sqlite:///shared.sqlite"
    config.ComposeSettings.hub_id = "hub-a"
    config.ComposeSpawner.hub_id = "hub-b"
    config.ComposeSpawner.start_timeout = 5  # a spawner knob, not a setting

    settings = settings_from_config(config)

    assert (settings.ledger_url, settings.hub_id) == ("sqlite:///shared.sqlite", "hub-b")


def test_a_ledger_without_the_current_schema_is_refused_with_what_to_do(tmp_path: Path) -> None:
    settings = ComposeSettings(ledger_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")

    with pytest.raises(SchemaNotCurrent, match="composespawner upgrade-db"):
        open_ledger(settings)

    Ledger(settings.ledger_url).upgrade()
    open_ledger(settings).close()


async def test_one_composer_per_settings_closed_when_the_hub_cancels_its_tasks(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    Ledger(url).upgrade()
    settings = ComposeSettings(
        ledger_url=url,
        catalog_file=str(HUB_CONFIG / "catalog.toml"),
        fabric_password="a",
        reclaim_policy={"detach_after": 120, "max_gap": 60},  # a Dict setting, in the key too
    )
    composer = shared_composer(settings, settings.log)
    assert shared_composer(settings, settings.log) is composer
    settings.fabric_password = "b"  # new credentials: never the old composer
    other = shared_composer(settings, settings.log)
    assert other is not composer

    closers = [t for t in asyncio.all_tasks() if t.get_name() == "close composer"]
    assert len(closers) == 2
    await asyncio.sleep(0)  # the hub serves requests long before it shuts down
    for task in closers:  # what JupyterHub does to pending tasks at shutdown
        task.cancel()
    await asyncio.wait(closers)

    assert shared_composer(settings, settings.log) is not other  # the closed one is gone
    for task in asyncio.all_tasks():
        if task.get_name() == "close composer":
            task.cancel()


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMPOSESPAWNER, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_upgrade_db_brings_the_configured_ledger_to_the_current_schema(tmp_path: Path) -> None:
    ledger_file = tmp_path / "ledger.sqlite"
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(f"c.ComposeSpawner.ledger_url = 'sqlite:///{ledger_file}'\n")

    first = _run("upgrade-db", "-f", str(config), cwd=tmp_path)
    again = _run("upgrade-db", "-f", str(config), cwd=tmp_path)

    assert first.returncode == 0, first.stderr
    assert "Upgraded the ledger's schema from (empty) to" in first.stderr
    assert "schema is current" in again.stderr
    open_ledger(ComposeSettings(ledger_url=f"sqlite:///{ledger_file}")).close()


def test_upgrade_db_without_a_config_file_says_so(tmp_path: Path) -> None:
    result = _run("upgrade-db", "-f", "nowhere.py", cwd=tmp_path)

    assert result.returncode != 0
    assert "no config file 'nowhere.py'" in result.stderr
    assert not list(tmp_path.iterdir())  # no ledger made from defaults


def test_importing_registers_no_collector_and_registering_is_once_per_registry() -> None:
    # A fresh interpreter: this process's default registry may have the pool's already.
    script = (
        "from prometheus_client import REGISTRY, generate_latest\n"
        "import composespawner.services.settings as settings\n"
        "assert b'composespawner_devices' not in generate_latest(REGISTRY), 'on import'\n"
        "settings.register_pool_metrics()\n"
        "settings.register_pool_metrics()\n"
        "assert b'composespawner_devices' in generate_latest(REGISTRY), 'not registered'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_a_reclaim_policy_that_cannot_work_is_refused_with_the_fields_problem() -> None:
    with pytest.raises(TraitError, match="reclaim_policy cannot be used: detach_after must be"):
        ComposeSettings(reclaim_policy={"detach_after": -1})
    policy = ComposeSettings(reclaim_policy={"warn_after": 600, "reclaim_after": 1200})
    assert policy.site_reclaim_policy().reclaim_after == 1200
