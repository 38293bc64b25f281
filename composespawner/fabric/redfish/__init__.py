"""The async Redfish client: the Fabric protocol over DMTF Redfish.

Shape, from the wire up (data flows one way; only ``fabric`` and the parts it
hands work to, ``tasks`` to ``composition``, do I/O on purpose, through ``transport``)::

    transport.py   RedfishTransport: aiohttp with kept-alive connections, sessions
                   (X-Auth-Token; HTTP Basic where the service has none), per-request timeouts,
                   retries with jittered backoff, the per-operation Deadline.
                   RedfishTimeouts / RedfishRetry: the knobs.
    errors.py      pure: Redfish error bodies (MessageIds) and statuses → base.py errors.
    mapping.py     pure: Redfish documents → Inventory / Device / Host / HostMark.
    capabilities.py pure: how a service says it composes (POST, the Compose action).
    tasks.py       a write's final answer, at once or through a 202 task monitor.
    discovery.py   Discovery: the service map, the inventory (with $expand where
                   offered), systems and their latest answers (reads only).
    expandable.py  ExpandableSystems: attach/detach through the host's
                   AddResourceBlock/RemoveResourceBlock actions with ETags; machines
                   join and leave a shared host's mark, Oem.ComposeSpawner.
    composition.py WholeSystems: compose/decompose where the service creates systems
                   (POST to Systems, or the CompositionService.Compose action); machines
                   share a composed system by PATCH of its blocks and mark where allowed.
    fabric.py      RedfishFabric: the Fabric protocol, each operation under its
                   deadline, handed to the three above.

Usage::

    fabric = RedfishFabric("https://fabric-manager:443", username="hub", password=secret,
                           ca_bundle="/etc/ssl/site-ca.pem", timeouts=RedfishTimeouts(operation=30))
    inventory = await fabric.inventory()
    await fabric.attach("host-01", "r1-a100-1")
    await fabric.close()

Errors: only the ``base.py`` tree escapes. ``FabricRefused`` and its subclasses mean
the service answered no (nothing changed by that call); ``FabricUnreachable`` (and
``FabricDeadlineExceeded``) mean we do not know what happened (so does
``FabricCertificateError``, raised at once when the service's certificate is not
trusted); ``FabricTaskFailed`` means an asynchronous task of the service ended in
failure. 5xx answers are retried a few times and then surface as ``FabricRefused``:
the service answered, and the caller decides whether to try again later.
"""

from composespawner.fabric.redfish.discovery import ServiceMap
from composespawner.fabric.redfish.fabric import RedfishFabric
from composespawner.fabric.redfish.transport import Deadline, RedfishRetry, RedfishTimeouts

__all__ = ["Deadline", "RedfishFabric", "RedfishRetry", "RedfishTimeouts", "ServiceMap"]
