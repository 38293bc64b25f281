# A production hub: campus login through OpenID Connect, HTTPS on the public port,
# PostgreSQL for the hub and the ledger, a real fabric manager. The Ansible role
# (ansible/) installs it as /etc/composespawner/jupyterhub_config.py beside an
# environment file; every site-specific value comes from the environment:
#
# Required
#   COMPOSE_PUBLIC_URL          https://gpu-hub.example.edu (the hub listens there)
#   COMPOSE_TLS_CERT, _KEY      certificate chain and key for it (PEM files)
#   COMPOSE_HUB_DB_URL          the hub's database: postgresql+psycopg://hub@db/jupyterhub
#   COMPOSE_LEDGER_URL          the ledger's: postgresql+psycopg://hub@db/composespawner
#                               (its own database: both keep an alembic_version table)
#   COMPOSE_OIDC_ISSUER         the identity provider, as its discovery document names it
#   COMPOSE_OIDC_CLIENT_ID      this hub's client at the provider; its redirect URI is
#                               $COMPOSE_PUBLIC_URL/hub/oauth_callback
#   COMPOSE_OIDC_CLIENT_SECRET_FILE  a file holding the client's secret
#   COMPOSE_FABRIC_URL          the fabric manager's Redfish service
#   COMPOSE_FABRIC_USERNAME     its account for this hub
#   COMPOSE_FABRIC_PASSWORD_FILE     a file holding that account's password
#   COMPOSE_CATALOG_FILE        the GPU catalog (catalog.toml)
#   COMPOSE_STATE_DIR           cookie secret and the proxy's pid file (0700)
#   COMPOSE_HUB_ID              this hub's name on the fabric (machines it composed carry it)
# Who may log in (at least one of the first two)
#   COMPOSE_ALLOWED_GROUPS      provider groups whose members may log in (comma-separated)
#   COMPOSE_ALLOWED_DOMAINS     e-mail domains whose (verified) users may log in
#   COMPOSE_ADMIN_GROUPS        provider groups of the hub's and the GPU pool's admins
# Optional
#   COMPOSE_OIDC_CA_BUNDLE      CA bundle for the provider (an on-premises Keycloak)
#   COMPOSE_OIDC_USERNAME_CLAIM claim naming users (preferred_username)
#   COMPOSE_OIDC_GROUPS_CLAIM   claim listing a user's groups (groups)
#   COMPOSE_OIDC_SCOPES         scopes asked for (openid profile email groups)
#   COMPOSE_FABRIC_CA_BUNDLE    CA bundle for the fabric manager
#   COMPOSE_SPAWNER             compose (local processes), compose-ssh (on the composed
#                               machine's host, through its agent) or compose-kubernetes
#                               (compose)
#   COMPOSE_HOMES_DIR           where local notebooks' users get their homes (/home): each
#                               user gets a system account of their own at first login
#   COMPOSE_PROXY_COMMAND       configurable-http-proxy's path (found on PATH)
#   COMPOSE_PROXY_API_PORT, COMPOSE_HUB_API_PORT, COMPOSE_PORTAL_PORT  (8001, 8081, 8002)
#   COMPOSE_HUB_API_IP          where the hub's API listens for notebooks (127.0.0.1); with
#                               compose-ssh an address the compute hosts reach (plain HTTP:
#                               keep the hosts' network private)
#   COMPOSE_HUB_CONNECT_URL     the hub's API as notebooks reach it, where that is not
#                               http://COMPOSE_HUB_API_IP:PORT (a name, a NAT)
# With COMPOSE_SPAWNER=compose-ssh (the Ansible role writes these)
#   COMPOSE_SSH_HOSTS           each compute host's fabric id = its sshd's address[:port]:
#                               host-1=10.0.0.11,host-2=10.0.0.12:2222
#   COMPOSE_SSH_KEY             the hub's private key; root's authorized_keys on each host
#                               bind it to the agent (composespawner-host) as a forced command
#   COMPOSE_SSH_KNOWN_HOSTS     every host's key (no host outside it is ever connected to)
#   COMPOSE_SSH_MAX_SESSIONS    channels open at once on the hub's connection to a host: the
#                               hosts' sshd MaxSessions (10, OpenSSH's default; the role's 64)
#   COMPOSE_HOST_RUNTIME        containers (each notebook in a container of its own from its
#                               stack's image, by digest: the default) or process (the host
#                               builds the stack's environment; one pid namespace, /tmp and
#                               network for all): as the hosts' agents' config says
#   COMPOSE_STACK_IMAGES        with containers: each stack's image by digest, where the
#                               catalog names none: pytorch=REGISTRY/cs/pytorch-gpu@sha256:…,…
#   COMPOSE_STACK_VARIANT       with containers: gpu (the default) or cpu images
# Optional, whatever the spawner
#   COMPOSE_CULL_TIMEOUT, COMPOSE_CULL_EVERY   seconds (3600, 300)
#   COMPOSE_MAX_GPUS_PER_USER   (4)
#   COMPOSE_ENFORCE_SHARES      required (a share no cgroup can hold refuses the start)
#                               or best-effort (it runs unlimited, with a warning)
# Giving idle GPUs back while servers run (README: "Idle GPUs go back")
#   COMPOSE_RECLAIM             1 runs the reclaimer (0: off, idle GPUs stay with servers)
#   COMPOSE_RECLAIM_POLICY      what differs from the defaults, field=value comma-separated:
#                               detach_after=600,warn_after=1800,reclaim_after=3600 (seconds;
#                               off turns that step off), keeps_allowed=2 (0: no Keep)
#   COMPOSE_DCGM_URL_TEMPLATE   with compose-kubernetes: each node's DCGM exporter,
#                               http://{host_id}:9400/metrics (the GPU operator runs one);
#                               compose-ssh reads each host's agent, compose this host's NVML
#   COMPOSE_HUB_CA_BUNDLE       CA bundle for the public URL's certificate, where the system
#                               does not trust it (the reclaimer reaches kernels through it)
#   COMPOSE_EXTRA_CONFIG        a further config file loaded last (local overrides)
#
# Schema upgrades are a deploy step, as for JupyterHub itself:
#   jupyterhub upgrade-db -f FILE && composespawner upgrade-db -f FILE
import ipaddress
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from composespawner.commands.embedded import hub_templates_dir
from composespawner.commands.hubconfig import (
    CUSTOM_SCOPES,
    Services,
    policy_setting,
    roles,
    setting,
    setting_list,
)
from composespawner.commands.reclaim import ReclaimerApp
from composespawner.launchers.ssh_requests import parse_address


