"""The async Redfish client: the Fabric protocol over DMTF Redfish.

Shape, from the wire up (data flows one way; only ``client`` does I/O on
purpose, through ``transport``)::

    transport.py   RedfishTransport: aiohttp with kept-alive connections, sessions
                   (X-Auth-Token; HTTP Basic where the service has none), per-request timeouts,
                   retries with jittered backoff, the per-operation Deadline.
                   RedfishTimeouts / RedfishRetry: the knobs.
    errors.py      pure: Redfish error bodies (MessageIds) and statuses → base.py errors.
    mapping.py     pure: Redfish documents → Inventory / Device / Host / CompositionTag.
    client.py      RedfishFabric: discovery (with $expand where offered), attach/detach
                   through the host's AddResourceBlock/RemoveResourceBlock actions with
                   ETags and task monitors, tag_host through Oem.ComposeSpawner.

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

from composespawner.fabric.redfish.client import RedfishFabric, ServiceMap
from composespawner.fabric.redfish.transport import Deadline, RedfishRetry, RedfishTimeouts

__all__ = ["Deadline", "RedfishFabric", "RedfishRetry", "RedfishTimeouts", "ServiceMap"]
