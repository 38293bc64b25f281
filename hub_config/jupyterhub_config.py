# The embedded default: one machine, SQLite, the simulated fabric, notebooks as
# local processes. `composespawner demo` (`make demo`) starts JupyterHub with
# this file; it ships inside the package (composespawner.commands.embedded.config_dir()).
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
#   COMPOSE_RECLAIM         0: no reclaimer (idle GPUs stay with their servers)   (1)
#   COMPOSE_EXTRA_CONFIG    a further config file loaded last (local overrides)
#   COMPOSE_RUNTIME         containers: notebooks in podman containers from the stacks'
#                           images (COMPOSE_STACK_IMAGES: {stack: image by digest});
#                           `composespawner demo` chooses (processes otherwise)
import json
import os
import sys
from pathlib import Path

from composespawner.commands.embedded import (
    DEMO_FABRIC_PASSWORD,
    DEMO_FABRIC_USERNAME,
    hub_database_kwargs,
    hub_templates_dir,
    simulator_command,
)
from composespawner.commands.hubconfig import CUSTOM_SCOPES, Services, roles
from composespawner.services.settings import upgrade_ledger

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
HUB_DATABASE = STATE / "jupyterhub.sqlite"
c.JupyterHub.db_url = f"sqlite:///{HUB_DATABASE}"
c.JupyterHub.db_kwargs = hub_database_kwargs(HUB_DATABASE)
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
# The same for notebooks in containers of their own ("compose-podman").
c.ComposePodmanSpawner.shared_account = c.ComposeSpawner.shared_account
c.ComposePodmanSpawner.home_dir_template = c.ComposeSpawner.home_dir_template
if os.environ.get("COMPOSE_RUNTIME") == "containers":  # composespawner demo chose them
    c.JupyterHub.spawner_class = "compose-podman"
    c.PodmanLauncher.stack_images = json.loads(os.environ["COMPOSE_STACK_IMAGES"])
    c.PodmanLauncher.stack_images_file = os.environ.get("COMPOSE_STACK_IMAGES_FILE", "")
    c.PodmanLauncher.stack_variant = "cpu"  # the demo's hosts have no GPUs to open
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
# The idle culler, the GPU portal and the reconciler (the reclaimer below), each ended
# by the kernel when this hub process dies (composespawner.commands.hubconfig, shared
# with production).
SERVICES = Services(
    config_file=Path(__file__),
    portal_port=PORTAL_PORT,
    cull_timeout=CULL_TIMEOUT,
    cull_every=CULL_EVERY,
    reconcile_every=int(os.environ.get("COMPOSE_RECONCILE_EVERY", "60")),
    reconcile_grace=int(os.environ.get("COMPOSE_RECONCILE_GRACE", "60")),
)
c.JupyterHub.services = SERVICES.services()

# --- giving idle GPUs back -------------------------------------------------
# The reclaimer reads each host's GPU activity from the simulator's DCGM exporters
# (set it with PATCH /sim/activity when the simulator runs with --faults-api) and gives
# idle GPUs back. The demo's windows are minutes, not the site default's hour: a GPU
# nothing holds goes after 2 minutes; one a kernel holds without working is warned about
# after 5 (in JupyterLab, on "my machine", in client.machine()) and taken after 10 with
# the kernels holding it, unless its user presses Keep (10 more minutes, twice).
# The portal reads the same policy to tell users. Off with COMPOSE_RECLAIM=0.
RECLAIM = os.environ.get("COMPOSE_RECLAIM", "1") != "0"
c.ReclaimerApp.interval = 15
c.ReclaimerApp.activity_source = "dcgm"
c.ReclaimerApp.dcgm_url_template = f"http://127.0.0.1:{FABRIC_PORT}/dcgm/{{host_id}}/metrics"
c.ReclaimerApp.hub_url = f"http://127.0.0.1:{HUB_PORT}"
c.ComposeSettings.reclaim_policy = {
    "detach_after": 120,
    "warn_after": 300,
    "reclaim_after": 600,
    "keep_for": 600,
    "keeps_allowed": 2,
    "max_gap": 60,
}
if RECLAIM:
    c.JupyterHub.services.append(SERVICES.reclaimer())
# `composespawner demo` runs the simulator beside the hub (COMPOSE_FABRIC_EXTERNAL=1),
# as a real fabric outlives its hub; run directly, the hub starts it as a service.
if os.environ.get("COMPOSE_FABRIC_EXTERNAL") != "1":
    c.JupyterHub.services.insert(
        0,
        {
            "name": "fabric-simulator",
            "command": [
                *SERVICES.with_hub(),
                *simulator_command(
                    BIN / "composespawner",
                    port=FABRIC_PORT,
                    state_file=STATE / "fabric-state.json",
                    extra=os.environ.get("COMPOSE_FABRIC_ARGS", "").split(),
                ),
            ],
            # The simulator and the spawner share these; only the hub knows them.
            "environment": {
                "COMPOSE_FABRIC_USERNAME": os.environ["COMPOSE_FABRIC_USERNAME"],
                "COMPOSE_FABRIC_PASSWORD": os.environ["COMPOSE_FABRIC_PASSWORD"],
            },
        },
    )
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
c.JupyterHub.load_roles = roles(
    admins={"users": ["admin"]},
    reclaimer=RECLAIM,
    extra=[
        {
            # Course staff: they manage their own cohort in the portal, and nothing else.
            "name": "cs-101-staff",
            "description": "Staff of the course cs-101",
            "scopes": ["custom:compose:staff!group=cs-101", "access:services!service=compose"],
            "users": ["teacher1"],
        }
    ],
)

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
