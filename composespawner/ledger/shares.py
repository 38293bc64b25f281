"""GPU shares: a GPU split into holder slots, each held by one machine (time-sliced).

How the invariants hold for a split GPU, each step in its caller's transaction:

* a GPU is held whole or in shares, never both, and never in two sizes at once:
  splitting is a compare-and-set on the device row (``machine_id IS NULL AND
  share_size IS NULL``), a whole claim's on ``share_size IS NULL`` too, and a
  CHECK constraint refuses a row that is both;
* never more holders than slots: joining is ``UPDATE ... SET share_holders =
  share_holders + 1 WHERE share_holders < share_size`` with its row count checked
  (and a CHECK constraint);
* the GPU leaves its host only after its last holder: a machine being released
  first *leaves* its shares (its slot stops counting); the one whose leaving
  brings a GPU to no holders becomes its *closer*, and nobody may join a GPU
  with a closer. The closer detaches it on the fabric with its own devices, and
  only its end frees the GPU and the host's slot it took. A release the fabric
  does not confirm leaves the closer ``stopping`` with the GPU, as with any
  device (unknown is not dead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    bindparam,
    delete,
    insert,
    select,
    update,
)

from composespawner.domain.shares import SplitGpu
from composespawner.ledger.errors import DevicesTaken
from composespawner.ledger.rooms import give_slots
from composespawner.ledger.statements import DEVICES, INSERT_USAGE, MACHINES, SHARES
from composespawner.ledger.usage_sums import add_day_use

_D = DEVICES.c


@dataclass(frozen=True, slots=True)
class ShareClaim:
    """A claim's share of one GPU: ``size`` slots in all (4: a quarter), on ``host_id``."""

    block_id: str
    size: int
    host_id: str


_JOIN = (
    update(DEVICES)
    .where(
        _D.block_id == bindparam("b_block"),
        _D.share_size == bindparam("b_size"),
        _D.share_host == bindparam("b_host"),
        _D.share_closer.is_(None),
        _D.share_holders < bindparam("b_size"),
    )
    .values(share_holders=_D.share_holders + 1)
)
_SPLIT = (
    update(DEVICES)
    .where(
        _D.block_id == bindparam("b_block"),
        _D.kind == "gpu",
        _D.machine_id.is_(None),
        _D.share_size.is_(None),
        _D.share_closer.is_(None),
    )
    .values(share_size=bindparam("b_size"), share_host=bindparam("b_host"), share_holders=1)
)
# Locked: two leaves of one machine (a hub's retry and the reconciler's, in two
# processes) must not both count it out (PostgreSQL; SQLite's write lock serializes).
_MINE = select(SHARES).where(SHARES.c.machine_id == bindparam("b_machine_id")).with_for_update()
_LEAVE = (
    update(SHARES)
    .where(SHARES.c.machine_id == bindparam("b_machine_id"), SHARES.c.leaving.is_(False))
    .values(leaving=True)
)
_ONE_FEWER = (
    update(DEVICES)
    .where(_D.block_id == bindparam("b_block"))
    .values(share_holders=_D.share_holders - 1)
)
_CLOSE_IF_EMPTY = (
    update(DEVICES)
    .where(
        _D.block_id.in_(bindparam("b_blocks", expanding=True)),
        _D.share_size.is_not(None),
        _D.share_holders == 0,
        _D.share_closer.is_(None),
    )
    .values(share_closer=bindparam("b_machine_id"))
)
_CLOSED_BY = select(DEVICES).where(_D.share_closer == bindparam("b_machine_id"))
_UNSPLIT = (
    update(DEVICES)
    .where(
        _D.block_id.in_(bindparam("b_blocks", expanding=True)),
        _D.share_closer == bindparam("b_machine_id"),
    )
    .values(share_size=None, share_host=None, share_closer=None, share_holders=0)
)
# The size is the machine's (machines.gpu_share): the GPU's own may be another by now,
# or none, once the machine has left it.
_SHARES_HELD = (
    select(SHARES.c.machine_id, SHARES.c.block_id, MACHINES.c.gpu_share)
    .join(MACHINES, MACHINES.c.id == SHARES.c.machine_id)
    .where(SHARES.c.machine_id.in_(bindparam("b_machines", expanding=True)))
    .order_by(SHARES.c.block_id)
)
_SPLIT_GPUS = select(
    _D.block_id, _D.share_host, _D.share_size, _D.share_holders, _D.share_closer
).where(_D.share_size.is_not(None))


