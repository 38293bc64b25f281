"""The production config, loaded as JupyterHub loads it: whose account notebooks run as."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from harness.paths import HUB_CONFIG


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: str) -> Config:
    """The production config under a complete set of settings, plus ``extra``."""
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    settings = {
        "COMPOSE_PUBLIC_URL": "https://gpu-hub.example.edu",
        "COMPOSE_TLS_CERT": str(tmp_path / "cert.pem"),
        "COMPOSE_TLS_KEY": str(tmp_path / "key.pem"),
        "COMPOSE_HUB_DB_URL": "postgresql+psycopg://hub@db/jupyterhub",
        "COMPOSE_LEDGER_URL": "postgresql+psycopg://hub@db/composespawner",
        "COMPOSE_OIDC_ISSUER": "https://login.example.edu",
        "COMPOSE_OIDC_CLIENT_ID": "hub",
        "COMPOSE_OIDC_CLIENT_SECRET_FILE": str(secret),
        "COMPOSE_ALLOWED_GROUPS": "cs-101",
        "COMPOSE_FABRIC_URL": "https://fabric.example.edu",
        "COMPOSE_FABRIC_USERNAME": "hub",
        "COMPOSE_FABRIC_PASSWORD_FILE": str(secret),
        "COMPOSE_CATALOG_FILE": str(HUB_CONFIG / "catalog.toml"),
        "COMPOSE_STATE_DIR": str(tmp_path),
        "COMPOSE_HUB_ID": "campus-hub",
        **extra,
    }
    for name in [name for name in os.environ if name.startswith("COMPOSE_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    loader = PyFileConfigLoader("production_config.py", path=str(HUB_CONFIG))
    return loader.load_config()


def test_each_user_gets_an_account_of_their_own_with_a_home_under_the_homes_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load(tmp_path, monkeypatch, COMPOSE_HOMES_DIR="/srv/homes")
    assert config.CampusAuthenticator.create_system_users is True
    assert config.CampusAuthenticator.system_user_homes == "/srv/homes"
    assert "shared_account" not in config.ComposeSpawner
    assert load(tmp_path, monkeypatch).CampusAuthenticator.system_user_homes == "/home"


def test_notebooks_in_kubernetes_need_no_system_accounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load(tmp_path, monkeypatch, COMPOSE_SPAWNER="compose-kubernetes")
    assert "create_system_users" not in config.CampusAuthenticator


def test_one_account_for_all_notebooks_is_refused_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="never runs notebooks under one shared account") as e:
        load(tmp_path, monkeypatch, COMPOSE_SHARED_ACCOUNT="1")
    assert "read, change or kill another's files" in str(e.value)

    extra = tmp_path / "local.py"
    extra.write_text("c.ComposeSpawner.shared_account = True\n")
    with pytest.raises(SystemExit, match="never runs notebooks under one shared account"):
        load(tmp_path, monkeypatch, COMPOSE_EXTRA_CONFIG=str(extra))


def reclaimer_of(config: Config) -> dict[str, Any] | None:
    return next((s for s in config.JupyterHub.services if s["name"] == "compose-reclaimer"), None)


def test_the_reclaimer_runs_only_where_the_site_turns_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = load(tmp_path, monkeypatch)
    assert reclaimer_of(off) is None
    assert "compose-reclaimer" not in {role["name"] for role in off.JupyterHub.load_roles}

    on = load(tmp_path, monkeypatch, COMPOSE_RECLAIM="1")
    service = reclaimer_of(on)
    assert service is not None
    assert service["command"][-2:] == ["reclaimer", f"--config={HUB_CONFIG}/production_config.py"]
    [role] = [r for r in on.JupyterHub.load_roles if r["name"] == "compose-reclaimer"]
    assert role["scopes"] == ["access:servers"]
    # It reaches the servers' kernels as users do, through the public URL.
    assert on.ReclaimerApp.hub_url == "https://gpu-hub.example.edu"


@pytest.mark.parametrize(
    ("spawner", "source"),
    [("compose", "nvml"), ("compose-ssh", "agent"), ("compose-kubernetes", "dcgm")],
)
def test_activity_is_read_where_the_spawner_runs_notebooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: str, source: str
) -> None:
    ssh = {
        "COMPOSE_SSH_HOSTS": "host-1=10.0.0.11",
        "COMPOSE_SSH_KEY": "/k",
        "COMPOSE_SSH_KNOWN_HOSTS": "/kh",
        "COMPOSE_HUB_API_IP": "10.0.0.1",
    }
    config = load(
        tmp_path,
        monkeypatch,
        COMPOSE_SPAWNER=spawner,
        COMPOSE_RECLAIM="1",
        COMPOSE_DCGM_URL_TEMPLATE="http://{host_id}.gpu.example.edu:9400/metrics",
        **(ssh if spawner == "compose-ssh" else {}),
    )
    assert config.ReclaimerApp.activity_source == source
    assert ("dcgm_url_template" in config.ReclaimerApp) == (source == "dcgm")


def test_kubernetes_needs_where_each_nodes_dcgm_exporter_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for unset in ({}, {"COMPOSE_DCGM_URL_TEMPLATE": ""}):
        with pytest.raises(SystemExit, match="set COMPOSE_DCGM_URL_TEMPLATE"):
            load(
                tmp_path,
                monkeypatch,
                COMPOSE_SPAWNER="compose-kubernetes",
                COMPOSE_RECLAIM="1",
                **unset,
            )


def test_the_sites_policy_is_read_and_one_that_cannot_work_stops_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = "warn_after=900, reclaim_after=1800,detach_after=off,busy_percent=2.5"
    config = load(tmp_path, monkeypatch, COMPOSE_RECLAIM_POLICY=policy)
    assert config.ComposeSettings.reclaim_policy == {
        "warn_after": 900,
        "reclaim_after": 1800,
        "detach_after": None,
        "busy_percent": 2.5,
    }
    assert load(tmp_path, monkeypatch).ComposeSettings.reclaim_policy == {}  # the defaults
    for bad, said in [
        ("warn_after", "'warn_after' is not field=value"),
        ("=900", "is not field=value"),
        ("warn_after=soon", "warn_after must be a number"),
        ("warn_after=-5", "warn_after must be"),
        ("wait_after=900", "unknown field 'wait_after'"),
        ("warn_after=3600,reclaim_after=1800", "cannot be used"),
        ("keeps_allowed=off", "keeps_allowed=0 allows no Keep"),
    ]:
        with pytest.raises(SystemExit, match=said):
            load(tmp_path, monkeypatch, COMPOSE_RECLAIM_POLICY=bad)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        # the reclaimer reads every 60 s: a gap of 60 s between readings never fills a window
        ({"COMPOSE_RECLAIM_POLICY": "max_gap=60"}, "must be less than the policy's max_gap"),
        ({"COMPOSE_HUB_CA_BUNDLE": "/nonexistent/ca.pem"}, "hub_ca_bundle"),
        (
            {"COMPOSE_SPAWNER": "compose-kubernetes", "COMPOSE_DCGM_URL_TEMPLATE": "http://x/m"},
            "has no {host_id}",
        ),
    ],
)
def test_a_reclaimer_that_could_not_start_stops_the_hub_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str], said: str
) -> None:
    with pytest.raises(SystemExit, match=re.escape(said)):
        load(tmp_path, monkeypatch, COMPOSE_RECLAIM="1", **extra)
    load(tmp_path, monkeypatch, **extra)  # with the reclaimer off, nothing reads them
