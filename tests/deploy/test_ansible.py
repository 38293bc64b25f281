"""The Ansible deployment, tested by running it: ansible/site.yml converged into a Debian root.

A fresh Debian bookworm root from debootstrap stands in for both new machines
(connection ``community.general.chroot``): the hub (group composespawner) and
its one compute host (group composespawner_hosts, the fabric's host-01), so the
hub spawns through compose-ssh. No init runs there, so the test starts the
host's sshd itself, on a loopback address of its own, and the hub from the
systemd unit the role installed (its ExecStart, WorkingDirectory and
EnvironmentFile). The converged hub then has to serve HTTPS with the given
certificate, keep its state in PostgreSQL (the local server, on databases and a
role the playbook created) and let a campus user log in through the OpenID
Connect provider and start JupyterLab on a GPU of the simulated fabric: the
notebook runs on the host, started by the agent the hub's key is bound to,
each user's under an account of their own. A second converge must change
nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, Page, expect, sync_playwright

from composespawner.ledger import Ledger
from harness.browser import CHROMIUM, FLAGS
from harness.hub import (
    FABRIC_AUTH,
    TEST_ADMIN_CONFIG,
    Hub,
    fabric_on_its_own,
    free_port,
    process_env,
    serving,
    start_hub,
    wait_for,
)
from harness.paths import HUB_CONFIG, ROOT
from harness.postgres import PG_ADDRESS, connectable_admin_engine
from harness.tls import TLSFiles, make_tls_files, served_certificate_der
from tests.deploy.chroot_host import (
    accounts,
    as_account,
    cgroups_in,
    host_agent_server,
    host_notebook,
    host_sshd,
    in_root,
    loopback_address_and_port,
    one_host_fabric,
    site_admin_key,
    ssh_as_root,
)
from tests.support.debian import ansible_tools, debian_root
from tests.support.oidc import Account, OIDCProvider, campus_login, hub_user, oidc_provider

pytestmark = [pytest.mark.timeout(1800), pytest.mark.postgres]

ARTIFACTS = ROOT / "test-artifacts"
USERS = {
    "researcher1": Account("r1-secret", "researcher1@campus.example.edu", ("vision-lab",)),
}
RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
HOST_ID = "host-01"  # the fabric's only compute host here: the root's sshd and agent
VENV = "/opt/composespawner/venv"
HANDOFF = "composespawner/hostagent/handoff.py"
HOST_CONFIG = "/etc/composespawner/host.toml"
SSH_DIR = "etc/composespawner/ssh"  # the hub's key and known_hosts, in the root


@dataclass
class Converge:
    seconds: float
    ok: int
    changed: int
    failed: int
    log: str


@dataclass
class Deployment:
    root: Path
    public_url: str
    tls: TLSFiles
    provider: OIDCProvider
    databases: tuple[str, str]
    role: str
    converges: list[Converge]
    host_address: str  # the compute host's sshd (in the root): 127.0.1.N
    host_port: int
    site_key: Path  # a site admin's key for root, there before the converge
    cgroup_parent: str  # where the agent makes its notebooks' cgroups
    inventory: Path
    variables: Path


def test_the_playbook_passes_ansible_lint_with_the_production_profile() -> None:
    tools = ansible_tools()
    lint = subprocess.run(
        [str(tools / "ansible-lint"), "--nocolor"],
        cwd=ROOT / "ansible",
        env={**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Profile 'production' was required, and it passed" in lint.stdout + lint.stderr


# The site's reclaim policy, as a site writes it in its variables (YAML's null: no detach).
RECLAIM_POLICY = {"warn_after": 1200, "reclaim_after": 2400, "detach_after": None}


def catalog_without_stacks(path: Path) -> Path:
    """The demo catalog's hardware; notebooks on the venv's own JupyterLab (no stacks,
    whose environments would be built from PyTorch wheels this host cannot fetch)."""
    text = (HUB_CONFIG / "catalog.toml").read_text()
    text = text[: text.index("# Software stacks")].replace(
        'stack_common = "../images/common"\n', ""
    )
    path.write_text(text)
    return path


def playbook(inventory: Path, variables: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """site.yml run on ``inventory`` with ``variables`` (and ``options``)."""
    tools = ansible_tools()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # this machine's
    env.update(PATH=f"{tools}{os.pathsep}{env['PATH']}", ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [
            *(str(tools / "ansible-playbook"), "-i", str(inventory), "-e", f"@{variables}"),
            *options,
            "site.yml",
        ],
        cwd=ROOT / "ansible",
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def converge(inventory: Path, variables: Path, log: Path) -> Converge:
    started = time.monotonic()
    run = playbook(inventory, variables)
    seconds = time.monotonic() - started
    log.write_text(run.stdout + run.stderr)
    recaps = RECAP.findall(run.stdout)  # one per host: the hub, the compute host
    assert run.returncode == 0, f"the playbook failed:\n{run.stdout[-6000:]}{run.stderr}"
    assert len(recaps) == 2, run.stdout[-2000:]
    ok, changed, _, failed = (sum(int(recap[n]) for recap in recaps) for n in range(4))
    return Converge(seconds, ok, changed, failed, run.stdout)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("deploy")
    tls = make_tls_files(tmp)
    public_url = f"https://127.0.0.1:{free_port()}"
    wheel_dir = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheel_dir), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = wheel_dir.glob("composespawner-*.whl")
    admin, admin_user = connectable_admin_engine()
    suffix = uuid.uuid4().hex[:10]
    role = f"cs_deploy_{suffix}"
    databases = (f"cs_deploy_hub_{suffix}", f"cs_deploy_ledger_{suffix}")
    try:
        with (
            oidc_provider(tmp / "idp", tls, USERS, [f"{public_url}/hub/oauth_callback"]) as idp,
            fabric_on_its_own(tmp, "--inventory", str(one_host_fabric(tmp / "f.toml"))) as fabric,
            debian_root(tmp) as root,
            cgroups_in(root) as cgroup_parent,
        ):
            site_key = site_admin_key(tmp, root)
            address, port = loopback_address_and_port()
            chroot = f"ansible_connection=community.general.chroot ansible_host={root}"
            inventory = tmp / "inventory.ini"
            inventory.write_text(
                f"[composespawner]\nhub {chroot}\n"
                f"[composespawner_hosts]\n{HOST_ID} {chroot} composespawner_host_address={address}"
                f" composespawner_host_ssh_port={port}\n"
                "[all:vars]\nansible_python_interpreter=/usr/bin/python3\n"
            )
            variables = tmp / "vars.json"
            variables.write_text(
                json.dumps(
                    {
                        "composespawner_wheel": str(wheel),
                        "composespawner_constraints": str(ROOT / "constraints.txt"),
                        "composespawner_public_url": public_url,
                        "composespawner_tls_cert_file": str(tls.cert),
                        "composespawner_tls_key_file": str(tls.key),
                        "composespawner_postgresql_install": False,  # this machine's server
                        "composespawner_db_host": PG_ADDRESS.split(":")[0],
                        "composespawner_db_admin_user": admin_user,
                        "composespawner_db_user": role,
                        "composespawner_hub_db": databases[0],
                        "composespawner_ledger_db": databases[1],
                        "composespawner_oidc_issuer": idp.issuer,
                        "composespawner_oidc_client_id": idp.client_id,
                        "composespawner_oidc_client_secret": idp.client_secret,
                        "composespawner_oidc_ca_bundle_file": str(tls.ca_bundle),
                        "composespawner_allowed_groups": ["vision-lab"],
                        "composespawner_fabric_url": fabric.url,
                        "composespawner_fabric_username": FABRIC_AUTH[0],
                        "composespawner_fabric_password": FABRIC_AUTH[1],
                        "composespawner_catalog_file": str(catalog_without_stacks(tmp / "c.toml")),
                        "composespawner_manage_service": False,  # no systemd in a chroot
                        # nor a cgroup hierarchy of its own: notebooks run unlimited
                        "composespawner_enforce_shares": False,
                        "composespawner_hub_api_address": "127.0.0.1",  # hosts on loopback
                        # the simulator's figures for host-01, not this machine's
                        "composespawner_host_cores": 64,
                        "composespawner_host_memory_gib": 512,
                        "composespawner_host_manage_service": False,
                        # The site's choice where hosts run no podman (this chroot: no
                        # registry, and a catalog without stacks); the default is containers.
                        "composespawner_host_runtime": "process",
                        "composespawner_host_cgroup_parent": cgroup_parent,
                        # Idle GPUs back while servers run: read through the host's agent.
                        "composespawner_reclaim": True,
                        "composespawner_reclaim_policy": RECLAIM_POLICY,
                        "composespawner_hub_ca_bundle_file": str(tls.ca_bundle),
                    }
                )
            )
            converges = [converge(inventory, variables, tmp / f"converge{n}.log") for n in (1, 2)]
            record_figures(converges)
            yield Deployment(
                root,
                public_url,
                tls,
                idp,
                databases,
                role,
                converges,
                address,
                port,
                site_key,
                cgroup_parent,
                inventory,
                variables,
            )
    finally:
        with admin.connect() as connection:
            for name in databases:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
        admin.dispose()


def record_figures(converges: list[Converge]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    figures = [
        {"seconds": round(c.seconds, 1), "ok": c.ok, "changed": c.changed} for c in converges
    ]
    (ARTIFACTS / "ansible-converge.json").write_text(json.dumps(figures, indent=2) + "\n")


def test_a_second_converge_changes_nothing(deployment: Deployment) -> None:
    first, second = deployment.converges
    assert first.failed == second.failed == 0
    assert first.changed >= 10  # packages, venv, proxy, databases, files, migrations
    assert "RUNNING HANDLER [composespawner : Upgrade the databases]" in first.log
    assert second.changed == 0, second.log
    assert "RUNNING HANDLER" not in second.log


def unit_command(root: Path) -> tuple[list[str], dict[str, str]]:
    """The hub's command as its systemd unit would run it (in ``root``), and its environment."""
    unit = (root / "etc/systemd/system/composespawner-hub.service").read_text()
    fields = dict(re.findall(r"^(\w+)=(.*)$", unit, re.MULTILINE))
    environment = dict(
        re.findall(
            r'^(\w+)="(.*)"$', (root / fields["EnvironmentFile"].lstrip("/")).read_text(), re.M
        )
    )
    environment["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    command = [shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/bin/sh", "-c"]
    command.append(f"cd {shlex.quote(fields['WorkingDirectory'])} && exec {fields['ExecStart']}")
    return command, environment


