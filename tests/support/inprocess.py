"""``InProcessFabric``: the Fabric protocol straight over the simulator's state model.

A strict fake for unit tests: no HTTP and no subprocess, but the very same
``fabricsim.state.FabricState`` that the Redfish
simulator serves, so it accepts and refuses exactly what the simulator does
(a block attached elsewhere, an unknown block or host, a block outside the
host's zones, a host block, a disabled block), raising the error types of
:mod:`composespawner.fabric.base`.

Tests reach behind it through :attr:`InProcessFabric.state`, e.g. to attach
a device "by someone else" or to disable a block.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from composespawner.domain.hardware import (
    CompositionTag,
    Device,
    DeviceState,
    Host,
    HostMark,
    Inventory,
)
from composespawner.fabric.base import (
    DeviceInUse,
    DeviceNotFound,
    FabricRefused,
    FabricUnreachable,
    IncompatibleZone,
    Progress,
    StaleETag,
    compose_by_attaching,
    decompose_by_detaching,
    host_taken_by,
)
from fabricsim.errors import (
    BlockInUse,
    BlockNotFound,
    ETagMismatch,
    ETagRequired,
    ResourceMissing,
    SimulatorError,
    ZoneMismatch,
)
from fabricsim.inventory import (
    DeviceSpec,
    HostSpec,
    InventorySpec,
    load_inventory,
)
from fabricsim.state import FabricState

# Simulator refusals that have a more specific fabric error than FabricRefused.
_REFUSALS: dict[type[SimulatorError], type[FabricRefused]] = {
    BlockInUse: DeviceInUse,
    BlockNotFound: DeviceNotFound,
    ResourceMissing: DeviceNotFound,
    ZoneMismatch: IncompatibleZone,
    ETagMismatch: StaleETag,
    ETagRequired: StaleETag,
}


class InProcessFabric:
    """A :class:`~composespawner.fabric.base.Fabric` over an in-memory simulated fabric."""

    def __init__(self, state: FabricState) -> None:
        self.state = state
        self._closed = False

    @classmethod
    def from_inventory(cls, inventory: InventorySpec | str | Path) -> Self:
        """A fresh fabric (nothing attached) from an inventory spec or TOML file."""
        spec = inventory if isinstance(inventory, InventorySpec) else load_inventory(inventory)
        return cls(FabricState(spec, epoch=secrets.token_hex(4)))

    def seconds_since_answer(self) -> float:
        return 0.0  # in this process: it answers whenever it is asked

    async def inventory(self) -> Inventory:
        self._check_open()
        spec = self.state.inventory
        return Inventory(
            hosts=tuple(self._host(h) for h in spec.hosts),
            devices=tuple(self._device(d) for d in spec.devices),
            zones=tuple(z.id for z in spec.zones),
        )

    async def host_mark(self, system_id: str) -> tuple[HostMark | None, tuple[str, ...]]:
        self._check_open()
        with _refusals():
            host = self.state.host(system_id)
            return self.mark(system_id), (host.block_id, *self.state.attached(system_id))

    def mark(self, system_id: str) -> HostMark | None:
        """The host's mark now, for tests (no I/O, works after close)."""
        return _domain_mark(self.state.tag(system_id))

    def set_mark(self, system_id: str, mark: HostMark | None) -> None:
        """Write a host's mark behind the client's back (another client, an admin)."""
        self.state.set_tag(system_id, mark, if_match="*")

    async def join_host(self, system_id: str, tag: CompositionTag) -> None:
        self._check_open()
        with _refusals():
            # As a Redfish client does: read the system's ETag, PATCH with If-Match.
            etag = self.state.system_etag(self.state.host(system_id).id)
            current = self.mark(system_id)
            holder = host_taken_by(
                current,
                marked=self.state.tag(system_id) is not None,
                attached=self.state.attached(system_id),
                hub=tag.hub,
            )
            if holder:
                raise DeviceInUse(f"host {system_id} is already composed for {holder}")
            joined = current.joined(tag) if current else HostMark.of(tag)
            if joined != current:
                self.state.set_tag(system_id, joined, if_match=etag)

    async def leave_host(self, system_id: str, tag: CompositionTag) -> None:
        self._check_open()
        with _refusals():
            etag = self.state.system_etag(self.state.host(system_id).id)
            current = self.mark(system_id)
            if current is not None and current.has(tag):
                self.state.set_tag(system_id, current.left(tag), if_match=etag)

    async def attach(self, system_id: str, block_id: str) -> None:
        self._check_open()
        with _refusals():
            self.state.add_resource_block(system_id, block_id)

    async def detach(self, system_id: str, block_id: str) -> None:
        self._check_open()
        with _refusals():
            self.state.remove_resource_block(system_id, block_id)

    async def compose(
        self, host: str, devices: Sequence[Device], tag: CompositionTag, progress: Progress
    ) -> str:
        """Expandable composition, as the Redfish client does it on such a service."""
        return await compose_by_attaching(self, host, devices, tag, progress)

    async def decompose(self, host: str, blocks: Sequence[str], tag: CompositionTag) -> bool:
        return await decompose_by_detaching(self, host, blocks, tag)

    async def close(self) -> None:
        """Further calls raise :class:`FabricUnreachable`, to catch use after close."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise FabricUnreachable("InProcessFabric used after close()")

    def _host(self, spec: HostSpec) -> Host:
        return Host(
            system_id=spec.id,
            block_id=spec.block_id,
            zones=frozenset(spec.zones),
            cpus=spec.cpus,
            memory_gib=spec.memory_gib,
            state="enabled" if self.state.is_enabled(spec.block_id) else "unavailable",
            attached=self.state.attached(spec.id),
            mark=self.mark(spec.id),
        )

    def _device(self, spec: DeviceSpec) -> Device:
        holder = self.state.holder(spec.id)
        state: DeviceState = "free"
        if holder is not None:
            state = "attached"
        elif not self.state.is_enabled(spec.id):
            state = "unavailable"
        return Device(
            block_id=spec.id,
            kind=spec.kind,
            model=spec.model,
            zones=frozenset(spec.zones),
            chassis=spec.chassis,
            state=state,
            attached_to=holder,
            memory_gib=spec.memory_gib,
            # As the simulator serves Processor.UUID: derived from the fabric's and the block's.
            uuid=str(uuid.uuid5(uuid.UUID(self.state.inventory.uuid), spec.id))
            if spec.kind == "gpu"
            else None,
            speed_gbps=spec.speed_gbps,
            capacity_gb=spec.capacity_gb,
        )


def _domain_mark(mark: object) -> HostMark | None:
    """What the simulator's state keeps under a host's mark, as the domain's type: the
    very object this fake wrote, or a one-machine mark of an older client's tag."""
    if mark is None or isinstance(mark, HostMark):
        return mark
    hub, machine, owner = (getattr(mark, key, None) for key in ("hub", "machine", "owner"))
    if isinstance(hub, str) and isinstance(machine, str) and isinstance(owner, str):
        return HostMark.of(CompositionTag(hub=hub, machine=machine, owner=owner))
    raise TypeError(f"not a host mark: {mark!r}")


@contextmanager
def _refusals() -> Iterator[None]:
    """Re-raise simulator refusals as the fabric protocol's errors."""
    try:
        yield
    except SimulatorError as err:
        kind = _REFUSALS.get(type(err), FabricRefused)
        raise kind(str(err), status=err.status, message_ids=[err.message_id]) from err
