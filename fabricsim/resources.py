"""Redfish representations of the simulated fabric (pure).

:func:`render` maps a URI to its resource as a JSON-ready dict (or None when
there is no such resource); :func:`expand` implements ``$expand=.($levels=N)``
by rendering subordinate references in place, N levels deep. Schema versions are the newest
of DMTF's 2025.4 bundle, which the service validator checks them against.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import uris
from .commands import COMPOSE_REQUEST_TYPES
from .expand import expand_subordinates
from .inventory import DeviceSpec, HostSpec
from .quirks import NO_QUIRKS, ServiceQuirks
from .sessions import Session, SessionStore
from .state import FabricState
from .tasks import Task, TaskStore
from .uris import link
from .wire import OEM_KEY, HostMark, mark_json, mark_type

REDFISH_VERSION = "1.20.0"
# Logical processors per core (SMT) of the simulated hosts.
THREADS_PER_CORE = 2
# The one device function inside each device block, by kind.
DEVICE_FUNCTION = {
    "gpu": ("Processors", "GPU0"),
    "nic": ("EthernetInterfaces", "Port0"),
    "nvme": ("Drives", "Drive0"),
}
BLOCK_TYPE = {"gpu": "Processor", "nic": "Network", "nvme": "Storage"}
EXPAND_FEATURES = {
    "ExpandAll": False,
    "Levels": True,
    "Links": False,
    "NoLinks": True,
    # Three reach a block's parts and their drives from the collection, the
    # deepest a client needs (composespawner asks for it on a cold inventory).
    "MaxLevels": 3,
}


@dataclass(frozen=True, slots=True)
class ServiceView:
    """Everything the representations are drawn from."""

    state: FabricState
    sessions: SessionStore
    tasks: TaskStore
    session_timeout_s: int = 1800
    quirks: ServiceQuirks = NO_QUIRKS

    @property
    def zone_capabilities(self) -> bool:
        """Whether POST to Systems is advertised on the zones (an older service), not Systems."""
        return self.state.composition == "specific" and self.quirks.zone_capabilities


Renderer = Callable[..., dict[str, Any] | None]


def render(view: ServiceView, path: str) -> dict[str, Any] | None:
    """The resource at ``path``, or None if there is none."""
    if path != uris.SERVICE_ROOT:
        path = path.rstrip("/")
    for pattern, renderer in _ROUTES:
        match = pattern.fullmatch(path)
        if match:
            return renderer(view, *match.groups())
    return None


def expand(view: ServiceView, payload: dict[str, Any], levels: int = 1) -> dict[str, Any]:
    """``$expand=.($levels=N)``: subordinate references replaced by their resources."""
    return expand_subordinates(payload, lambda uri: render(view, uri), levels)


# --- service-wide resources ---------------------------------------------------


def service_root(view: ServiceView) -> dict[str, Any]:
    inventory = view.state.inventory
    return {
        **_header(uris.SERVICE_ROOT, "ServiceRoot.v1_20_0.ServiceRoot"),
        "Id": "RootService",
        "Name": inventory.name,
        "RedfishVersion": REDFISH_VERSION,
        "UUID": inventory.uuid,
        "Product": "composespawner fabric simulator",
        "Vendor": "composespawner",
        "ProtocolFeaturesSupported": {
            "ExpandQuery": EXPAND_FEATURES,
            "SelectQuery": False,
            "FilterQuery": False,
            "OnlyMemberQuery": False,
            "ExcerptQuery": False,
        },
        "CompositionService": link(uris.COMPOSITION_SERVICE),
        "Systems": link(uris.SYSTEMS),
        "Chassis": link(uris.CHASSIS),
        "SessionService": link(uris.SESSION_SERVICE),
        # The schema names the TaskService link "Tasks".
        "Tasks": link(uris.TASK_SERVICE),
        "Links": {"Sessions": link(uris.SESSIONS)},
    }


def odata_document(view: ServiceView) -> dict[str, Any]:
    services = {
        "Service": uris.SERVICE_ROOT,
        "CompositionService": uris.COMPOSITION_SERVICE,
        "Systems": uris.SYSTEMS,
        "Chassis": uris.CHASSIS,
        "SessionService": uris.SESSION_SERVICE,
        "TaskService": uris.TASK_SERVICE,
        "Sessions": uris.SESSIONS,
    }
    return {
        "@odata.context": uris.METADATA,
        "value": [{"name": n, "kind": "Singleton", "url": u} for n, u in services.items()],
    }


def composition_service(view: ServiceView) -> dict[str, Any]:
    return {
        **_header(uris.COMPOSITION_SERVICE, "CompositionService.v1_2_3.CompositionService"),
        "Id": "CompositionService",
        "Name": "Composition Service",
        "Status": _status(True),
        "ServiceEnabled": True,
        "AllowOverprovisioning": False,
        "ResourceBlocks": link(uris.RESOURCE_BLOCKS),
        "ResourceZones": link(uris.RESOURCE_ZONES),
        **_compose_action(view),
    }


def _compose_action(view: ServiceView) -> dict[str, Any]:
    """The Compose action, advertised only where the service takes it."""
    if view.state.composition != "action":
        return {}
    action = {"target": uris.COMPOSE_ACTION, "@Redfish.ActionInfo": uris.COMPOSE_ACTION_INFO}
    return {"Actions": {"#CompositionService.Compose": action}}


def compose_action_info(view: ServiceView) -> dict[str, Any] | None:
    if view.state.composition != "action":
        return None
    return {
        **_header(uris.COMPOSE_ACTION_INFO, "ActionInfo.v1_4_2.ActionInfo"),
        "Id": "ComposeActionInfo",
        "Name": "Compose Action Info",
        "Parameters": [
            {
                "Name": "RequestFormat",
                "Required": True,
                "DataType": "String",
                "AllowableValues": ["Manifest"],
            },
            {
                "Name": "RequestType",
                "Required": True,
                "DataType": "String",
                "AllowableValues": list(COMPOSE_REQUEST_TYPES),
            },
            {"Name": "Manifest", "Required": True, "DataType": "Object"},
        ],
    }


def compose_response(stanzas: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer of an applied Compose manifest: each stanza with its Response."""
    return {"RequestFormat": "Manifest", "RequestType": "Apply", "Manifest": {"Stanzas": stanzas}}


