"""schemathesis against docs/portal-api.yaml on a real hub's portal: no 5xx, nothing off schema.

The calls come with an admin's token (a service holding custom:compose:admin), so
every operation is reached past its permission check and its input checks are what
the generated requests probe.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from harness.hub import PORTAL, Hub, running_hub, wait_for
from harness.paths import ROOT

API = ROOT / "docs" / "portal-api.yaml"
TOKEN = "portal-schema-admin-token-0123456789abcdef"
ADMIN_SERVICE = f"""
c.JupyterHub.services.append({{"name": "portal-admin", "api_token": "{TOKEN}"}})
c.JupyterHub.load_roles.append(
    {{"name": "portal-admin", "services": ["portal-admin"],
      "scopes": ["custom:compose:admin", "access:services!service=compose"]}}
)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("schema"), ADMIN_SERVICE) as hub:
        wait_for(lambda: _portal_answers(hub), 60, "the portal to answer")
        yield hub


def _portal_answers(hub: Hub) -> bool:
    response = hub.api.get(
        f"{hub.url}{PORTAL}api/me", headers={"Authorization": f"token {TOKEN}"}, timeout=5
    )
    return response.status_code == 200


schema = schemathesis.openapi.from_path(API)
# Requests off the schema too (wrong types, out-of-range numbers, extra limits):
# they must be refused with a 4xx in the error schema, never a 5xx.
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    with_security_parameters=False,  # every call carries the admin token below
)


@pytest.mark.timeout(300)
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_the_portal_api_keeps_to_its_schema(case: Case, hub: Hub) -> None:
    case.call_and_validate(
        base_url=f"{hub.url}{PORTAL.rstrip('/')}",
        headers={"Authorization": f"token {TOKEN}"},
        checks=[not_a_server_error, response_schema_conformance],
        timeout=30,
    )
