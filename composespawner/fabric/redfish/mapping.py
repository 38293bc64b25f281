"""Redfish documents → the fabric's domain types (pure, no I/O).

Input: the members of the ResourceBlocks, ResourceZones and Systems
collections, plus the device sub-resources of each block (Processors,
EthernetInterfaces, Drives, Storage) keyed by their ``@odata.id``. Output: an
:class:`~composespawner.fabric.base.Inventory`.

Which blocks are devices:

- a block with a ``Processor`` whose ``ProcessorType`` is ``GPU`` → a GPU;
- a ``Network`` block with EthernetInterfaces → a NIC;
- a block with NVMe ``Drives`` (directly or through ``Storage``) → an NVMe drive.

Blocks of type ``Compute`` or ``ComputerSystem`` (CPUs and memory, or a whole
host) are never devices, even when they also carry an onboard NIC. Storage
blocks that hold no NVMe drive (DMTF's mockup has a ``SimpleStorage`` tray of
SAS disks) are not offered as NVMe scratch either: that would be a lie about
the hardware. Services disagree on what is present, so every field is read
defensively: a missing field means "unknown", never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import unquote

from composespawner.domain.hardware import (
    CompositionTag,
    Device,
    DeviceState,
    Host,
    HostMark,
    Inventory,
)
from composespawner.fabric.base import OEM_KEY

Document = Mapping[str, Any]

# Block sub-resources we read to recognise devices, by ResourceBlock property.
DEVICE_PART_LINKS = ("Processors", "EthernetInterfaces", "Drives", "Storage")
# A host's own block (its CPUs and memory): the schema's name is ComputerSystem,
# DMTF's mockups also use Compute for it. Neither is ever an attachable device.
HOST_BLOCK_TYPES = frozenset({"Compute", "ComputerSystem"})
_ATTACHED_STATES = frozenset({"Composed", "ComposedAndAvailable"})
# Properties whose references $expand=. leaves alone: they are not subordinate.
NOT_SUBORDINATE = frozenset({"Links", "Actions", "Oem"})


def dig(document: Any, *keys: str) -> Any:
    """``document[k1][k2]...``, or None where any step is missing or not an object."""
    for key in keys:
        if not isinstance(document, Mapping):
            return None
        document = document.get(key)
    return document


def normalized(uri: str) -> str:
    return uri.rstrip("/")


def uri_of(document: Any) -> str | None:
    uri = dig(document, "@odata.id")
    return normalized(uri) if isinstance(uri, str) else None


def id_from_uri(uri: str) -> str:
    return unquote(normalized(uri).rsplit("/", 1)[-1])


def resource_id(document: Document) -> str:
    """A resource's Id (by the spec, the last segment of its URI)."""
    found = document.get("Id")
    if isinstance(found, str) and found:
        return found
    uri = uri_of(document)
    return id_from_uri(uri) if uri else ""


def link_uris(links: Any) -> list[str]:
    """The URIs of a list of ``{"@odata.id": ...}`` references (junk skipped)."""
    if not isinstance(links, list):
        return []
    return [uri for uri in (uri_of(link) for link in links) if uri]


def link_ids(links: Any) -> list[str]:
    return [id_from_uri(uri) for uri in link_uris(links)]


def is_reference(member: Any) -> bool:
    """A collection member the service did not expand: only an ``@odata.id``."""
    return isinstance(member, Mapping) and set(member) == {"@odata.id"}


