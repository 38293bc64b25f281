# The embedded default: one machine, SQLite, the simulated fabric, notebooks as
# local processes. `composespawner demo` (`make demo`) starts JupyterHub with
# this file; it ships inside the package (composespawner.embedded.config_dir()).
#
# Every value that differs between the demo, the tests and your own trial runs
# comes from an environment variable, with the demo's value as default:
#
#   COMPOSE_DEMO_PASSWORD   password of every demo account      (compose-demo)
#   COMPOSE_STATE_DIR       databases, cookie secret, fabric state (./.demo), private
#                           to the hub's account (0700)
#   COMPOSE_HOMES_DIR       the users' homes                    (./.demo-homes)
#   COMPOSE_HUB_PORT        the public URL's port                (8000)
#   COMPOSE_PROXY_API_PORT  configurable-http-proxy's API port   (8001)
#   COMPOSE_HUB_API_PORT    the hub's internal API port          (8081)
#   COMPOSE_FABRIC_PORT     the fabric simulator's Redfish port  (8010)
#   COMPOSE_PORTAL_PORT     the GPU portal service's own port    (8002)
#   COMPOSE_CULL_TIMEOUT    seconds idle before a server is culled (600)
#   COMPOSE_CULL_EVERY      seconds between culler checks        (60)
#   COMPOSE_NOTEBOOK_CMD    command that runs a notebook         (jupyterhub-singleuser)
#   COMPOSE_POLL_INTERVAL   seconds between checks that notebooks live (30)
#   COMPOSE_FABRIC_ARGS     extra fabric-simulator arguments, e.g. --async-tasks
#   COMPOSE_FABRIC_EXTERNAL 1: the fabric runs on its own (`composespawner demo`
#                           starts it beside the hub); the hub starts no simulator
#   COMPOSE_RECONCILE_EVERY seconds between reconciler passes      (60)
#   COMPOSE_RECONCILE_GRACE seconds the reconciler leaves a fresh machine alone (60)
#   COMPOSE_EXTRA_CONFIG    a further config file loaded last (local overrides)
import os
import sys
from pathlib import Path

from composespawner.embedded import (
    DEMO_FABRIC_PASSWORD,
    DEMO_FABRIC_USERNAME,
    hub_templates_dir,
    simulator_command,
)
from composespawner.settings import upgrade_ledger

c = get_config()  # noqa: F821 (JupyterHub injects get_config)

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
STATE = Path(os.environ.get("COMPOSE_STATE_DIR", ".demo")).resolve()
# Homes live outside the state dir: notebooks must reach theirs, never the hub's files.
HOMES = Path(os.environ.get("COMPOSE_HOMES_DIR", ".demo-homes")).resolve()
# In a checkout, `make` installs the proxy beside the repository; an installed
# package takes the one on PATH (`npm install -g configurable-http-proxy`).
CHECKOUT_PROXY = HERE.parent / "node_modules" / ".bin" / "configurable-http-proxy"
STATE.mkdir(parents=True, exist_ok=True)
STATE.chmod(0o700)

HUB_PORT = int(os.environ.get("COMPOSE_HUB_PORT", "8000"))
PROXY_API_PORT = int(os.environ.get("COMPOSE_PROXY_API_PORT", "8001"))
HUB_API_PORT = int(os.environ.get("COMPOSE_HUB_API_PORT", "8081"))
FABRIC_PORT = int(os.environ.get("COMPOSE_FABRIC_PORT", "8010"))
PORTAL_PORT = int(os.environ.get("COMPOSE_PORTAL_PORT", "8002"))
PASSWORD = os.environ.get("COMPOSE_DEMO_PASSWORD", "compose-demo")
CULL_TIMEOUT = int(os.environ.get("COMPOSE_CULL_TIMEOUT", "600"))
CULL_EVERY = int(os.environ.get("COMPOSE_CULL_EVERY", "60"))
# The simulator and the spawner share these credentials; only the hub knows them.
os.environ.setdefault("COMPOSE_FABRIC_USERNAME", DEMO_FABRIC_USERNAME)
os.environ.setdefault("COMPOSE_FABRIC_PASSWORD", DEMO_FABRIC_PASSWORD)

