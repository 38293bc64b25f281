"""The portal's pages and JSON calls, a module per resource, as JupyterHub's ``apihandlers``.

``base`` holds what they share: who is asking and may they, and the one
``write_error`` that turns the service's refusals into statuses. A new call is a
handler in its resource's module (parse, authorise, call one use case of
``portal/service.py``) and a line in ``ROUTES``.
"""

from __future__ import annotations

from tornado.web import RequestHandler

from composespawner.portal.handlers.audit import AuditApi, AuditPage
from composespawner.portal.handlers.cohorts import (
    CohortApi,
    CohortReclaimPolicyApi,
    CohortsApi,
    CohortsPage,
)
from composespawner.portal.handlers.devices import (
    ColocatedApi,
    ColocatedPage,
    DeviceLoanApi,
    DeviceOwnerApi,
    InventoryApi,
    InventoryPage,
    ReleaseMachineApi,
)
from composespawner.portal.handlers.kits import KitSubmissionsApi, LeaderboardApi, LeaderboardsPage
from composespawner.portal.handlers.me import (
    KeepGpuApi,
    LaunchAgainApi,
    MeApi,
    MyGpuApi,
    MyGpusApi,
    MyMachinePage,
    RunManifestApi,
    RunPage,
)
from composespawner.portal.handlers.quotas import QuotaRuleApi, QuotasApi, QuotasPage, UserQuotaApi
from composespawner.portal.handlers.usage import UsageApi, UsagePage

# Below the portal's prefix: every URL here is in docs/portal-api.yaml or a page.
ROUTES: list[tuple[str, type[RequestHandler]]] = [
    ("", MyMachinePage),
    ("quotas", QuotasPage),
    ("audit", AuditPage),
    ("usage", UsagePage),
    ("cohorts", CohortsPage),
    ("inventory", InventoryPage),
    ("colocated", ColocatedPage),
    ("leaderboards", LeaderboardsPage),
    (r"runs/([^/]+)", RunPage),
    ("api/me", MeApi),
    (r"api/me/server()/gpus", MyGpusApi),
    (r"api/me/servers/([^/]+)/gpus", MyGpusApi),
    (r"api/me/server()/gpus/([^/]+)", MyGpuApi),
    (r"api/me/servers/([^/]+)/gpus/([^/]+)", MyGpuApi),
    (r"api/me/server()/gpus/([^/]+)/keep", KeepGpuApi),
    (r"api/me/servers/([^/]+)/gpus/([^/]+)/keep", KeepGpuApi),
    ("api/quotas", QuotasApi),
    (r"api/quotas/(site)()", QuotaRuleApi),
    (r"api/quotas/(cohort|user)/([^/]+)", QuotaRuleApi),
    (r"api/users/([^/]+)/quota", UserQuotaApi),
    ("api/audit", AuditApi),
    ("api/usage", UsageApi),
    ("api/inventory", InventoryApi),
    ("api/colocated", ColocatedApi),
    (r"api/devices/([^/]+)/owner", DeviceOwnerApi),
    (r"api/devices/([^/]+)/loan", DeviceLoanApi),
    (r"api/machines/([^/]+)/release", ReleaseMachineApi),
    (r"api/runs/([^/]+)", RunManifestApi),
    (r"api/runs/([^/]+)/launch", LaunchAgainApi),
    (r"api/kits/([^/]+)/submissions", KitSubmissionsApi),
    (r"api/kits/([^/]+)/leaderboard", LeaderboardApi),
    ("api/cohorts", CohortsApi),
    (r"api/cohorts/([^/]+)", CohortApi),
    (r"api/cohorts/([^/]+)/reclaim-policy", CohortReclaimPolicyApi),
]

__all__ = ["ROUTES"]
