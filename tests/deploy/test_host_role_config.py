"""The host role's agent config, rendered from its template with the role's defaults, as
the agent reads it: notebooks in containers unless the site says processes.

(tests/deploy/test_ansible.py converges the whole playbook into a Debian root; its host
runs processes, having no registry to pull images from.)
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from composespawner.hostagent.config import MachineFacts, parse_config
from harness.paths import ROOT

pytestmark = pytest.mark.timeout(30)

ROLE = ROOT / "ansible" / "roles" / "composespawner_host"
FACTS = MachineFacts(cores=64, memory_gib=512, python="/opt/cs/venv/bin/python", nvidia_smi=None)


def rendered(**site: Any) -> dict[str, Any]:
    """host.toml as the role writes it for an inventory host ``h1`` with ``site``'s vars."""
    variables: dict[str, Any] = {"inventory_hostname": "h1", "ansible_managed": "Ansible"}
    variables.update(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    variables.update(site)
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["to_json"] = json.dumps
    for _ in range(3):  # defaults name defaults (listen_address: the address: the host)
        variables = {
            name: environment.from_string(value).render(variables)
            if isinstance(value, str)
            else value
            for name, value in variables.items()
        }
    template = environment.from_string((ROLE / "templates" / "host.toml.j2").read_text())
    return tomllib.loads(template.render(variables))


def test_by_default_notebooks_run_in_containers(tmp_path: Path) -> None:
    table = rendered(composespawner_host_address="10.0.0.11")
    config = parse_config(table, {}, FACTS)
    assert config.runtime == "containers"
    assert config.image_pull_timeout == 1800
    assert config.listen_address == "10.0.0.11"


def test_a_site_may_run_processes() -> None:
    table = rendered(composespawner_host_address="10.0.0.11", composespawner_host_runtime="process")
    assert "image_pull_timeout" not in table
    assert parse_config(table, {}, FACTS).runtime == "process"