def take_share(connection: Connection, machine_id: str, claim: ShareClaim, now: datetime) -> bool:
    """Take a slot of ``claim``'s GPU for a machine: join it where it is split in that size
    on that host with a slot free and nobody closing it, or split it if it is free.
    Whether this split it (it then takes a device slot on the host); DevicesTaken when
    it can do neither, having taken nothing."""
    values = {"b_block": claim.block_id, "b_size": claim.size, "b_host": claim.host_id}
    opened = False
    if _rowcount(connection.execute(_JOIN, values)) != 1:
        if _rowcount(connection.execute(_SPLIT, values)) != 1:
            raise DevicesTaken([claim.block_id], reason="no share of it is free")
        opened = True
    connection.execute(
        insert(SHARES).values(
            block_id=claim.block_id, machine_id=machine_id, held_since=now, leaving=False
        )
    )
    return opened


def leave_shares(connection: Connection, machine_id: str) -> tuple[str, ...]:
    """The machine stops counting among its GPUs' holders; the GPUs it must detach: those
    it was the last holder of (it closes them). Idempotent."""
    rows = connection.execute(_MINE, {"b_machine_id": machine_id}).all()
    if not rows:
        return ()
    staying = [row.block_id for row in rows if not row.leaving]
    if staying:
        connection.execute(_ONE_FEWER, [{"b_block": block} for block in staying])
        connection.execute(_LEAVE, {"b_machine_id": machine_id})
        # Only a GPU this very leave emptied is this machine's to close: one it left
        # before may be free by now, held whole, or split again for others.
        connection.execute(_CLOSE_IF_EMPTY, {"b_blocks": staying, "b_machine_id": machine_id})
    closed = connection.execute(_CLOSED_BY, {"b_machine_id": machine_id})
    return tuple(sorted(row.block_id for row in closed))


def end_shares(
    connection: Connection, machine: Any, now: datetime, zone: tzinfo, *, used: bool = True
) -> None:
    """At the machine's end: record its shares' use (1/size GPU each), let go of its slots,
    and free the GPUs it closed (their host's slot with them); a GPU it was the last
    holder of without leaving first (a failed claim's) is freed too: nothing else holds
    it, and the reconciler detaches what no holder explains."""
    leave_shares(connection, machine.id)
    rows = connection.execute(
        select(SHARES.c.block_id, SHARES.c.held_since, _D.kind, _D.model)
        .join(DEVICES, _D.block_id == SHARES.c.block_id)
        .where(SHARES.c.machine_id == machine.id)
    ).all()
    if not rows:
        return
    fraction = 1 / machine.gpu_share  # the machine's size: the GPU may be split anew by now
    if used:
        connection.execute(INSERT_USAGE, [_usage(machine, row, now, fraction) for row in rows])
        held = [_Held(r.kind, r.model, r.held_since, fraction) for r in rows]
        add_day_use(connection, machine.user_name, held, now, zone)
    connection.execute(delete(SHARES).where(SHARES.c.machine_id == machine.id))
    closed = connection.execute(_CLOSED_BY, {"b_machine_id": machine.id}).all()
    if closed:
        blocks = [row.block_id for row in closed]
        connection.execute(_UNSPLIT, {"b_blocks": blocks, "b_machine_id": machine.id})
        for row in closed:
            give_slots(connection, cast(str, row.share_host), 1, now)


def shares_held(
    connection: Connection, machine_ids: Sequence[str]
) -> dict[str, list[tuple[str, int]]]:
    """machine id → the GPUs it holds a share of, and the shares' size."""
    if not machine_ids:
        return {}
    found: dict[str, list[tuple[str, int]]] = {}
    for machine_id, block, size in connection.execute(
        _SHARES_HELD, {"b_machines": list(machine_ids)}
    ):
        found.setdefault(machine_id, []).append((block, size))
    return found


def split_gpus(connection: Connection) -> dict[str, SplitGpu]:
    """Every GPU held in shares: where, in what size, by how many, and whether it is closing."""
    return {
        row.block_id: SplitGpu(
            row.share_host, row.share_size, row.share_holders, row.share_closer is not None
        )
        for row in connection.execute(_SPLIT_GPUS)
    }


class _Held(NamedTuple):
    """A share as add_day_use reads a held device: its GPU's kind and model, since when,
    and the fraction of the GPU it counts for."""

    kind: str
    model: str
    held_since: datetime
    fraction: float


def _rowcount(result: Any) -> int:
    return cast(CursorResult[Any], result).rowcount


def _usage(machine: Any, row: Any, now: datetime, fraction: float) -> dict[str, Any]:
    return {
        "machine_id": machine.id,
        "user_name": machine.user_name,
        "server_name": machine.server_name,
        "block_id": row.block_id,
        "kind": row.kind,
        "model": row.model,
        "started_at": row.held_since,
        "ended_at": now,
        "fraction": fraction,
    }
