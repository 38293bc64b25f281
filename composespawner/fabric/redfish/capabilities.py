"""What a Redfish service says of how it composes (pure, no I/O).

POST of systems (said on the Systems collection, or by older services on each
zone), the Compose action (if its ActionInfo lets it apply manifests), and
what a Compose action's answer names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from composespawner.fabric.redfish.mapping import (
    Document,
    dig,
    id_from_uri,
    is_type,
    link_uris,
    uri_of,
)


def creates_systems(systems: Document) -> bool:
    """Whether a Systems collection says it takes POST of composed systems."""
    capabilities = dig(systems, "@Redfish.CollectionCapabilities", "Capabilities")
    if not isinstance(capabilities, list):
        return False
    return any(dig(c, "UseCase") == "ComputerSystemComposition" for c in capabilities)


def zone_capabilities_uris(zones: Iterable[Document]) -> list[str]:
    """Capabilities objects that older services link from each zone, once each."""
    uris = (uri for zone in zones for uri in link_uris(dig(zone, "Links", "CapabilitiesObjects")))
    return list(dict.fromkeys(uris))


def zones_create_systems(zones: Iterable[Document], capabilities: Mapping[str, Document]) -> bool:
    """Whether resource zones say their blocks compose by POST of whole systems.

    Older services say so on each zone rather than on the Systems collection:
    with ``Links.CapabilitiesObjects`` naming the Systems collection's
    Capabilities object (``capabilities``: those read, by URI), a template of
    a ComputerSystem to create; or with the collection's own annotation,
    ``@Redfish.CollectionCapabilities``, put on the zone.
    """
    zones = list(zones)
    linked = [capabilities[uri] for uri in zone_capabilities_uris(zones) if uri in capabilities]
    return any(creates_systems(zone) for zone in zones) or any(
        is_type(c, "ComputerSystem") or creates_systems(c) for c in linked
    )


def action_allows(info: Document, parameter: str, value: str) -> bool:
    """Whether an ActionInfo lets ``parameter`` take ``value`` (unlisted: the schema's own)."""
    parameters = info.get("Parameters")
    for entry in parameters if isinstance(parameters, list) else []:
        if dig(entry, "Name") == parameter:
            allowed = dig(entry, "AllowableValues")
            return not isinstance(allowed, list) or value in allowed
    return True


def composed_system_id(answer: Document) -> str | None:
    """The system a Compose action's answer names in its ComposeSystem stanza."""
    stanzas = dig(answer, "Manifest", "Stanzas")
    for stanza in stanzas if isinstance(stanzas, list) else []:
        uri = uri_of(dig(stanza, "Response"))
        if dig(stanza, "StanzaType") == "ComposeSystem" and uri:
            return id_from_uri(uri)
    return None
