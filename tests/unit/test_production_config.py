"""The production config, loaded as JupyterHub loads it: whose account notebooks run as."""

from __future__ import annotations

import os
from pathlib import Path

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