# --- the hub ---------------------------------------------------------------
c.JupyterHub.bind_url = f"http://127.0.0.1:{HUB_PORT}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = HUB_API_PORT
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.ConfigurableHTTPProxy.command = [
    str(CHECKOUT_PROXY) if CHECKOUT_PROXY.exists() else "configurable-http-proxy"
]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.template_paths = [str(hub_templates_dir())]
# Cookies go only with requests from the hub's own pages and with top-level
# links to it: another site cannot post to the hub as the logged-in user.
c.JupyterHub.tornado_settings = {"cookie_options": {"samesite": "Lax"}}
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 3

# --- who may log in --------------------------------------------------------
c.JupyterHub.authenticator_class = "compose-demo"
c.DemoAuthenticator.password = PASSWORD
c.Authenticator.allowed_users = {"student1", "student2", "researcher1", "teacher1"}
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {
    "cs-101": {"users": ["student1", "student2"]},
    "vision-lab": {"users": ["researcher1"]},
}

# --- composing machines ----------------------------------------------------
# c.ComposeMixin: for whichever composing spawner runs the notebooks (this one,
# or "compose-kubernetes"), and for the portal and the reconciler.
c.JupyterHub.spawner_class = "compose"
c.ComposeMixin.catalog_file = str(HERE / "catalog.toml")
c.ComposeMixin.ledger_url = f"sqlite:///{STATE / 'composespawner.sqlite'}"
c.ComposeMixin.fabric_url = f"http://127.0.0.1:{FABRIC_PORT}"
c.ComposeMixin.hub_id = "composespawner-demo"
c.ComposeMixin.max_gpus_per_user = 4
# Where notebooks reach the GPU portal (composespawner.client): its own address.
c.ComposeMixin.portal_url = f"http://127.0.0.1:{PORTAL_PORT}/services/compose/"
# Demo users have no system accounts: notebooks run under one account, the
# unprivileged c.ComposeSpawner.notebook_account when the hub is root.
c.ComposeSpawner.shared_account = True
c.ComposeSpawner.home_dir_template = str(HOMES / "{username}")
c.Spawner.cmd = os.environ.get("COMPOSE_NOTEBOOK_CMD", str(BIN / "jupyterhub-singleuser")).split()
c.Spawner.default_url = "/lab"
c.Spawner.poll_interval = int(os.environ.get("COMPOSE_POLL_INTERVAL", "30"))
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60

# The embedded default brings its SQLite ledger up to date as the hub starts
# (this file runs before the hub serves anything). A production hub runs
# `composespawner upgrade-db -f <its config>` as a deploy step instead, as it
# does `jupyterhub upgrade-db`.
upgrade_ledger(c.ComposeMixin.ledger_url)

# --- hub-managed services --------------------------------------------------
# Each runs under `composespawner with-hub`: the kernel ends it when this hub
# process dies, even by SIGKILL, so a restarted hub never finds its old
# reconciler or culler still at work. (This config runs inside the hub.)
WITH_HUB = [str(BIN / "composespawner"), "with-hub", f"--hub-pid={os.getpid()}", "--"]
FABRIC_CREDENTIALS = {
    "COMPOSE_FABRIC_USERNAME": os.environ["COMPOSE_FABRIC_USERNAME"],
    "COMPOSE_FABRIC_PASSWORD": os.environ["COMPOSE_FABRIC_PASSWORD"],
}
# `composespawner demo` runs the simulator beside the hub (COMPOSE_FABRIC_EXTERNAL=1),
# as a real fabric outlives its hub; run directly, the hub starts it as a service.
SIMULATOR = {
    "name": "fabric-simulator",
    "command": [
        *WITH_HUB,
        *simulator_command(
            BIN / "composespawner",
            port=FABRIC_PORT,
            state_file=STATE / "fabric-state.json",
            extra=os.environ.get("COMPOSE_FABRIC_ARGS", "").split(),
        ),
    ],
    "environment": FABRIC_CREDENTIALS,
}
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            *WITH_HUB,
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={CULL_TIMEOUT}",
            f"--cull-every={CULL_EVERY}",
        ],
    },
    {
        # The GPU portal at /services/compose/: "my machine" for everyone, quotas and
        # the audit log for admins. It reads this file for the ledger and the catalog.
        "name": "compose",
        "url": f"http://127.0.0.1:{PORTAL_PORT}",
        "command": [
            *WITH_HUB,
            str(BIN / "composespawner"),
            "portal",
            f"--config={Path(__file__).resolve()}",
        ],
        "environment": {k: v for k, v in os.environ.items() if k.startswith("COMPOSE_")},
        "oauth_no_confirm": True,
        # What the portal may learn of a visitor: their custom:compose:* scopes.
        "oauth_client_allowed_scopes": ["custom:compose:admin", "custom:compose:staff"],
    },
    {
        # Makes ledger, fabric and servers agree at hub start and then periodically.
        # It reads this file for the ledger, the fabric and the catalog.
        "name": "compose-reconciler",
        "command": [
            *WITH_HUB,
            str(BIN / "composespawner"),
            "reconcile",
            f"--config={Path(__file__).resolve()}",
            f"--every={os.environ.get('COMPOSE_RECONCILE_EVERY', '60')}",
            f"--grace={os.environ.get('COMPOSE_RECONCILE_GRACE', '60')}",
        ],
        # A service's environment is only what is listed here (and the hub's API
        # token): this file reads its ports and the fabric's account from these.
        "environment": {k: v for k, v in os.environ.items() if k.startswith("COMPOSE_")},
    },
]
if os.environ.get("COMPOSE_FABRIC_EXTERNAL") != "1":
    c.JupyterHub.services.insert(0, SIMULATOR)
