"""What the portal shows of machines: one user's servers, and the admins' inventory of
devices and shared hosts. Pure: records in, JSON-able dicts out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from composespawner.domain.quotas import Quota
from composespawner.domain.rooms import HostUse
from composespawner.ledger import DeviceRecord, Holding, HostRecord, Machine, RunManifest
from composespawner.portal.views import KERNEL_ENVIRONMENT, holding_json, iso, quota_json


def my_machine(
    user: str,
    groups: Iterable[str],
    quota: Quota,
    machines: Iterable[Machine],
    devices: Mapping[str, DeviceRecord],
    gpu_hours_week: float,
) -> dict[str, Any]:
    """One user's servers and machines, their effective quota and their use of it."""
    machines = list(machines)
    servers = [_server(machine, devices) for machine in machines]
    # As the quota counts them: a share of 1/n of a GPU counts 1/n.
    gpus = round(sum(len(s["gpus"]) / s["gpu_share"] for s in servers), 4)
    return {
        "name": user,
        "groups": sorted(groups),
        "quota": quota_json(quota),
        "use": {
            "gpus_held": gpus,
            "gpus_held_text": gpus_held_text(gpus, quota.gpus_held.value),
            "servers": len(servers),
            "gpu_hours_week": round(gpu_hours_week, 3),
            # As the claim counts them: a machine from before hosts were shared, none.
            "cores_held": sum(m.cores or 0 for m in machines),
            "memory_gib_held": sum(m.memory_gib or 0 for m in machines),
        },
        "servers": servers,
    }


def gpus_held_text(held: float, limit: object) -> str:
    """GPUs held against the limit, as a person reads it: "1.25 of 2 GPUs", "0.25 GPUs"."""
    shown = f"{held:g}"
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        return f"{shown} of {limit:g} GPU{'' if limit == 1 else 's'}"
    return f"{shown} GPU{'' if held == 1 else 's'}"


def run_json(run: RunManifest) -> dict[str, Any]:
    """One server's run: when, on which stack and machine, and its whole manifest."""
    manifest = run.manifest
    stack = manifest.get("stack") or {}
    machine = manifest.get("machine") or {}
    return {
        "machine_id": run.machine_id,
        "user": run.user_name,
        "server": run.server_name,
        "started_at": run.started_at.isoformat(timespec="seconds"),
        "stack": stack.get("label"),
        "lock_sha256": stack.get("lock_sha256"),
        "host": machine.get("host"),
        "gpus": [g.get("model") for g in machine.get("gpus", [])],
        "manifest": manifest,
    }


def inventory(
    holdings: Iterable[Holding],
    machines: Iterable[Machine] = (),
    hosts: Iterable[tuple[HostRecord, HostUse]] = (),
) -> dict[str, Any]:
    """Every device with its holder, free/held counts per kind and model, and every host
    with the machines that share it and the room it has left."""
    holdings = list(holdings)
    devices = [holding_json(h) for h in holdings]
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for d in devices:
        count = counts.setdefault((d["kind"], d["model"]), {"free": 0, "held": 0, "shared": 0})
        count["held" if d["holder"] or d["share"] else "free"] += 1
        count["shared"] += d["share"] is not None  # split into shares: held, not free
    summary = [{"kind": k, "model": m, **n} for (k, m), n in sorted(counts.items())]
    kinds = {h.device.block_id: h.device.kind for h in holdings}
    on_host: dict[str, list[Machine]] = {}
    for machine in machines:
        on_host.setdefault(machine.host_id or "", []).append(machine)
    shared = [_host_json(host, held, on_host.pop(host.host_id, []), kinds) for host, held in hosts]
    return {"devices": devices, "summary": summary, "hosts": shared}


def _host_json(
    host: HostRecord, held: HostUse, machines: list[Machine], kinds: Mapping[str, str]
) -> dict[str, Any]:
    """One host: what it has, what is free, and the machines that share it."""
    capacity = host.capacity
    return {
        "id": host.host_id,
        "block": host.block_id,
        "capacity": {
            "cores": capacity.cores,
            "memory_gib": capacity.memory_gib,
            "slots": capacity.slots,
        },
        "free": {
            "cores": capacity.cores - held.cores,
            "memory_gib": capacity.memory_gib - held.memory_gib,
            "slots": capacity.slots - held.slots,
        },
        "machines": [_machine_on_host(m, kinds) for m in machines],
    }


def _machine_on_host(machine: Machine, kinds: Mapping[str, str]) -> dict[str, Any]:
    return {
        "machine": machine.id,
        "user": machine.user_name,
        "server": machine.server_name,
        "state": machine.state,
        "share": _share(machine),
        "devices": [b for b in machine.block_ids if kinds.get(b) != "host"],
        "since": iso(machine.created_at),
    }


def _share(machine: Machine) -> dict[str, int] | None:
    """The machine's cores and memory of its host (None: the whole host)."""
    if machine.cores is None or machine.memory_gib is None:
        return None
    return {"cores": machine.cores, "memory_gib": machine.memory_gib}


def _server(machine: Machine, devices: Mapping[str, DeviceRecord]) -> dict[str, Any]:
    held = [devices[b] for b in machine.block_ids if b in devices]
    return {
        "server": machine.server_name,
        "machine": machine.id,
        "state": machine.state,
        "host": machine.host_id,
        "zone": machine.zone,
        "size": machine.request.get("size"),
        "share": _share(machine),
        "gpu_share": machine.gpu_share,  # 4: its GPU is a quarter of one (1: whole GPUs)
        "since": iso(machine.created_at),
        "gpus": [{"id": d.block_id, "model": d.model} for d in held if d.kind == "gpu"],
        "devices": [{"id": d.block_id, "kind": d.kind, "model": d.model} for d in held],
    }


def resized(
    machine: Machine, devices: Mapping[str, DeviceRecord], environment: Mapping[str, str]
) -> dict[str, Any]:
    """A server after a grow or shrink, its notebook's environment now, and what to do."""
    server = _server(machine, devices)
    gpus = len(server["gpus"])
    return {
        **server,
        "environment": {k: environment[k] for k in KERNEL_ENVIRONMENT},
        "next_step": (
            f"Your server has {gpus} GPU{'s' if gpus != 1 else ''} now. A kernel sees the change"
            " only once it starts again (CUDA counts GPUs as it starts): restart it, or start"
            " a new one, then run `from composespawner import client; client.apply()` before"
            " importing your framework."
        ),
    }