def test_the_hubs_key_runs_the_agent_only_and_the_host_key_is_pinned(
    deployment: Deployment,
) -> None:
    root = deployment.root
    hub_key = root / SSH_DIR / "id_ed25519"
    assert hub_key.stat().st_mode & 0o777 == 0o600
    public = hub_key.with_suffix(".pub").read_text().strip()  # "ssh-ed25519 AAAA… hub's name"
    assert public.endswith(" composespawner-hub@hub")
    authorized = (root / "root/.ssh/authorized_keys").read_text().splitlines()
    # The forced command, by path in the host's venv and without site (it starts fastest).
    [handoff] = (root / VENV.lstrip("/")).glob("lib/python3*/site-packages/" + HANDOFF)
    agent = f"{VENV}/bin/python -IS /{handoff.relative_to(root)} --config {HOST_CONFIG}"
    assert [line for line in authorized if public.split()[1] in line] == [
        f'restrict,command="{agent}" {public}'
    ]
    site = deployment.site_key.with_suffix(".pub").read_text().strip()
    assert site in authorized  # the site's own keys are left alone

    host_key = " ".join((root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
    known = (root / SSH_DIR / "known_hosts").read_text().splitlines()
    where = f"[{deployment.host_address}]:{deployment.host_port}"
    assert [line for line in known if not line.startswith("#")] == [f"{where} {host_key}"]

    dropin = (root / "etc/ssh/sshd_config.d/composespawner.conf").read_text()
    assert "\nPermitRootLogin forced-commands-only\n" in dropin
    settings = in_root(root, "/usr/sbin/sshd", "-T")
    assert "permitrootlogin forced-commands-only" in settings.stdout.splitlines(), settings
    assert {"maxsessions 64", "clientaliveinterval 60"} <= set(settings.stdout.splitlines())

    environment = hub_environment(root)
    assert environment["COMPOSE_SPAWNER"] == "compose-ssh"  # the group lists a host
    assert environment["COMPOSE_SSH_HOSTS"] == (
        f"{HOST_ID}={deployment.host_address}:{deployment.host_port}"
    )
    assert environment["COMPOSE_SSH_KNOWN_HOSTS"] == f"/{SSH_DIR}/known_hosts"
    assert environment["COMPOSE_SSH_MAX_SESSIONS"] == "64"  # the host's sshd MaxSessions
    agent = (root / "etc/composespawner/host.toml").read_text()
    assert f'listen_address = "{deployment.host_address}"' in agent
    # Hub and hosts say one runtime, the site's: the start is refused where they differ.
    assert environment["COMPOSE_HOST_RUNTIME"] == "process"
    assert '\nruntime = "process"\n' in agent
    assert not (root / "etc/containers/containers.conf.d/composespawner.conf").exists()
    assert (root / "etc/composespawner/host.toml").stat().st_mode & 0o777 == 0o600


@pytest.fixture(scope="module")
def sshd(deployment: Deployment) -> Iterator[None]:
    where = (deployment.host_address, deployment.host_port)
    try:
        with (
            host_agent_server(deployment.root, deployment.root.parent / "server.log"),
            host_sshd(deployment.root, *where, deployment.root.parent / "sshd.log"),
        ):
            yield
    finally:  # the agent's log, kept beside sshd's when the root goes
        agent_log = deployment.root / "var/log/composespawner-host/agent.log"
        if agent_log.exists():
            shutil.copyfile(agent_log, deployment.root.parent / "agent.log")


def test_over_ssh_the_hubs_key_gets_the_agent_and_no_shell(
    deployment: Deployment, sshd: None
) -> None:
    hub_key = deployment.root / SSH_DIR / "id_ed25519"
    where = (deployment.host_address, deployment.host_port, hub_key.with_name("known_hosts"))
    tried = ssh_as_root(*where, hub_key, "id")
    assert "uid=0" not in tried.stdout, tried
    assert tried.returncode != 0, tried
    assert '"refused"' in tried.stdout, tried  # the agent's answer
    # Root's other keys have no forced command: refused (PermitRootLogin forced-commands-only).
    site = ssh_as_root(*where, deployment.site_key, "id")
    assert site.returncode == 255, site
    assert "uid=0" not in site.stdout, site
    log = (deployment.root.parent / "sshd.log").read_text()
    assert "ROOT LOGIN REFUSED" in log, log


def hub_environment(root: Path) -> dict[str, str]:
    """The hub's environment file as the converge wrote it."""
    text = (root / "etc/composespawner/composespawner.env").read_text()
    return dict(re.findall(r'^(\w+)="(.*)"$', text, re.M))


@pytest.fixture(scope="module")
def hub(deployment: Deployment, sshd: None) -> Iterator[Hub]:
    root = deployment.root
    command, environment = unit_command(root)
    # The tests' admin token for the REST API, as the production config's extra config.
    (root / "etc/composespawner/test_admin.py").write_text(TEST_ADMIN_CONFIG)
    environment["COMPOSE_EXTRA_CONFIG"] = "/etc/composespawner/test_admin.py"
    state = root / environment["COMPOSE_STATE_DIR"].lstrip("/")
    log = deployment.root.parent / "hub-test.log"  # outside the root: kept after the test
    hub = Hub(
        url=environment["COMPOSE_PUBLIC_URL"],
        fabric_url=environment["COMPOSE_FABRIC_URL"],
        state=state,
        homes=root / environment["COMPOSE_HOMES_DIR"].lstrip("/"),
        proc=start_hub(command, state, environment, log),
        log_path=log,
        env=environment,
        command=command,
    )
    with serving(hub, deployment.tls.ca_bundle):
        yield hub


@pytest.fixture
def page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = browser.new_context(ignore_https_errors=True)
        yield context.new_page()
        browser.close()


def test_the_converged_host_serves_https_uses_postgresql_and_spawns(
    deployment: Deployment, hub: Hub, page: Page
) -> None:
    assert served_certificate_der(hub.url) == deployment.tls.server_certificate_der()

    campus_login(page, hub, USERS, "researcher1")
    page.wait_for_url("**/hub/spawn**")
    page.check("#gpu-t4")
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/user/researcher1/lab**", timeout=180_000)
    expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=60_000)

    user = hub_user(hub, "researcher1")
    assert user is not None
    assert user["groups"] == ["vision-lab"]
    tables = postgres_tables(hub.env["COMPOSE_HUB_DB_URL"]) | postgres_tables(
        hub.env["COMPOSE_LEDGER_URL"]
    )
    assert {"users", "spawners", "machines", "devices"} <= tables
    ledger = Ledger(hub.ledger_url())
    try:
        machines = [(m.user_name, m.state) for m in ledger.live_machines()]
    finally:
        ledger.close()
    assert machines == [("researcher1", "running")]
    host = hub.server_host("researcher1")
    assert host == HOST_ID
    assert len(hub.attached(host)) == 1

    # On the host, through its agent: as the user's own account, on the host's address.
    pid = host_notebook(deployment.root, "researcher1")
    assert pid is not None
    account = accounts(deployment.root)["researcher1"]
    assert Path(f"/proc/{pid}").stat().st_uid == int(account[2]) >= 1000
    assert os.readlink(f"/proc/{pid}/root") == str(deployment.root)
    service_url = process_env(pid)["JUPYTERHUB_SERVICE_URL"]
    assert service_url.startswith(f"http://{deployment.host_address}:"), service_url
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()  # held to its share by the agent
    assert f":/{deployment.cgroup_parent}/" in cgroups, cgroups
    # Every channel was handed to the agent's server the unit runs (none ran alone).
    agent_log = (deployment.root / "var/log/composespawner-host/agent.log").read_text()
    assert "notebook for machine" in agent_log
    assert "no agent's server" not in agent_log, agent_log

    stopped = hub.api.delete(f"{hub.url}/hub/api/users/researcher1/server", timeout=60)
    assert stopped.status_code in (202, 204)
    wait_for(lambda: hub.attached(host) == [], 60, "the GPU to go back to the pool")
    wait_for(
        lambda: host_notebook(deployment.root, "researcher1") is None, 30, "the notebook to end"
    )


def test_the_reclaimer_runs_with_the_sites_policy_reading_the_hosts_agents(
    deployment: Deployment, hub: Hub
) -> None:
    environment = hub_environment(deployment.root)
    assert environment["COMPOSE_RECLAIM"] == "1"
    assert set(environment["COMPOSE_RECLAIM_POLICY"].split(",")) == {
        "warn_after=1200",
        "reclaim_after=2400",
        "detach_after=off",
    }
    ca_bundle = environment["COMPOSE_HUB_CA_BUNDLE"]
    assert (deployment.root / ca_bundle.lstrip("/")).read_bytes() == (
        deployment.tls.ca_bundle.read_bytes()
    )

    def started() -> str | None:
        log = hub.log_path.read_text(errors="replace")
        return next((line for line in log.splitlines() if "Reclaiming idle GPUs" in line), None)

    line = wait_for(started, 60, "the reclaimer to start")
    assert "activity from agent" in line
    policy = json.loads(line.split("policy ", 1)[1])
    assert (policy["detach_after"], policy["warn_after"], policy["reclaim_after"]) == (
        None,
        1200,
        2400,
    )


def postgres_tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_two_users_notebooks_run_as_their_own_accounts_and_cannot_touch_each_other(
    deployment: Deployment, hub: Hub
) -> None:
    root = deployment.root
    pids = {}
    for name in ("researcher1", "researcher2"):
        made = hub.request("POST", f"/users/{name}")  # an admin's way in: accounts made too
        assert made.status_code in (201, 409), made.text
        response = hub.spawn(name, {"gpu_model": "t4", "gpu_count": 1})
        assert response.status_code in (201, 202), response.text
    for name in ("researcher1", "researcher2"):
        hub.wait_ready(name, timeout=180)
        pid = host_notebook(root, name)
        assert pid is not None, f"{name}'s notebook is not running on the host"
        pids[name] = pid
    try:
        uids = {name: Path(f"/proc/{pid}").stat().st_uid for name, pid in pids.items()}
        assert uids["researcher1"] != uids["researcher2"]
        assert 0 not in uids.values()
        home = "/home/researcher2"
        assert (root / home.lstrip("/")).stat().st_mode & 0o777 == 0o700
        own = as_account(
            root,
            "researcher2",
            f"echo mine > {home}/notes && cat {home}/notes && kill -0 {pids['researcher2']}",
        )
        assert (own.returncode, own.stdout) == (0, "mine\n"), own.stderr  # what the others try
        for attempt in (
            f"cat {home}/notes",
            f"ls {home}",
            f"cat /proc/{pids['researcher2']}/environ",
            f"kill -0 {pids['researcher2']}",
            f"kill -TERM {pids['researcher2']}",
        ):
            other = as_account(root, "researcher1", attempt)
            assert other.returncode != 0, attempt
            assert "denied" in other.stderr or "not permitted" in other.stderr, other.stderr
        assert Path(f"/proc/{pids['researcher2']}").exists()  # it lives
    finally:
        for name in pids:
            hub.stop(name)
            hub.wait_gone(name)


def test_a_site_that_forbids_root_login_is_not_loosened(deployment: Deployment) -> None:
    """Run last: it changes the root's sshd config, and puts it back."""
    root = deployment.root
    dropin = root / "etc/ssh/sshd_config.d/composespawner.conf"
    main = root / "etc/ssh/sshd_config"
    kept = dropin.read_text(), main.read_text()
    dropin.unlink()
    main.write_text(kept[1] + "PermitRootLogin no\n")
    keys = [(root / SSH_DIR / "id_ed25519.pub").read_text().strip()]
    try:
        run = playbook(
            deployment.inventory,
            deployment.variables,
            *("--limit", HOST_ID, "-e", json.dumps({"composespawner_host_hub_public_keys": keys})),
        )
        assert run.returncode != 0, run.stdout[-3000:]
        assert "forbids root login (PermitRootLogin no)" in run.stdout, run.stdout[-3000:]
        assert not dropin.exists()
    finally:
        dropin.write_text(kept[0])
        main.write_text(kept[1])