def session_service(view: ServiceView) -> dict[str, Any]:
    return {
        **_header(uris.SESSION_SERVICE, "SessionService.v1_2_0.SessionService"),
        "Id": "SessionService",
        "Name": "Session Service",
        "Status": _status(True),
        "ServiceEnabled": True,
        "SessionTimeout": view.session_timeout_s,
        "Sessions": link(uris.SESSIONS),
    }


def task_service(view: ServiceView) -> dict[str, Any]:
    return {
        **_header(uris.TASK_SERVICE, "TaskService.v1_3_0.TaskService"),
        "Id": "TaskService",
        "Name": "Task Service",
        "Status": _status(True),
        "ServiceEnabled": True,
        "CompletedTaskOverWritePolicy": "Oldest",
        "LifeCycleEventOnTaskStateChange": False,
        "DateTime": _timestamp(datetime.now(UTC)),
        "Tasks": link(uris.TASKS),
    }


# --- collections ----------------------------------------------------------------


def collection(uri: str, schema: str, name: str, members: list[str]) -> dict[str, Any]:
    return {
        **_header(uri, f"{schema}.{schema}"),
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [link(member) for member in members],
    }


def block_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.block_uri(b) for b in view.state.inventory.block_ids()]
    return collection(
        uris.RESOURCE_BLOCKS, "ResourceBlockCollection", "Resource Block Collection", members
    )


def zone_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.zone_uri(z.id) for z in view.state.inventory.zones]
    return collection(uris.RESOURCE_ZONES, "ZoneCollection", "Resource Zone Collection", members)


def system_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.system_uri(s) for s in view.state.system_ids()]
    systems = collection(
        uris.SYSTEMS, "ComputerSystemCollection", "Computer System Collection", members
    )
    if view.state.composition == "specific" and not view.zone_capabilities:
        # How a service says it takes POST to the collection (DMTF's mockup does the same).
        systems["@Redfish.CollectionCapabilities"] = {
            "@odata.type": "#CollectionCapabilities.v1_4_1.CollectionCapabilities",
            "Capabilities": [
                {
                    "CapabilitiesObject": link(uris.SYSTEM_CAPABILITIES),
                    "UseCase": "ComputerSystemComposition",
                    "Links": {
                        "TargetCollection": link(uris.SYSTEMS),
                        "RelatedItem": [
                            link(uris.zone_uri(z.id)) for z in view.state.inventory.zones
                        ],
                    },
                }
            ],
        }
    return systems


