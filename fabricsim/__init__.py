"""A simulated composable fabric that speaks Redfish.

A real Redfish service on 127.0.0.1 (not a stub) for tests and the embedded
demo: its hardware comes from an inventory TOML file, and it composes in one
of three modes (``--composition``): devices attached to standing hosts with
``ComputerSystem.AddResourceBlock`` / ``RemoveResourceBlock`` (expandable),
whole systems created by ``POST`` to Systems (specific) or by the
``CompositionService.Compose`` action (action) and taken apart by ``DELETE``.
A second claim of a used block is refused, ETags change on every write, sessions
and asynchronous tasks work, and test-only fault switches make it slow, flaky
or unreachable. DMTF's ``rf_service_validator`` finds no failures in it.

It stands in for a fabric manager the client has never met, so it shares no
code with the client: it imports nothing from ``composespawner`` (a test
checks), and keeps its own copy of what both sides agree on by wire format.

Modules, from the inside out:

``wire``         the OEM key and the composition tag's shape
``inventory``    the hardware list (TOML -> frozen specs)
``uris``         every Redfish path the service answers
``errors``       every refusal, with its HTTP status and registry message
``state``        the fabric's state and its rules (pure; no tornado, no I/O), with
                 ``hosts`` (standing hosts, expandable mode) and ``composed``
                 (composed systems, specific and action modes)
``commands``     request bodies parsed into commands on the state
``resources``    Redfish representations
``expand``       ``$expand=.($levels=N)``
``metadata``     ``$metadata`` and our OEM schema
``sessions``, ``tasks``, ``faults``   login sessions, task monitors, fault switches
``quirks``       switches that answer like an older or looser service
``persistence``  the ``--state-file``
``simulator``    the running service: state, sessions, tasks, faults, saving
``handlers``     the tornado request handlers, by resource
``app``          the tornado application: the routes
``__main__``     the command line

The tests' ``tests.support.inprocess.InProcessFabric`` drives the same state
model without HTTP, for unit tests.
"""

# Only the pure modules here: the in-process fake needs no tornado.
from .inventory import InventoryError, InventorySpec, load_inventory, parse_inventory
from .state import FabricState

__all__ = [
    "FabricState",
    "InventoryError",
    "InventorySpec",
    "load_inventory",
    "parse_inventory",
]
