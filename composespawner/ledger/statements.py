"""The ledger's tables as SQLAlchemy Core handles, and the statements every spawn runs.

Built once, with bind parameters, so each execution skips building and hashing
them again (see :mod:`composespawner.ledger.store`). Bind parameters named after
a column would clash with UPDATE's SET parameters, hence the ``b_`` prefix.
Statements only one part of the ledger runs live with that part.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import (
    Table,
    and_,
    bindparam,
    func,
    insert,
    literal,
    null,
    select,
    union_all,
    update,
)

from composespawner.ledger.lifecycle import TERMINAL
from composespawner.ledger.models import (
    CohortRow,
    ColocatedRow,
    DeviceRow,
    DeviceShareRow,
    MachineEventRow,
    MachineRow,
    QuotaAccountRow,
    ReconcileActionRow,
    RunManifestRow,
    UsageRecordRow,
)

MACHINES = cast(Table, MachineRow.__table__)
COHORTS = cast(Table, CohortRow.__table__)
COLOCATED = cast(Table, ColocatedRow.__table__)
DEVICES = cast(Table, DeviceRow.__table__)
SHARES = cast(Table, DeviceShareRow.__table__)  # holders of split GPUs' slots
EVENTS = cast(Table, MachineEventRow.__table__)
USAGE = cast(Table, UsageRecordRow.__table__)
QUOTA_ACCOUNTS = cast(Table, QuotaAccountRow.__table__)
RECONCILE_ACTIONS = cast(Table, ReconcileActionRow.__table__)
RUN_MANIFESTS = cast(Table, RunManifestRow.__table__)


MACHINE_BY_ID = select(MACHINES).where(MACHINES.c.id == bindparam("b_machine_id"))
HELD_BY_MACHINE = (
    select(DEVICES.c.block_id)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .order_by(DEVICES.c.block_id)
)
# SET comes from the execution's other parameters: state, updated_at and the rest.
MOVE_MACHINE = update(MACHINES).where(
    MACHINES.c.id == bindparam("b_machine_id"), MACHINES.c.state == bindparam("b_from_state")
)
INSERT_EVENT = insert(EVENTS)
INSERT_USAGE = insert(USAGE)
DEVICES_HELD_BY = (
    select(DEVICES)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .order_by(DEVICES.c.block_id)
)
FREE_DEVICES_OF = (
    update(DEVICES)
    .where(DEVICES.c.machine_id == bindparam("b_machine_id"))
    .values(machine_id=None, held_since=None)
)
# One row per live machine: its GPUs and its share of its host (0 for a machine
# from before hosts were shared, which recorded none).
GPU_USE = (
    select(
        MACHINES.c.server_name,
        func.count(DEVICES.c.block_id),
        func.coalesce(MACHINES.c.cores, 0),
        func.coalesce(MACHINES.c.memory_gib, 0),
        MACHINES.c.gpu_share,
    )
    .outerjoin(DEVICES, and_(DEVICES.c.machine_id == MACHINES.c.id, DEVICES.c.kind == "gpu"))
    .where(MACHINES.c.user_name == bindparam("b_user"), MACHINES.c.state.not_in(TERMINAL))
    .group_by(
        MACHINES.c.id,
        MACHINES.c.server_name,
        MACHINES.c.cores,
        MACHINES.c.memory_gib,
        MACHINES.c.gpu_share,
    )
    .order_by(MACHINES.c.server_name, MACHINES.c.id)
)


# Each GPU's period of use that reaches past b_since, and the fraction of a GPU it
# counts for: usage records of ended machines, then GPUs and shares held now (still
# running, so no end yet).
GPU_PERIODS = union_all(
    select(USAGE.c.started_at, USAGE.c.ended_at, USAGE.c.fraction).where(
        USAGE.c.user_name == bindparam("b_user"),
        USAGE.c.kind == "gpu",
        USAGE.c.ended_at > bindparam("b_since"),
    ),
    select(DEVICES.c.held_since, null(), literal(1.0))
    .join(MACHINES, DEVICES.c.machine_id == MACHINES.c.id)
    .where(MACHINES.c.user_name == bindparam("b_user"), DEVICES.c.kind == "gpu"),
    select(SHARES.c.held_since, null(), 1.0 / DEVICES.c.share_size)
    .select_from(
        SHARES.join(DEVICES, DEVICES.c.block_id == SHARES.c.block_id).join(
            MACHINES, MACHINES.c.id == SHARES.c.machine_id
        )
    )
    .where(MACHINES.c.user_name == bindparam("b_user")),
)