def system_capabilities(view: ServiceView) -> dict[str, Any] | None:
    """What a POST to Systems takes, as DMTF's mockup describes it."""
    if view.state.composition != "specific":
        return None
    return {
        **_header(uris.SYSTEM_CAPABILITIES, "ComputerSystem.v1_27_0.ComputerSystem"),
        "Id": "Capabilities",
        "Name": "Capabilities for the system collection",
        "Name@Redfish.RequiredOnCreate": True,
        "Name@Redfish.SetOnlyOnCreate": True,
        "Description@Redfish.OptionalOnCreate": True,
        "Description@Redfish.SetOnlyOnCreate": True,
        "Links@Redfish.RequiredOnCreate": True,
        "Links": {"ResourceBlocks@Redfish.RequiredOnCreate": True},
        "@Redfish.ResourceBlockLimits": {"MinCompute": 1, "MaxCompute": 1},
    }


def chassis_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.chassis_uri(c.id) for c in view.state.inventory.chassis]
    return collection(uris.CHASSIS, "ChassisCollection", "Chassis Collection", members)


def session_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.session_uri(s.id) for s in view.sessions.all()]
    return collection(uris.SESSIONS, "SessionCollection", "Session Collection", members)


def task_collection(view: ServiceView) -> dict[str, Any]:
    members = [uris.task_uri(t.id) for t in view.tasks.all()]
    return collection(uris.TASKS, "TaskCollection", "Task Collection", members)


# --- composition resources --------------------------------------------------------


def zone(view: ServiceView, zone_id: str) -> dict[str, Any] | None:
    inventory = view.state.inventory
    spec = next((z for z in inventory.zones if z.id == zone_id), None)
    if spec is None:
        return None
    blocks = [b for b in inventory.block_ids() if zone_id in inventory.block_zones(b)]
    links: dict[str, Any] = {"ResourceBlocks": [link(uris.block_uri(b)) for b in blocks]}
    if view.zone_capabilities:
        # Where older services say that systems of this zone's blocks are composed by POST.
        links["CapabilitiesObjects"] = [link(uris.SYSTEM_CAPABILITIES)]
    return {
        **_header(uris.zone_uri(zone_id), "Zone.v1_6_3.Zone"),
        "Id": zone_id,
        "Name": spec.name,
        "ZoneType": "ZoneOfResourceBlocks",
        "Status": _status(True),
        "Links": links,
    }


def resource_block(view: ServiceView, block_id: str) -> dict[str, Any] | None:
    inventory = view.state.inventory
    host = inventory.host_of_block(block_id)
    device = inventory.device(block_id)
    if host is not None:
        parts = _host_block_parts(host, view.state.expandable)
    elif device is not None:
        parts = _device_block_parts(device)
    else:
        return None
    # A service with stale block status never tells a block that a system took it.
    holder = None if view.quirks.stale_block_status else view.state.holder(block_id)
    return {
        **_header(uris.block_uri(block_id), "ResourceBlock.v1_4_3.ResourceBlock"),
        "@odata.etag": view.state.block_etag(block_id),
        "Id": block_id,
        "Status": _status(view.state.is_enabled(block_id)),
        "CompositionStatus": _composition_status(holder),
        **parts,
        "Links": _block_links(view.state, block_id, holder),
    }


def _composition_status(holder: str | None) -> dict[str, Any]:
    return {
        "CompositionState": "Composed" if holder else "Unused",
        "Reserved": False,
        "SharingCapable": False,
        "MaxCompositions": 1,
        "NumberOfCompositions": 1 if holder else 0,
    }


def _block_links(state: FabricState, block_id: str, holder: str | None) -> dict[str, Any]:
    inventory = state.inventory
    return {
        "Chassis": [link(uris.chassis_uri(inventory.block_chassis(block_id)))],
        "Zones": [link(uris.zone_uri(z)) for z in inventory.block_zones(block_id)],
        "ComputerSystems": [link(uris.system_uri(holder))] if holder else [],
    }