def expand_query(service_root: Document, levels: int = 1) -> str | None:
    """The ``$expand`` query that inlines subordinate resources, if supported.

    ``.`` (expand without following Links) needs ``NoLinks``; ``*`` needs
    ``ExpandAll``; ``($levels=N)`` needs ``Levels`` (ServiceRoot ``Expand``),
    and N above 1 needs ``MaxLevels`` of N or more. None when the service
    cannot expand ``levels`` deep.
    """
    expand = dig(service_root, "ProtocolFeaturesSupported", "ExpandQuery")
    if not isinstance(expand, Mapping):
        return None
    with_levels = expand.get("Levels") is True
    max_levels = expand.get("MaxLevels")
    most = max_levels if with_levels and isinstance(max_levels, int) and max_levels > 1 else 1
    if levels > most:
        return None
    suffix = f"($levels={levels})" if with_levels else ""
    if expand.get("NoLinks") is True:
        return f"$expand=.{suffix}"
    if expand.get("ExpandAll") is True:
        return f"$expand=*{suffix}"
    return None


def deep_expand_query(service_root: Document) -> str | None:
    """``$expand`` that brings device blocks with their parts inline, if supported.

    A block's Processors and EthernetInterfaces are one level below it, Drives
    behind Storage two: three levels from the collection where the service
    allows that many, else two (Storage then brings its Drives as references).
    Only with ``.``: ``*`` would follow every Link that deep too (each block's
    zones and systems, and theirs).
    """
    for levels in (3, 2):
        query = expand_query(service_root, levels)
        if query is not None and query.startswith("$expand=."):
            return query
    return None


def expand_subordinates(
    document: Document, resolve: Callable[[str], Document | None], levels: int = 1
) -> dict[str, Any]:
    """``$expand=.($levels=N)`` of ``document``: what a service answers.

    Subordinate references (``{"@odata.id": ...}`` outside ``Links``,
    ``Actions`` and ``Oem``) are replaced by ``resolve(uri)``, and those
    expanded in turn, ``levels`` deep. A reference ``resolve`` cannot find
    stays a reference.
    """
    return {
        key: value
        if key in NOT_SUBORDINATE or key.startswith("@")
        else _expanded_value(value, resolve, levels)
        for key, value in document.items()
    }


def _expanded_value(value: Any, resolve: Callable[[str], Document | None], levels: int) -> Any:
    if isinstance(value, list):
        return [_expanded_value(item, resolve, levels) for item in value]
    if not isinstance(value, Mapping):
        return value
    if not is_reference(value):  # an embedded object: its references are still ours
        return expand_subordinates(value, resolve, levels)
    found = resolve(value["@odata.id"])
    if found is None:
        return value
    return expand_subordinates(found, resolve, levels - 1) if levels > 1 else found


def inline_parts(blocks: Iterable[Document]) -> dict[str, Document]:
    """Device parts (and compute blocks' CPUs and DIMMs) that came expanded inside
    ``blocks``, by normalized URI."""
    parts = [
        part
        for block in blocks
        for name in (("Processors", "Memory") if is_compute_block(block) else DEVICE_PART_LINKS)
        for part in _documents(block.get(name))
    ]
    drives = [drive for part in parts for drive in _documents(part.get("Drives"))]
    return {uri: document for document in parts + drives if (uri := uri_of(document))}


