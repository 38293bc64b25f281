"""The simulated hardware: parsing the inventory TOML into frozen specs (pure).

The file (see ``hub_config/fabric_inventory.toml``) lists zones, chassis and
*groups* of hosts and devices. A group expands to ``count`` items with ids
``<prefix>-<n>``: hosts are zero-padded to two digits (``host-01``), devices
are not (``r1-a100-1``). Each device is one resource block with its own id;
each host gets a ``ComputerSystem`` block named ``<host-id>-block``.

Nothing here knows about Redfish or HTTP: this is the hardware list the state
model (:mod:`.state`) composes with.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The devices the simulated fabric can hold: each is served as the Redfish
# resources a real fabric shows for it (a GPU Processor, a NIC's
# EthernetInterface, an NVMe Drive behind Storage).
DeviceKind = Literal["gpu", "nic", "nvme"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("gpu", "nic", "nvme")

# Chassis types the inventory may use: the Redfish ChassisType values that
# make sense for composable hardware.
CHASSIS_TYPES = frozenset(
    {"Rack", "Expansion", "Enclosure", "RackMount", "Drawer", "Module", "Shelf", "Sled"}
)
HOST_ID_DIGITS = 2
HOST_BLOCK_SUFFIX = "-block"


class InventoryError(ValueError):
    """The inventory file is malformed or inconsistent."""


@dataclass(frozen=True, slots=True)
class ZoneSpec:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ChassisSpec:
    id: str
    name: str
    type: str  # a Redfish ChassisType


@dataclass(frozen=True, slots=True)
class HostSpec:
    """A compute host: its capacity is what machines sharing it divide among themselves."""

    id: str  # the ComputerSystem Id
    zones: tuple[str, ...]
    chassis: str
    cores: int  # ProcessorSummary.CoreCount
    memory_gib: int  # MemorySummary.TotalSystemMemoryGiB
    # ProcessorSummary.Count; None (older files): Count is the cores, as it was served then.
    sockets: int | None = None

    @property
    def block_id(self) -> str:
        return host_block_id(self.id)

    @property
    def cpus(self) -> int:
        """The cores, by the name older readers of the inventory use."""
        return self.cores


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    id: str  # the ResourceBlock Id
    kind: DeviceKind
    chassis: str
    zones: tuple[str, ...]
    manufacturer: str
    model: str
    memory_gib: int | None = None  # GPUs
    speed_gbps: int | None = None  # NICs
    capacity_gb: int | None = None  # NVMe drives


@dataclass(frozen=True, slots=True)
class InventorySpec:
    """All the hardware of one simulated fabric."""

    name: str
    uuid: str
    zones: tuple[ZoneSpec, ...]
    chassis: tuple[ChassisSpec, ...]
    hosts: tuple[HostSpec, ...]
    devices: tuple[DeviceSpec, ...]
    _hosts: dict[str, HostSpec] = field(default_factory=dict, compare=False, repr=False)
    _devices: dict[str, DeviceSpec] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._hosts.update({h.id: h for h in self.hosts})
        self._devices.update({d.id: d for d in self.devices})

    def host(self, system_id: str) -> HostSpec | None:
        return self._hosts.get(system_id)

    def device(self, block_id: str) -> DeviceSpec | None:
        return self._devices.get(block_id)

    def host_of_block(self, block_id: str) -> HostSpec | None:
        """The host whose own ComputerSystem block this is, if it is one."""
        if not block_id.endswith(HOST_BLOCK_SUFFIX):
            return None
        return self._hosts.get(block_id.removesuffix(HOST_BLOCK_SUFFIX))

    def block_ids(self) -> tuple[str, ...]:
        """Every resource block: host blocks first, then devices, in file order."""
        return tuple(h.block_id for h in self.hosts) + tuple(d.id for d in self.devices)

    def block_zones(self, block_id: str) -> tuple[str, ...]:
        host = self.host_of_block(block_id)
        if host is not None:
            return host.zones
        device = self.device(block_id)
        return device.zones if device is not None else ()

    def block_chassis(self, block_id: str) -> str:
        host = self.host_of_block(block_id)
        if host is not None:
            return host.chassis
        device = self.device(block_id)
        if device is None:
            raise KeyError(block_id)
        return device.chassis


def host_block_id(system_id: str) -> str:
    return f"{system_id}{HOST_BLOCK_SUFFIX}"


def load_inventory(path: str | Path) -> InventorySpec:
    """Read and check an inventory file; :class:`InventoryError` says what is wrong."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise InventoryError(f"cannot read inventory {path}: {err}") from err
    return parse_inventory(data)


def parse_inventory(data: Mapping[str, Any]) -> InventorySpec:
    """Build an :class:`InventorySpec` from the TOML document's data."""
    service = _table(data.get("service", {}), "[service]")
    zones = tuple(_zone(_table(z, "[[zones]]")) for z in _tables(data, "zones"))
    chassis = tuple(_chassis(_table(c, "[[chassis]]")) for c in _tables(data, "chassis"))
    hosts = tuple(h for g in _tables(data, "hosts") for h in _host_group(_table(g, "[[hosts]]")))
    devices = tuple(
        d for g in _tables(data, "devices") for d in _device_group(_table(g, "[[devices]]"))
    )
    spec = InventorySpec(
        name=_str(service, "name", "[service]", "Simulated composable fabric"),
        uuid=_str(service, "uuid", "[service]", "00000000-0000-4000-8000-000000000000"),
        zones=zones,
        chassis=chassis,
        hosts=hosts,
        devices=devices,
    )
    _check_references(spec)
    return spec