def _host_block_parts(host: HostSpec, expandable: bool) -> dict[str, Any]:
    if not expandable:
        # A free compute block, as in DMTF's mockup: a system exists only once composed.
        return {"Name": f"Compute block of {host.id}", "ResourceBlockType": ["Compute"]}
    return {
        "Name": f"Compute host {host.id}",
        "ResourceBlockType": ["ComputerSystem"],
        "ComputerSystems": [link(uris.system_uri(host.id))],
    }


def _device_block_parts(device: DeviceSpec) -> dict[str, Any]:
    collection_name = DEVICE_FUNCTION[device.kind][0]
    return {
        "Name": f"{device.model} ({device.id})",
        "ResourceBlockType": [BLOCK_TYPE[device.kind]],
        collection_name: [link(_function_uri(device.id, device.kind))],
    }


def _function_uri(block_id: str, kind: str) -> str:
    collection_name, function_id = DEVICE_FUNCTION[kind]
    return f"{uris.block_uri(block_id)}/{collection_name}/{function_id}"


def _device_function(
    view: ServiceView, block_id: str, kind: str
) -> tuple[DeviceSpec, dict[str, Any]] | None:
    """A device block's one function, if the block is of ``kind``: (spec, common fields)."""
    device = view.state.inventory.device(block_id)
    if device is None or device.kind != kind:
        return None
    common = {
        "@odata.id": _function_uri(block_id, kind),
        "Id": DEVICE_FUNCTION[kind][1],
        "Status": _status(view.state.is_enabled(block_id)),
        "Links": {"Chassis": link(uris.chassis_uri(device.chassis))},
    }
    return device, common


def processor(view: ServiceView, block_id: str) -> dict[str, Any] | None:
    found = _device_function(view, block_id, "gpu")
    if found is None:
        return None
    device, common = found
    return {
        "@odata.type": "#Processor.v1_22_0.Processor",
        **common,
        "Name": "GPU",
        "ProcessorType": "GPU",
        "Manufacturer": device.manufacturer,
        "Model": device.model,
        # What `nvidia-smi -L` shows as GPU-<uuid>, and container runtimes select by.
        "UUID": str(uuid.uuid5(uuid.UUID(view.state.inventory.uuid), block_id)),
        "MemorySummary": {"TotalMemorySizeMiB": (device.memory_gib or 0) * 1024},
    }


def ethernet_interface(view: ServiceView, block_id: str) -> dict[str, Any] | None:
    found = _device_function(view, block_id, "nic")
    if found is None:
        return None
    device, common = found
    mac = _mac_address(block_id)
    return {
        "@odata.type": "#EthernetInterface.v1_12_4.EthernetInterface",
        **common,
        "Name": "Ethernet port 0",
        "Description": device.model,
        "SpeedMbps": (device.speed_gbps or 0) * 1000,
        "InterfaceEnabled": True,
        "MACAddress": mac,
        "PermanentMACAddress": mac,
    }


def drive(view: ServiceView, block_id: str) -> dict[str, Any] | None:
    found = _device_function(view, block_id, "nvme")
    if found is None:
        return None
    device, common = found
    return {
        "@odata.type": "#Drive.v1_22_0.Drive",
        **common,
        "Name": "NVMe drive",
        "Manufacturer": device.manufacturer,
        "Model": device.model,
        "CapacityBytes": (device.capacity_gb or 0) * 10**9,
        "Protocol": "NVMe",
        "MediaType": "SSD",
    }


# --- systems and chassis --------------------------------------------------------------


def system(view: ServiceView, system_id: str) -> dict[str, Any] | None:
    state = view.state
    if system_id == "Capabilities":
        return system_capabilities(view)
    if not state.has_system(system_id):
        return None
    host = state.system_host(system_id)
    blocks = state.system_blocks(system_id)
    composed = state.composed(system_id)
    if composed is not None:
        return _composed_system(view, system_id, composed.name, host, blocks)
    return _host_system(view, system_id, host, blocks)


