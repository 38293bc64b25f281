"""The simulator's Redfish URIs, in one place (pure).

The Redfish client is written against exactly these paths, so they are built
here and nowhere else.
"""

from __future__ import annotations

import re

ROOT = "/redfish/v1"
SERVICE_ROOT = f"{ROOT}/"
COMPOSITION_SERVICE = f"{ROOT}/CompositionService"
RESOURCE_BLOCKS = f"{COMPOSITION_SERVICE}/ResourceBlocks"
RESOURCE_ZONES = f"{COMPOSITION_SERVICE}/ResourceZones"
SYSTEMS = f"{ROOT}/Systems"
CHASSIS = f"{ROOT}/Chassis"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
TASK_SERVICE = f"{ROOT}/TaskService"
TASKS = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS = f"{TASK_SERVICE}/TaskMonitors"
ODATA = f"{ROOT}/odata"
METADATA = f"{ROOT}/$metadata"
OEM_SCHEMA = f"{ROOT}/Schemas/ComposeSpawner_v1.xml"

ADD_RESOURCE_BLOCK = "AddResourceBlock"
REMOVE_RESOURCE_BLOCK = "RemoveResourceBlock"

COMPOSE_ACTION = f"{COMPOSITION_SERVICE}/Actions/CompositionService.Compose"
COMPOSE_ACTION_INFO = f"{COMPOSITION_SERVICE}/ComposeActionInfo"
SYSTEM_CAPABILITIES = f"{SYSTEMS}/Capabilities"

_BLOCK_URI = re.compile(rf"^{re.escape(RESOURCE_BLOCKS)}/([^/]+)/?$")
_SYSTEM_URI = re.compile(rf"^{re.escape(SYSTEMS)}/([^/]+)/?$")


def block_uri(block_id: str) -> str:
    return f"{RESOURCE_BLOCKS}/{block_id}"


def zone_uri(zone_id: str) -> str:
    return f"{RESOURCE_ZONES}/{zone_id}"


def system_uri(system_id: str) -> str:
    return f"{SYSTEMS}/{system_id}"


def action_uri(system_id: str, action: str) -> str:
    return f"{system_uri(system_id)}/Actions/ComputerSystem.{action}"


def chassis_uri(chassis_id: str) -> str:
    return f"{CHASSIS}/{chassis_id}"


def session_uri(session_id: str) -> str:
    return f"{SESSIONS}/{session_id}"


def task_uri(task_id: str) -> str:
    return f"{TASKS}/{task_id}"


def task_monitor_uri(task_id: str) -> str:
    return f"{TASK_MONITORS}/{task_id}"


def block_id_from_uri(uri: str) -> str | None:
    """The block Id of a ResourceBlock URI, or None if ``uri`` is not one."""
    match = _BLOCK_URI.match(uri)
    return match.group(1) if match else None


def system_id_from_uri(uri: str) -> str | None:
    """The system Id of a ComputerSystem URI, or None if ``uri`` is not one."""
    match = _SYSTEM_URI.match(uri)
    return match.group(1) if match else None


def link(uri: str) -> dict[str, str]:
    """A Redfish reference object."""
    return {"@odata.id": uri}