c.JupyterHub.custom_scopes = {
    "custom:compose:staff": {
        "description": "Manage cohorts in the GPU portal: dates, sessions, stacks, starter"
        " kit. Give it as custom:compose:staff!group=<cohort> for one cohort.",
    },
    "custom:compose:admin": {
        "description": "Manage the GPU pool in its portal: inventory, quotas, cohorts,"
        " co-located devices, usage, the audit log.",
        "subscopes": ["custom:compose:staff"],
    },
}
c.JupyterHub.load_roles = [
    {
        # JupyterHub's default user role, and the GPU portal.
        "name": "user",
        "scopes": ["self", "access:services!service=compose"],
    },
    {
        # A notebook's own token (JupyterHub's server role), and the GPU portal for
        # composespawner.client: the machine it runs on, grown or shrunk in place.
        "name": "server",
        "scopes": [
            "users:activity!user",
            "access:servers!server",
            "access:services!service=compose",
        ],
    },
    {
        "name": "compose-admin",
        "description": "The GPU pool's admins",
        "scopes": ["custom:compose:admin", "access:services!service=compose"],
        "users": ["admin"],
    },
    {
        # Course staff: they manage their own cohort in the portal, and nothing else.
        "name": "cs-101-staff",
        "description": "Staff of the course cs-101",
        "scopes": ["custom:compose:staff!group=cs-101", "access:services!service=compose"],
        "users": ["teacher1"],
    },
    {
        # Checks that a cohort's group exists, reads a user's groups for their quota,
        # a cohort's members for its usage, stops a server an admin releases from the
        # inventory page and starts one a user launches again from a run manifest.
        "name": "compose-portal",
        "scopes": [
            "list:groups",
            "read:groups",
            "read:users:groups",
            "read:users:name",
            "servers",
        ],
        "services": ["compose"],
    },
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    },
    {
        "name": "compose-reconciler",
        "scopes": ["list:users", "read:servers", "admin:server_state", "delete:servers"],
        "services": ["compose-reconciler"],
    },
]

if os.environ.get("COMPOSE_EXTRA_CONFIG"):
    load_subconfig(os.environ["COMPOSE_EXTRA_CONFIG"])  # noqa: F821 (injected like get_config)

print(
    f"""
composespawner demo: open http://127.0.0.1:{HUB_PORT} and log in as
  student1, student2 (group cs-101), researcher1 (group vision-lab),
  teacher1 (staff of the cohort cs-101) or admin (hub admin)
  password: {"$COMPOSE_DEMO_PASSWORD" if "COMPOSE_DEMO_PASSWORD" in os.environ else PASSWORD}
Idle servers are stopped after {CULL_TIMEOUT} s (COMPOSE_CULL_TIMEOUT). State lives in {STATE}.
""",
    flush=True,
)