def _host_system(
    view: ServiceView, system_id: str, host: HostSpec, blocks: tuple[str, ...]
) -> dict[str, Any]:
    """A standing host's system: expandable (with block actions) unless switched off."""
    state = view.state
    system: dict[str, Any] = {
        **_header(uris.system_uri(system_id), "ComputerSystem.v1_27_0.ComputerSystem"),
        "@odata.etag": state.system_etag(system_id),
        "Id": system_id,
        "Name": f"Compute host {system_id}",
        "SystemType": "Physical",
        "HostName": system_id,
        "UUID": str(uuid.uuid5(uuid.UUID(state.inventory.uuid), system_id)),
        "PowerState": "On",
        "Status": _status(state.is_enabled(host.block_id)),
        "Composition": {"UseCases": ["ExpandableSystem"]},
        **_capacity(host),
        "Links": _system_links(view, system_id, host, blocks),
        "Actions": {
            f"#ComputerSystem.{action}": {"target": uris.action_uri(system_id, action)}
            for action in (uris.ADD_RESOURCE_BLOCK, uris.REMOVE_RESOURCE_BLOCK)
        },
        "Oem": oem(state.tag(system_id)),
    }
    if not state.is_expandable_host(system_id):
        # A fixed server: it says nothing of composition and offers no block actions.
        del system["Composition"], system["Actions"]
    return system


def _composed_system(
    view: ServiceView, system_id: str, name: str, host: HostSpec, blocks: tuple[str, ...]
) -> dict[str, Any]:
    """A system of specific composition: no actions, taken apart by DELETE."""
    state = view.state
    return {
        **_header(uris.system_uri(system_id), "ComputerSystem.v1_27_0.ComputerSystem"),
        "@odata.etag": state.system_etag(system_id),
        "Id": system_id,
        "Name": name,
        "SystemType": "Composed",
        "UUID": str(uuid.uuid5(uuid.UUID(state.inventory.uuid), system_id)),
        "PowerState": "On",
        "Status": _status(all(state.is_enabled(b) for b in blocks)),
        **_capacity(host),
        "Links": _system_links(view, system_id, host, blocks),
        "Oem": oem(state.tag(system_id)),
    }


def _capacity(host: HostSpec) -> dict[str, Any]:
    """What a host offers the machines that share it: cores and memory."""
    return {
        "ProcessorSummary": {
            # Older inventories name no sockets: Count is then the cores, as served before.
            "Count": host.sockets if host.sockets is not None else host.cores,
            "CoreCount": host.cores,
            "LogicalProcessorCount": host.cores * THREADS_PER_CORE,
        },
        "MemorySummary": {"TotalSystemMemoryGiB": host.memory_gib},
    }


def _system_links(
    view: ServiceView, system_id: str, host: HostSpec, blocks: tuple[str, ...]
) -> dict[str, Any]:
    """A system's Links; ``@Redfish.WriteableProperties`` says if a PATCH may change its blocks.

    The schema marks ``Links.ResourceBlocks`` ReadWrite, so a service whose
    systems refuse that PATCH says so the way Redfish offers: the annotation
    lists the properties of this object that are writable here and now.
    """
    writable = ["ResourceBlocks"] if blocks_writable(view, system_id) else []
    return {
        "@Redfish.WriteableProperties": writable,
        "ResourceBlocks": [link(uris.block_uri(b)) for b in blocks],
        "Chassis": [link(uris.chassis_uri(host.chassis))],
    }


def blocks_writable(view: ServiceView, system_id: str) -> bool:
    """Whether a PATCH may change this system's ``Links.ResourceBlocks``."""
    if view.state.composed(system_id) is not None:
        return not view.quirks.composed_blocks_read_only
    return view.state.is_expandable_host(system_id)


def oem(mark: HostMark | None) -> dict[str, Any]:
    """The system's ``Oem`` object: our mark, when there is one, as it was written."""
    if mark is None:
        return {}
    return {OEM_KEY: {"@odata.type": mark_type(mark), **mark_json(mark)}}