def ssh_hosts(text: str) -> dict[str, str]:
    """COMPOSE_SSH_HOSTS (``id=address[:port],...``) as the SSH launcher's host table."""
    table = {}
    for entry in (item.strip() for item in text.split(",")):
        host_id, _, address = entry.partition("=")
        try:
            parse_address(address)
        except ValueError as e:
            raise SystemExit(f"composespawner: COMPOSE_SSH_HOSTS: {entry!r}: {e}") from None
        if not host_id.strip():
            raise SystemExit(f"composespawner: COMPOSE_SSH_HOSTS: {entry!r} is not id=address")
        table[host_id.strip()] = address.strip()
    return table


def stack_images(text: str) -> dict[str, str]:
    """COMPOSE_STACK_IMAGES (``stack=image@sha256:…,...``) as the launcher's stack_images."""
    table = {}
    for entry in (item.strip() for item in text.split(",") if item.strip()):
        stack, _, image = (part.strip() for part in entry.partition("="))
        if not stack or "@sha256:" not in image:
            raise SystemExit(
                f"composespawner: COMPOSE_STACK_IMAGES: {entry!r} is not"
                " stack=registry/repository@sha256:<digest>"
            )
        table[stack] = image
    return table


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"  # a name: taken as routable


c = get_config()  # noqa: F821 (JupyterHub injects get_config)
BIN = Path(sys.executable).parent
PUBLIC_URL = setting("COMPOSE_PUBLIC_URL").rstrip("/")
STATE = Path(setting("COMPOSE_STATE_DIR"))
PORTAL_PORT = int(setting("COMPOSE_PORTAL_PORT", "8002"))

# --- the hub: HTTPS on the public URL, PostgreSQL ----------------------------
c.JupyterHub.bind_url = PUBLIC_URL
if urlsplit(PUBLIC_URL).scheme == "https":
    c.JupyterHub.ssl_cert = setting("COMPOSE_TLS_CERT")
    c.JupyterHub.ssl_key = setting("COMPOSE_TLS_KEY")