def _documents(value: Any) -> list[Document]:
    """The expanded members of a list (references and junk left out)."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping) and not is_reference(item)]


def block_types(block: Document) -> frozenset[str]:
    types = block.get("ResourceBlockType")
    if not isinstance(types, list):
        return frozenset()
    return frozenset(t for t in types if isinstance(t, str))


def device_part_uris(block: Document) -> list[str]:
    """Sub-resources to read to tell what device ``block`` is (none for hosts)."""
    if block_types(block) & HOST_BLOCK_TYPES:
        return []
    return [uri for name in DEVICE_PART_LINKS for uri in link_uris(block.get(name))]


def storage_drive_uris(parts: Mapping[str, Document]) -> list[str]:
    """Drives of the Storage resources among ``parts`` (a second discovery round)."""
    return [
        uri
        for part in parts.values()
        if is_type(part, "Storage")
        for uri in link_uris(part.get("Drives"))
        if uri not in parts
    ]


def is_type(document: Document, type_name: str) -> bool:
    odata_type = document.get("@odata.type")
    return isinstance(odata_type, str) and odata_type.startswith(f"#{type_name}.")


# -- devices -----------------------------------------------------------------------------------


def device_state(block: Document) -> DeviceState:
    """free / attached / unavailable; "attached" wins over an inconsistent "Unused"."""
    composition = dig(block, "CompositionStatus", "CompositionState")
    if composition in _ATTACHED_STATES or link_uris(dig(block, "Links", "ComputerSystems")):
        return "attached"
    reserved = dig(block, "CompositionStatus", "Reserved") is True
    if dig(block, "Status", "State") == "Enabled" and composition == "Unused" and not reserved:
        return "free"
    return "unavailable"


def device_from_block(
    block: Document, parts: Mapping[str, Document], zones: frozenset[str]
) -> Device | None:
    """The device a block is, or None for blocks that are not attachable devices."""
    if block_types(block) & HOST_BLOCK_TYPES:
        return None
    common: dict[str, Any] = {
        "block_id": resource_id(block),
        "zones": zones,
        "chassis": next(iter(link_ids(dig(block, "Links", "Chassis"))), ""),
        "state": device_state(block),
        "attached_to": next(iter(link_ids(dig(block, "Links", "ComputerSystems"))), None),
    }
    gpu = _gpu(block, parts)
    if gpu is not None:
        return Device(
            kind="gpu",
            model=_text(gpu.get("Model")),
            memory_gib=gpu_memory_gib(gpu),
            uuid=_text(gpu.get("UUID")) or None,
            **common,
        )
    interfaces = _parts(block.get("EthernetInterfaces"), parts)
    if "Network" in block_types(block) and interfaces:
        return Device(
            kind="nic",
            model=nic_model(block, interfaces),
            speed_gbps=nic_speed_gbps(interfaces),
            **common,
        )
    drives = nvme_drives(block, parts)
    if drives:
        return Device(
            kind="nvme",
            model=drive_model(block, drives),
            capacity_gb=drives_capacity_gb(drives),
            **common,
        )
    return None


def _parts(links: Any, parts: Mapping[str, Document]) -> list[Document]:
    return [parts[uri] for uri in link_uris(links) if uri in parts]


def _gpu(block: Document, parts: Mapping[str, Document]) -> Document | None:
    processors = _parts(block.get("Processors"), parts)
    return next((p for p in processors if p.get("ProcessorType") == "GPU"), None)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def gpu_memory_gib(processor: Document) -> int | None:
    mib = dig(processor, "MemorySummary", "TotalMemorySizeMiB")
    if not isinstance(mib, int | float):
        sizes = [dig(m, "CapacityMiB") for m in processor.get("ProcessorMemory") or []]
        numbers = [s for s in sizes if isinstance(s, int | float)]
        mib = sum(numbers) if numbers else None
    return round(mib / 1024) if mib else None


def nic_model(block: Document, interfaces: Sequence[Document]) -> str:
    described = next((i["Description"] for i in interfaces if _text(i.get("Description"))), None)
    return described or _text(block.get("Name")) or resource_id(block)


def nic_speed_gbps(interfaces: Sequence[Document]) -> int | None:
    speeds = [i.get("SpeedMbps") for i in interfaces]
    known = [s for s in speeds if isinstance(s, int | float)]
    return int(max(known) // 1000) if known else None


def nvme_drives(block: Document, parts: Mapping[str, Document]) -> list[Document]:
    """The NVMe drives of a block, directly linked or through its Storage.

    A service may link one drive both ways: each drive counts once, by its URI.
    """
    uris = link_uris(block.get("Drives"))
    for storage in _parts(block.get("Storage"), parts):
        uris += link_uris(storage.get("Drives"))
    drives = [parts[uri] for uri in dict.fromkeys(uris) if uri in parts]
    # A drive that does not say its protocol is taken as NVMe: in a PCIe
    # fabric it almost always is, and dropping it would hide hardware.
    return [d for d in drives if d.get("Protocol") in (None, "NVMe")]


def drive_model(block: Document, drives: Sequence[Document]) -> str:
    first = drives[0]
    return _text(first.get("Model")) or _text(first.get("Name")) or _text(block.get("Name"))


def drives_capacity_gb(drives: Sequence[Document]) -> int | None:
    sizes = [d.get("CapacityBytes") for d in drives]
    known = [s for s in sizes if isinstance(s, int)]
    return sum(known) // 10**9 if known else None


# -- zones and hosts -----------------------------------------------------------------------


def zone_membership(zones: Iterable[Document]) -> dict[str, set[str]]:
    """Block URI → Ids of the zones whose ``Links.ResourceBlocks`` list it."""
    members: dict[str, set[str]] = {}
    for zone in zones:
        for uri in link_uris(dig(zone, "Links", "ResourceBlocks")):
            members.setdefault(uri, set()).add(resource_id(zone))
    return members


def block_zones(block: Document, membership: Mapping[str, set[str]]) -> frozenset[str]:
    """A block's zones, from its own links and from the zones' member lists."""
    listed = membership.get(uri_of(block) or "", set())
    return frozenset(link_ids(dig(block, "Links", "Zones"))) | listed


def host_mark(system: Document) -> HostMark | None:
    """Our ``Oem.ComposeSpawner`` mark on a system; None when absent or malformed.

    Two shapes: ``{"Hub", "Machines": [{"Machine", "Owner"}, ...]}`` (v1_1, a
    host shared by several machines) and ``{"Hub", "Machine", "Owner"}`` (v1_0,
    written before hosts were shared: one machine).
    """
    mark = dig(system, "Oem", OEM_KEY)
    hub = dig(mark, "Hub")
    if not isinstance(hub, str) or not hub:
        return None  # not clearly ours: never treat it as ours
    listed = dig(mark, "Machines")
    entries = listed if isinstance(listed, list) else [mark] if "Machine" in mark else None
    if not entries:
        return None
    machines = []
    for entry in entries:
        machine, owner = dig(entry, "Machine"), dig(entry, "Owner")
        if not (isinstance(machine, str) and machine and isinstance(owner, str) and owner):
            return None
        machines.append(CompositionTag(hub=hub, machine=machine, owner=owner))
    return HostMark(hub, tuple(machines))


def mark_object(mark: HostMark | None) -> dict[str, Any] | None:
    """What ``Oem.ComposeSpawner`` holds for ``mark`` (null removes it: merge-patch);
    :func:`host_mark` reads it back."""
    if mark is None:
        return None
    return {
        "Hub": mark.hub,
        "Machines": [{"Machine": m.machine, "Owner": m.owner} for m in mark.machines],
    }


def host_cores(system: Document) -> int:
    """CPU cores of a system: ``ProcessorSummary.CoreCount`` (ComputerSystem v1_14), or on
    services that give only ``Count`` that, which undercounts (sockets) but never over."""
    cores = dig(system, "ProcessorSummary", "CoreCount")
    return _count(cores if cores is not None else dig(system, "ProcessorSummary", "Count"))


def is_expandable(system: Document) -> bool:
    use_cases = dig(system, "Composition", "UseCases")
    return isinstance(use_cases, list) and "ExpandableSystem" in use_cases


def host_from_system(
    system: Document, blocks_by_uri: Mapping[str, Document], membership: Mapping[str, set[str]]
) -> Host | None:
    """The host ``system`` is, or None.

    A host is a system devices can be added to: ``Composition.UseCases``
    lists ``ExpandableSystem``, and among its ``Links.ResourceBlocks`` is its
    own block, of type ``ComputerSystem`` or ``Compute`` (the first such is
    its own; every other linked block is an attached device).
    """
    if not is_expandable(system):
        return None
    linked = link_uris(dig(system, "Links", "ResourceBlocks"))
    own_uri = next((u for u in linked if _types_at(u, blocks_by_uri) & HOST_BLOCK_TYPES), None)
    if own_uri is None:
        return None
    own = blocks_by_uri[own_uri]
    return Host(
        system_id=resource_id(system),
        block_id=resource_id(own),
        zones=block_zones(own, membership),
        cpus=host_cores(system),
        memory_gib=_count(dig(system, "MemorySummary", "TotalSystemMemoryGiB")),
        state=_host_state(system, own),
        attached=tuple(id_from_uri(u) for u in linked if u != own_uri),
        mark=host_mark(system),
    )


def _types_at(uri: str, blocks_by_uri: Mapping[str, Document]) -> frozenset[str]:
    block = blocks_by_uri.get(uri)
    return block_types(block) if block is not None else frozenset()


def _count(value: Any) -> int:
    return round(value) if isinstance(value, int | float) else 0


def _host_state(system: Document, own_block: Document) -> Literal["enabled", "unavailable"]:
    system_state = dig(system, "Status", "State")
    usable = dig(own_block, "Status", "State") == "Enabled" and system_state in (None, "Enabled")
    return "enabled" if usable else "unavailable"


def system_block_ids(system: Document) -> list[str]:
    """Ids of the blocks a system is composed of now (its own block included)."""
    return link_ids(dig(system, "Links", "ResourceBlocks"))


def is_compute_block(block: Document) -> bool:
    return bool(block_types(block) & HOST_BLOCK_TYPES)


def system_holding(block_id: str, systems: Iterable[Document]) -> Document | None:
    """The (composed) system whose ``Links.ResourceBlocks`` lists block ``block_id``."""
    return next((s for s in systems if block_id in system_block_ids(s)), None)


def host_from_compute_block(
    block: Document,
    systems: Sequence[Document],
    membership: Mapping[str, set[str]],
    parts: Mapping[str, Document] | None = None,
    *,
    blocks_writable: bool | None = None,
) -> Host:
    """Where whole systems are composed, a free compute block is a host, named by its Id.

    Its mark and devices are those of the system composed of it, if any. A
    block composed without our mark (or into a system we cannot read, or one
    whose block still reads Unused) is someone else's: "unavailable". Its
    capacity is its system's summary, else its own CPUs and DIMMs (``parts``).
    Machines share it only where the service lets a composed system's blocks
    change (``blocks_writable``) and its capacity is known: else one machine
    has the whole system, as it was composed.
    """
    block_id = resource_id(block)
    holding = system_holding(block_id, systems)
    system = holding or {}
    mark = host_mark(system)
    state = _host_state(system, block)
    # A system that links the block holds it, whatever the block's own status says.
    if mark is None and (holding is not None or device_state(block) == "attached"):
        state = "unavailable"
    cores, memory = block_capacity(block, parts or {})
    cpus = host_cores(system) or cores
    memory_gib = _count(dig(system, "MemorySummary", "TotalSystemMemoryGiB")) or memory
    return Host(
        system_id=block_id,
        block_id=block_id,
        zones=block_zones(block, membership),
        cpus=cpus,
        memory_gib=memory_gib,
        state=state,
        attached=tuple(b for b in system_block_ids(system) if b != block_id),
        mark=mark,
        shareable=blocks_writable is True and cpus > 0 and memory_gib > 0,
    )


def blocks_writable(system: Document) -> bool | None:
    """Whether a PATCH may change a system's ``Links.ResourceBlocks``; None: not said.

    ``@Redfish.WriteableProperties`` in ``Links`` (or ``Links@Redfish...`` beside
    it) lists what is writable there now: the schema marks ResourceBlocks
    ReadWrite, but some services keep a composed system's blocks until DELETE.
    """
    listed = dig(system, "Links", "@Redfish.WriteableProperties")
    if not isinstance(listed, list):
        listed = system.get("Links@Redfish.WriteableProperties")
    return "ResourceBlocks" in listed if isinstance(listed, list) else None


def compute_part_uris(block: Document) -> list[str]:
    """A compute block's Processor and Memory resources (none for other blocks)."""
    if "Compute" not in block_types(block):
        return []
    return [uri for name in ("Processors", "Memory") for uri in link_uris(block.get(name))]