def chassis(view: ServiceView, chassis_id: str) -> dict[str, Any] | None:
    inventory = view.state.inventory
    spec = next((c for c in inventory.chassis if c.id == chassis_id), None)
    if spec is None:
        return None
    state = view.state
    hosts = [s for s in state.system_ids() if state.system_host(s).chassis == chassis_id]
    blocks = [b for b in inventory.block_ids() if inventory.block_chassis(b) == chassis_id]
    return {
        **_header(uris.chassis_uri(chassis_id), "Chassis.v1_28_0.Chassis"),
        "Id": chassis_id,
        "Name": spec.name,
        "ChassisType": spec.type,
        "PowerState": "On",
        "Status": _status(True),
        "Links": {
            "ComputerSystems": [link(uris.system_uri(h)) for h in hosts],
            "ResourceBlocks": [link(uris.block_uri(b)) for b in blocks],
        },
    }


# --- sessions and tasks ------------------------------------------------------------------


def session(view: ServiceView, session_id: str) -> dict[str, Any] | None:
    found = view.sessions.get(session_id)
    return None if found is None else session_resource(found)


def session_resource(found: Session) -> dict[str, Any]:
    return {
        **_header(uris.session_uri(found.id), "Session.v1_8_0.Session"),
        "Id": found.id,
        "Name": "User Session",
        "UserName": found.username,
        "CreatedTime": _timestamp(found.created),
        "SessionType": "Redfish",
    }


def task(view: ServiceView, task_id: str) -> dict[str, Any] | None:
    found = view.tasks.get(task_id)
    return None if found is None else task_resource(found)


def task_resource(found: Task) -> dict[str, Any]:
    payload = {
        **_header(uris.task_uri(found.id), "Task.v1_7_4.Task"),
        "Id": found.id,
        "Name": found.name,
        "TaskState": found.state,
        "TaskStatus": {"Running": "OK", "Completed": "OK", "Exception": "Critical"}[found.state],
        "StartTime": _timestamp(found.started),
        "TaskMonitor": uris.task_monitor_uri(found.id),
        "PercentComplete": 0 if found.state == "Running" else 100,
        "Messages": found.messages,
    }
    if found.ended is not None:
        payload["EndTime"] = _timestamp(found.ended)
    return payload


# --- helpers -------------------------------------------------------------------------------


def _header(uri: str, odata_type: str) -> dict[str, Any]:
    return {"@odata.id": uri, "@odata.type": f"#{odata_type}"}


def _status(enabled: bool) -> dict[str, str]:
    return (
        {"State": "Enabled", "Health": "OK"}
        if enabled
        else {"State": "Disabled", "Health": "Warning"}
    )


def _timestamp(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def _mac_address(block_id: str) -> str:
    """A stable, locally administered MAC address for a simulated port."""
    digest = hashlib.sha256(block_id.encode()).digest()
    octets = [0x02, *digest[:5]]
    return ":".join(f"{o:02X}" for o in octets)


_BLOCK = re.escape(uris.RESOURCE_BLOCKS) + "/([^/]+)"
_ROUTES: list[tuple[re.Pattern[str], Renderer]] = [
    (re.compile(pattern), renderer)
    for pattern, renderer in (
        (re.escape(uris.SERVICE_ROOT) + "?", service_root),
        (re.escape(uris.ODATA), odata_document),
        (re.escape(uris.COMPOSITION_SERVICE), composition_service),
        (re.escape(uris.COMPOSE_ACTION_INFO), compose_action_info),
        (re.escape(uris.RESOURCE_BLOCKS), block_collection),
        (_BLOCK, resource_block),
        (_BLOCK + "/Processors/GPU0", processor),
        (_BLOCK + "/EthernetInterfaces/Port0", ethernet_interface),
        (_BLOCK + "/Drives/Drive0", drive),
        (re.escape(uris.RESOURCE_ZONES), zone_collection),
        (re.escape(uris.RESOURCE_ZONES) + "/([^/]+)", zone),
        (re.escape(uris.SYSTEMS), system_collection),
        (re.escape(uris.SYSTEMS) + "/([^/]+)", system),
        (re.escape(uris.CHASSIS), chassis_collection),
        (re.escape(uris.CHASSIS) + "/([^/]+)", chassis),
        (re.escape(uris.SESSION_SERVICE), session_service),
        (re.escape(uris.SESSIONS), session_collection),
        (re.escape(uris.SESSIONS) + "/([^/]+)", session),
        (re.escape(uris.TASK_SERVICE), task_service),
        (re.escape(uris.TASKS), task_collection),
        (re.escape(uris.TASKS) + "/([^/]+)", task),
    )
]
