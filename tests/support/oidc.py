"""A real OpenID Connect provider on 127.0.0.1 for login tests (oidc_provider/provider.mjs).

panva's oidc-provider under Node, over HTTPS with a test CA: authorization code
with PKCE required, RS256-signed ID tokens, groups in a ``groups`` claim. Users
and their groups live in a JSON file the provider reads at every login, so
:meth:`OIDCProvider.set_groups` changes them at the provider between logins.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from playwright.sync_api import Page

from harness.hub import Hub
from harness.ports import free_port
from harness.tls import TLSFiles

FOLDER = Path(__file__).resolve().parent / "oidc_provider"
READY_WITHIN_S = 30.0
STOP_WITHIN_S = 10.0


@dataclass(frozen=True)
class Account:
    password: str
    email: str
    groups: tuple[str, ...] = ()


@dataclass
class OIDCProvider:
    issuer: str
    client_id: str
    client_secret: str
    tls: TLSFiles
    users_file: Path
    log_path: Path

    def set_groups(self, login: str, groups: list[str]) -> None:
        """What the provider says ``login`` belongs to from the next login on."""
        users = json.loads(self.users_file.read_text())
        users[login]["groups"] = groups
        write_json(self.users_file, users)

    def discovery(self) -> dict[str, Any]:
        answer = requests.get(
            f"{self.issuer}/.well-known/openid-configuration",
            verify=str(self.tls.ca_bundle),
            timeout=5,
        )
        answer.raise_for_status()
        document: dict[str, Any] = answer.json()
        return document

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def write_json(path: Path, value: Any) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(value, indent=2))
    partial.replace(path)


def node_modules() -> Path:
    """The provider's packages (``make install-test`` installs them from the lock)."""
    modules = FOLDER / "node_modules" / "oidc-provider"
    assert modules.is_dir(), f"run `make install-test`: {modules} is missing"
    return modules


@contextmanager
def oidc_provider(
    folder: Path,
    tls: TLSFiles,
    users: dict[str, Account],
    redirect_uris: list[str],
) -> Iterator[OIDCProvider]:
    """The provider serving ``users`` to one confidential client allowed ``redirect_uris``."""
    node_modules()
    node = shutil.which("node")
    assert node is not None, "Node.js is needed for the test OpenID provider"
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    provider = OIDCProvider(
        issuer=f"https://127.0.0.1:{port}",
        client_id="composespawner-hub",
        client_secret="test-client-secret-" + str(port),
        tls=tls,
        users_file=folder / "users.json",
        log_path=folder / "provider.log",
    )
    write_json(
        provider.users_file,
        {
            login: {"password": a.password, "email": a.email, "groups": list(a.groups)}
            for login, a in users.items()
        },
    )
    config = {
        "issuer": provider.issuer,
        "port": port,
        "tls_cert": str(tls.cert),
        "tls_key": str(tls.key),
        "users_file": str(provider.users_file),
        "clients": [
            {
                "client_id": provider.client_id,
                "client_secret": provider.client_secret,
                "redirect_uris": redirect_uris,
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "token_endpoint_auth_method": "client_secret_basic",
            }
        ],
    }
    write_json(folder / "provider.json", config)
    with provider.log_path.open("wb") as log:
        process = subprocess.Popen(
            [node, str(FOLDER / "provider.mjs"), str(folder / "provider.json")],
            cwd=FOLDER,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        _wait_listening(process, provider)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_WITHIN_S)
        assert process.stdout is not None
        process.stdout.close()


def _wait_listening(process: subprocess.Popen[bytes], provider: OIDCProvider) -> None:
    """Until it prints that it listens (a blocking read, bounded by a timer that kills it)."""
    assert process.stdout is not None
    timer = threading.Timer(READY_WITHIN_S, process.kill)
    timer.start()
    try:
        line = process.stdout.readline().decode(errors="replace").strip()
    finally:
        timer.cancel()
    if line != f"listening {provider.issuer}":
        process.wait(timeout=STOP_WITHIN_S)
        raise AssertionError(
            f"the OpenID provider did not start ({line or 'no output'}; "
            f"exit {process.returncode}):\n{provider.log()}"
        )


def campus_login(page: Page, hub: Hub, users: dict[str, Account], login: str) -> None:
    """From the hub's login page through the provider's form (the provider sends it back)."""
    page.goto(f"{hub.url}/hub/login")
    page.get_by_text("Sign in with your campus account").click()
    page.wait_for_url("**/interaction/**")
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", users[login].password)
    page.click("button[type=submit]")


def hub_user(hub: Hub, name: str) -> dict[str, Any] | None:
    """The hub's model of user ``name`` (None: the hub has no such user)."""
    answer = hub.api.get(f"{hub.url}/hub/api/users/{name}", timeout=10)
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    user: dict[str, Any] = answer.json()
    return user