def _zone(table: Mapping[str, Any]) -> ZoneSpec:
    zone_id = _str(table, "id", "[[zones]]")
    return ZoneSpec(id=zone_id, name=_str(table, "name", "[[zones]]", zone_id))


def _chassis(table: Mapping[str, Any]) -> ChassisSpec:
    chassis_id = _str(table, "id", "[[chassis]]")
    kind = _str(table, "type", f"chassis {chassis_id}")
    if kind not in CHASSIS_TYPES:
        raise InventoryError(f"chassis {chassis_id}: type {kind!r} not in {sorted(CHASSIS_TYPES)}")
    return ChassisSpec(
        id=chassis_id, name=_str(table, "name", "[[chassis]]", chassis_id), type=kind
    )


def _host_group(group: Mapping[str, Any]) -> list[HostSpec]:
    where = f"hosts group {group.get('prefix')!r}"
    prefix = _str(group, "prefix", where)
    zones = _zones(group, where)
    return [
        HostSpec(
            id=f"{prefix}-{n:0{HOST_ID_DIGITS}d}",
            zones=zones,
            chassis=_str(group, "chassis", where),
            cores=_cores(group, where),
            memory_gib=_int(group, "memory_gib", where),
            sockets=_optional_int(group, "sockets", where),
        )
        for n in _numbers(group, where)
    ]


def _cores(group: Mapping[str, Any], where: str) -> int:
    """``cores``, or ``cpus`` as older inventory files name them."""
    key = "cores" if "cores" in group or "cpus" not in group else "cpus"
    cores = _int(group, key, where)
    if cores < 1:
        raise InventoryError(f"{where}: `{key}` must be at least 1")
    return cores


def _optional_int(group: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in group:
        return None
    value = _int(group, key, where)
    if value < 1:
        raise InventoryError(f"{where}: `{key}` must be at least 1")
    return value


def _device_group(group: Mapping[str, Any]) -> list[DeviceSpec]:
    where = f"devices group {group.get('prefix')!r}"
    prefix = _str(group, "prefix", where)
    kind = _str(group, "kind", where)
    if kind not in DEVICE_KINDS:
        raise InventoryError(f"{where}: kind {kind!r} not in {list(DEVICE_KINDS)}")
    size_key = {"gpu": "memory_gib", "nic": "speed_gbps", "nvme": "capacity_gb"}[kind]
    sizes = {size_key: _int(group, size_key, where)}
    return [
        DeviceSpec(
            id=f"{prefix}-{n}",
            kind=kind,
            chassis=_str(group, "chassis", where),
            zones=_zones(group, where),
            manufacturer=_str(group, "manufacturer", where),
            model=_str(group, "model", where),
            **sizes,
        )
        for n in _numbers(group, where)
    ]


def _check_references(spec: InventorySpec) -> None:
    zone_ids = [z.id for z in spec.zones]
    chassis_ids = [c.id for c in spec.chassis]
    for kind, ids in (("zone", zone_ids), ("chassis", chassis_ids)):
        _check_unique(kind, ids)
    _check_unique("resource block", list(spec.block_ids()))
    _check_unique("host", [h.id for h in spec.hosts])
    items: list[HostSpec | DeviceSpec] = [*spec.hosts, *spec.devices]
    for item in items:
        if item.chassis not in chassis_ids:
            raise InventoryError(f"{item.id}: unknown chassis {item.chassis!r}")
        unknown = sorted(set(item.zones) - set(zone_ids))
        if unknown:
            raise InventoryError(f"{item.id}: unknown zones {unknown}")


def _check_unique(kind: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            raise InventoryError(f"duplicate {kind} id {item_id!r}")
        seen.add(item_id)


def _numbers(group: Mapping[str, Any], where: str) -> range:
    first = _int(group, "first", where, default=1)
    count = _int(group, "count", where)
    if count < 0 or first < 0:
        raise InventoryError(f"{where}: count and first must not be negative")
    return range(first, first + count)


def _zones(group: Mapping[str, Any], where: str) -> tuple[str, ...]:
    if "zone" in group:
        return (_str(group, "zone", where),)
    zones = group.get("zones")
    if not isinstance(zones, list) or not zones or not all(isinstance(z, str) for z in zones):
        raise InventoryError(f"{where}: needs `zone` or a non-empty list of strings `zones`")
    return tuple(zones)


def _tables(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise InventoryError(f"`{key}` must be an array of tables ([[{key}]])")
    return value


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InventoryError(f"{where} must be a table")
    return value


def _str(table: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"{where}: `{key}` must be a non-empty string")
    return value


def _int(table: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InventoryError(f"{where}: `{key}` must be an integer")
    return value