c.JupyterHub.hub_ip = setting("COMPOSE_HUB_API_IP", "127.0.0.1")
c.JupyterHub.hub_port = int(setting("COMPOSE_HUB_API_PORT", "8081"))
if setting("COMPOSE_HUB_CONNECT_URL", ""):
    c.JupyterHub.hub_connect_url = setting("COMPOSE_HUB_CONNECT_URL")
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{setting('COMPOSE_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [setting("COMPOSE_PROXY_COMMAND", "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = setting("COMPOSE_HUB_DB_URL")
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.template_paths = [str(hub_templates_dir())]
c.JupyterHub.tornado_settings = {"cookie_options": {"samesite": "Lax", "secure": True}}
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 3

# --- who may log in: the campus identity provider ----------------------------
# Its endpoints and signing keys come from its discovery document at the first login.
OIDC_CA = setting("COMPOSE_OIDC_CA_BUNDLE", "")
c.JupyterHub.authenticator_class = "compose-oidc"
c.CampusAuthenticator.issuer = setting("COMPOSE_OIDC_ISSUER")
c.CampusAuthenticator.client_id = setting("COMPOSE_OIDC_CLIENT_ID")
c.CampusAuthenticator.client_secret = (
    Path(setting("COMPOSE_OIDC_CLIENT_SECRET_FILE")).read_text(encoding="utf-8").strip()
)
c.CampusAuthenticator.oauth_callback_url = f"{PUBLIC_URL}/hub/oauth_callback"
c.CampusAuthenticator.scope = setting("COMPOSE_OIDC_SCOPES", "openid profile email groups").split()
c.CampusAuthenticator.username_claim = setting("COMPOSE_OIDC_USERNAME_CLAIM", "preferred_username")
c.CampusAuthenticator.login_service = "your campus account"
if OIDC_CA:
    c.CampusAuthenticator.http_request_kwargs = {"ca_certs": OIDC_CA}
# The provider's groups become the user's JupyterHub groups at every login, so
# cohorts and co-located devices follow the provider.
c.CampusAuthenticator.manage_groups = True
c.CampusAuthenticator.auth_state_groups_key = (
    f"oauth_user.{setting('COMPOSE_OIDC_GROUPS_CLAIM', 'groups')}"
)
c.CampusAuthenticator.allowed_groups = set(setting_list("COMPOSE_ALLOWED_GROUPS"))
c.CampusAuthenticator.allowed_domains = set(setting_list("COMPOSE_ALLOWED_DOMAINS"))
c.CampusAuthenticator.admin_groups = set(setting_list("COMPOSE_ADMIN_GROUPS"))
if not (setting_list("COMPOSE_ALLOWED_GROUPS") or setting_list("COMPOSE_ALLOWED_DOMAINS")):
    raise SystemExit(
        "composespawner: set COMPOSE_ALLOWED_GROUPS or COMPOSE_ALLOWED_DOMAINS (who may log in)"
    )

# --- composing machines -------------------------------------------------------
c.JupyterHub.spawner_class = setting("COMPOSE_SPAWNER", "compose")
c.ComposeMixin.catalog_file = setting("COMPOSE_CATALOG_FILE")
c.ComposeMixin.ledger_url = setting("COMPOSE_LEDGER_URL")
c.ComposeMixin.fabric_url = setting("COMPOSE_FABRIC_URL")
c.ComposeMixin.fabric_username = setting("COMPOSE_FABRIC_USERNAME")
c.ComposeMixin.fabric_password = (
    Path(setting("COMPOSE_FABRIC_PASSWORD_FILE")).read_text(encoding="utf-8").strip()
)
c.ComposeMixin.fabric_ca_bundle = setting("COMPOSE_FABRIC_CA_BUNDLE", "")
c.ComposeMixin.hub_id = setting("COMPOSE_HUB_ID")
c.ComposeMixin.max_gpus_per_user = int(setting("COMPOSE_MAX_GPUS_PER_USER", "4"))
c.LocalLauncher.cgroup_required = setting("COMPOSE_ENFORCE_SHARES", "required") != "best-effort"
c.ComposeMixin.portal_url = f"http://127.0.0.1:{PORTAL_PORT}/services/compose/"
# Local notebooks run as their user's own account, made at first login with a home
# only that user may enter. One account for all (the demo's shared_account) would
# let any student read, change or kill another's files and processes.
SHARED_ACCOUNT_REFUSED = (
    "composespawner: a production hub never runs notebooks under one shared account"
    " (any user could read, change or kill another's files and processes). Unset"
    " COMPOSE_SHARED_ACCOUNT and ComposeSpawner.shared_account: each user gets a system"
    " account of their own at first login (CampusAuthenticator.create_system_users)."
)
if setting("COMPOSE_SHARED_ACCOUNT", "0") != "0":
    raise SystemExit(SHARED_ACCOUNT_REFUSED)
if c.JupyterHub.spawner_class == "compose":
    c.CampusAuthenticator.create_system_users = True
    c.CampusAuthenticator.system_user_homes = setting("COMPOSE_HOMES_DIR", "/home")
if c.JupyterHub.spawner_class == "compose-ssh":
    c.SSHLauncher.hosts = ssh_hosts(setting("COMPOSE_SSH_HOSTS"))
    c.SSHLauncher.ssh_key = setting("COMPOSE_SSH_KEY")
    c.SSHLauncher.known_hosts = setting("COMPOSE_SSH_KNOWN_HOSTS")
    c.SSHLauncher.max_sessions = int(setting("COMPOSE_SSH_MAX_SESSIONS", "10"))
    c.SSHLauncher.host_runtime = setting("COMPOSE_HOST_RUNTIME", "containers")
    if c.SSHLauncher.host_runtime not in ("containers", "process"):
        raise SystemExit(
            f"composespawner: COMPOSE_HOST_RUNTIME is {c.SSHLauncher.host_runtime!r}:"
            " containers or process, as the hosts' agents' config says"
        )
    if c.SSHLauncher.host_runtime == "containers":
        c.SSHLauncher.stack_images = stack_images(setting("COMPOSE_STACK_IMAGES", ""))
        c.SSHLauncher.stack_variant = setting("COMPOSE_STACK_VARIANT", "gpu")
    if not setting("COMPOSE_HUB_CONNECT_URL", "") and loopback(c.JupyterHub.hub_ip):
        hosts = c.SSHLauncher.hosts.items()
        remote = sorted(i for i, a in hosts if not loopback(parse_address(a)[0]))
        if remote:
            raise SystemExit(
                f"composespawner: notebooks on {', '.join(remote)} cannot reach the hub's API"
                f" at {c.JupyterHub.hub_ip}: set COMPOSE_HUB_API_IP to an address of this"
                " host that they reach (or COMPOSE_HUB_CONNECT_URL)"
            )
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 120

# --- services, scopes and roles (as the embedded default's) -------------------
SERVICES = Services(
    config_file=Path(__file__),
    portal_port=PORTAL_PORT,
    cull_timeout=int(setting("COMPOSE_CULL_TIMEOUT", "3600")),
    cull_every=int(setting("COMPOSE_CULL_EVERY", "300")),
)
c.JupyterHub.services = SERVICES.services()
c.JupyterHub.custom_scopes = CUSTOM_SCOPES

# --- giving idle GPUs back (COMPOSE_RECLAIM=1) ---------------------------------
# Off unless the site turns it on. Activity is read where the spawner runs notebooks:
# each bare host's agent (compose-ssh) or NVML on this host (compose), which name the
# kernels holding a GPU, or each node's DCGM exporter (compose-kubernetes), which does
# not (a reclaim then ends every kernel of the server). Kernels are reached through the
# public URL, as users reach them. The portal reads the same policy to tell users.
RECLAIM = setting("COMPOSE_RECLAIM", "0") == "1"
c.ComposeSettings.reclaim_policy = policy_setting("COMPOSE_RECLAIM_POLICY")
if RECLAIM:
    SOURCES = {"compose": "nvml", "compose-ssh": "agent", "compose-kubernetes": "dcgm"}
    c.ReclaimerApp.activity_source = SOURCES.get(c.JupyterHub.spawner_class, "dcgm")
    if c.ReclaimerApp.activity_source == "dcgm":
        TEMPLATE = setting("COMPOSE_DCGM_URL_TEMPLATE", "")  # the role writes it empty
        if not TEMPLATE:
            raise SystemExit(
                "composespawner: set COMPOSE_DCGM_URL_TEMPLATE to where each node's DCGM"
                " exporter answers, e.g. http://{host_id}:9400/metrics, or COMPOSE_RECLAIM=0"
            )
        c.ReclaimerApp.dcgm_url_template = TEMPLATE
    c.ReclaimerApp.hub_url = PUBLIC_URL
    c.ReclaimerApp.hub_ca_bundle = setting("COMPOSE_HUB_CA_BUNDLE", "")
    # What the service would stop on at its start stops the hub now, saying what to change
    # (the hub would restart a failed service over and over).
    ReclaimerApp(config=c).check()
    c.JupyterHub.services.append(SERVICES.reclaimer())
c.JupyterHub.load_roles = roles(
    admins={"groups": setting_list("COMPOSE_ADMIN_GROUPS")}, reclaimer=RECLAIM
)

if os.environ.get("COMPOSE_EXTRA_CONFIG"):
    load_subconfig(os.environ["COMPOSE_EXTRA_CONFIG"])  # noqa: F821 (injected like get_config)
if any(c[name].get("shared_account") for name in ("ComposeSpawner", "LocalLauncher")):
    raise SystemExit(SHARED_ACCOUNT_REFUSED)
