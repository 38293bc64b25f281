"""The allocation ledger: who holds which device, machines' lifecycle, events and usage.

Use :class:`Ledger`; everything it returns is a frozen record from
:mod:`composespawner.ledger.records`, and everything it refuses is a
:class:`LedgerError` from :mod:`composespawner.ledger.errors`.
"""

from composespawner.ledger.errors import (
    DevicesTaken,
    HostFull,
    IllegalTransition,
    LedgerError,
    NotOwner,
    NotRunning,
    QuotaExceeded,
    ReservedForCohort,
    SchemaNotCurrent,
    ServerBusy,
    SharesDoNotGrow,
    UnknownDevices,
    UnknownMachine,
)
from composespawner.ledger.lifecycle import (
    HOLDING,
    LIVE,
    STATES,
    TERMINAL,
    TRANSITIONS,
    MachineState,
    can_transition,
    check_transition,
    is_terminal,
)
from composespawner.ledger.models import AppendOnlyViolation
from composespawner.ledger.policy import Actor, AuditEntry, Policy, SpawnPolicy
from composespawner.ledger.reclaims import GiveBack, Reclaims
from composespawner.ledger.records import (
    HOLDABLE_KINDS,
    DeviceRecord,
    HoldableKind,
    Holding,
    Holds,
    HostRecord,
    KeepFree,
    Machine,
    MachineEvent,
    RoomClaim,
    RunManifest,
    ServerUse,
    UsageRecord,
    server_label,
    utcnow,
)
from composespawner.ledger.runner import LedgerRunner
from composespawner.ledger.shares import ShareClaim
from composespawner.ledger.store import Ledger
from composespawner.ledger.submissions import Standing, Submission, standings

__all__ = [
    "HOLDABLE_KINDS",
    "HOLDING",
    "LIVE",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "Actor",
    "AppendOnlyViolation",
    "AuditEntry",
    "DeviceRecord",
    "DevicesTaken",
    "GiveBack",
    "HoldableKind",
    "Holding",
    "Holds",
    "HostFull",
    "HostRecord",
    "IllegalTransition",
    "KeepFree",
    "Ledger",
    "LedgerError",
    "LedgerRunner",
    "Machine",
    "MachineEvent",
    "MachineState",
    "NotOwner",
    "NotRunning",
    "Policy",
    "QuotaExceeded",
    "Reclaims",
    "ReservedForCohort",
    "RoomClaim",
    "RunManifest",
    "SchemaNotCurrent",
    "ServerBusy",
    "ServerUse",
    "ShareClaim",
    "SharesDoNotGrow",
    "SpawnPolicy",
    "Standing",
    "Submission",
    "UnknownDevices",
    "UnknownMachine",
    "UsageRecord",
    "can_transition",
    "check_transition",
    "is_terminal",
    "server_label",
    "standings",
    "utcnow",
]