def block_capacity(block: Document, parts: Mapping[str, Document]) -> tuple[int, int]:
    """Cores (its CPUs' ``TotalCores``) and GiB (its DIMMs' ``CapacityMiB``) of a compute
    block, from its parts among ``parts``; 0 where unknown, never more than it has."""
    found = [parts[uri] for uri in compute_part_uris(block) if uri in parts]
    cpus = [p for p in found if is_type(p, "Processor") and p.get("ProcessorType") in ("CPU", None)]
    mib = sum(_count(p.get("CapacityMiB")) for p in found if is_type(p, "Memory"))
    return sum(_count(p.get("TotalCores")) for p in cpus), mib // 1024


def build_inventory(
    *,
    blocks: Sequence[Document],
    zones: Sequence[Document],
    systems: Sequence[Document],
    parts: Mapping[str, Document],
    whole_systems: bool = False,
    blocks_writable: bool | None = None,
) -> Inventory:
    """The inventory; with ``whole_systems`` free compute blocks are hosts too.

    A service that composes whole systems may still have expandable systems
    (DMTF's mockup has both): those stay hosts of their own. ``blocks_writable``:
    whether its composed systems' blocks may be changed (None: not known yet).
    """
    membership = zone_membership(zones)
    blocks_by_uri = {uri: b for b in blocks if (uri := uri_of(b))}
    devices = [device_from_block(b, parts, block_zones(b, membership)) for b in blocks]
    devices = held_by_systems(devices, systems)
    hosts = [host_from_system(s, blocks_by_uri, membership) for s in systems]
    if whole_systems:
        # Expandable systems stay hosts; every other compute block is one too.
        owned = {h.block_id for h in hosts if h is not None}
        computes = [b for b in blocks if is_compute_block(b) and resource_id(b) not in owned]
        hosts += [
            host_from_compute_block(b, systems, membership, parts, blocks_writable=blocks_writable)
            for b in computes
        ]
        devices = _attached_to_hosts(devices, systems, {resource_id(b) for b in computes})
    return Inventory(
        hosts=tuple(h for h in hosts if h is not None),
        devices=tuple(d for d in devices if d is not None),
        zones=tuple(resource_id(z) for z in zones),
    )


def held_by_systems(
    devices: Sequence[Device | None], systems: Sequence[Document]
) -> list[Device | None]:
    """Devices that a system's ``Links.ResourceBlocks`` lists are in use by that system.

    Whatever their blocks say: some services never update a block's
    ``CompositionStatus`` (it keeps reading Unused) or its
    ``Links.ComputerSystems`` when a system takes it. The system is the truth
    about what it holds; a block that names its holder itself keeps that name.
    """
    holder = {block: resource_id(s) for s in systems for block in system_block_ids(s)}
    return [
        replace(d, state="attached", attached_to=d.attached_to or holder[d.block_id])
        if d is not None and d.block_id in holder
        else d
        for d in devices
    ]


def _attached_to_hosts(
    devices: list[Device | None], systems: Sequence[Document], computes: set[str]
) -> list[Device | None]:
    """A device in a composed system is attached to the host its system was composed on."""
    host_of_system = {
        resource_id(s): host
        for s in systems
        if (host := next((b for b in system_block_ids(s) if b in computes), None))
    }
    return [
        replace(d, attached_to=host_of_system[d.attached_to])
        if d is not None and d.attached_to in host_of_system
        else d
        for d in devices
    ]
