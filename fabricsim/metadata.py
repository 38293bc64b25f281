"""The service's CSDL documents: ``$metadata`` and our one OEM schema (pure).

``$metadata`` references every DMTF schema the service's resources use (the
versions in :mod:`.resources`), plus ``ComposeSpawner_v1.xml``: the schema of
the ``Oem.ComposeSpawner`` mark on ComputerSystems, served by the simulator
itself at :data:`uris.OEM_SCHEMA`, so a validator can check the OEM object
like any other (the Redfish specification wants OEM objects typed by
``@odata.type`` and described by a published schema). It has both versions of
the mark (see :mod:`.wire`): v1_0_0's ``ComposeSpawner`` for one machine, and
v1_1_0's ``Mark`` with a list of ``MachineRef`` for a host that machines share.
A new type rather than a v1_1_0 ``ComposeSpawner`` derived from v1_0_0's:
derivation would carry v1_0_0's ``Machine`` and ``Owner`` into the shared
shape, where they mean nothing.
"""

from __future__ import annotations

from . import uris

DMTF_SCHEMAS = "http://redfish.dmtf.org/schemas/v1"
OEM_NAMESPACES = ("ComposeSpawner", "ComposeSpawner.v1_0_0", "ComposeSpawner.v1_1_0")

# Schema file -> namespaces the service uses from it.
REFERENCES: dict[str, tuple[str, ...]] = {
    "ServiceRoot": ("ServiceRoot", "ServiceRoot.v1_20_0"),
    "CompositionService": ("CompositionService", "CompositionService.v1_2_3"),
    "ResourceBlock": ("ResourceBlock", "ResourceBlock.v1_4_3"),
    "ResourceBlockCollection": ("ResourceBlockCollection",),
    "Zone": ("Zone", "Zone.v1_6_3"),
    "ZoneCollection": ("ZoneCollection",),
    "ComputerSystem": ("ComputerSystem", "ComputerSystem.v1_27_0"),
    "ComputerSystemCollection": ("ComputerSystemCollection",),
    "Chassis": ("Chassis", "Chassis.v1_28_0"),
    "ChassisCollection": ("ChassisCollection",),
    "Processor": ("Processor", "Processor.v1_22_0"),
    "Drive": ("Drive", "Drive.v1_22_0"),
    "EthernetInterface": ("EthernetInterface", "EthernetInterface.v1_12_4"),
    "SessionService": ("SessionService", "SessionService.v1_2_0"),
    "Session": ("Session", "Session.v1_8_0"),
    "SessionCollection": ("SessionCollection",),
    "TaskService": ("TaskService", "TaskService.v1_3_0"),
    "Task": ("Task", "Task.v1_7_4"),
    "TaskCollection": ("TaskCollection",),
    "Message": ("Message", "Message.v1_3_0"),
    "Resource": ("Resource", "Resource.v1_0_0"),
    "ActionInfo": ("ActionInfo", "ActionInfo.v1_4_2"),
    "CollectionCapabilities": ("CollectionCapabilities", "CollectionCapabilities.v1_4_1"),
}


def json_schema_uri(odata_type: str) -> str | None:
    """The published JSON Schema of a resource type, for ``Link: <...>; rel=describedby``.

    ``#ComputerSystem.v1_27_0.ComputerSystem`` is described by
    ``ComputerSystem.v1_27_0.json``, the unversioned
    ``#ComputerSystemCollection.ComputerSystemCollection`` by
    ``ComputerSystemCollection.json``: the Link names the very version the
    resource claims. None for anything that is not such a type.
    """
    parts = odata_type.removeprefix("#").split(".")
    if not odata_type.startswith("#") or len(parts) not in (2, 3) or not all(parts):
        return None
    return f"{DMTF_SCHEMAS}/{'.'.join(parts[:-1])}.json"


def metadata_document() -> str:
    """The ``/redfish/v1/$metadata`` CSDL document."""
    references = [
        _reference(f"{DMTF_SCHEMAS}/{name}_v1.xml", ns) for name, ns in REFERENCES.items()
    ]
    references.append(_reference(uris.OEM_SCHEMA, OEM_NAMESPACES))
    references.append(
        f'  <edmx:Reference Uri="{DMTF_SCHEMAS}/RedfishExtensions_v1.xml">\n'
        '    <edmx:Include Namespace="RedfishExtensions.v1_0_0" Alias="Redfish"/>\n'
        "  </edmx:Reference>"
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">\n'
        + "\n".join(references)
        + "\n  <edmx:DataServices>\n"
        '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">\n'
        '      <EntityContainer Name="Service" Extends="ServiceRoot.v1_20_0.ServiceContainer"/>\n'
        "    </Schema>\n"
        "  </edmx:DataServices>\n"
        "</edmx:Edmx>\n"
    )


def _reference(uri: str, namespaces: tuple[str, ...]) -> str:
    includes = "".join(f'\n    <edmx:Include Namespace="{ns}"/>' for ns in namespaces)
    return f'  <edmx:Reference Uri="{uri}">{includes}\n  </edmx:Reference>'


OEM_SCHEMA_DOCUMENT = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- ComposeSpawner OEM extension: the mark on a ComputerSystem composed by a hub. -->
<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">
  <edmx:Reference Uri="http://docs.oasis-open.org/odata/odata/v4.0/errata03/csd01/complete/vocabularies/Org.OData.Core.V1.xml">
    <edmx:Include Namespace="Org.OData.Core.V1" Alias="OData"/>
  </edmx:Reference>
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/RedfishExtensions_v1.xml">
    <edmx:Include Namespace="RedfishExtensions.v1_0_0" Alias="Redfish"/>
  </edmx:Reference>
  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/Resource_v1.xml">
    <edmx:Include Namespace="Resource"/>
    <edmx:Include Namespace="Resource.v1_0_0"/>
  </edmx:Reference>

  <edmx:DataServices>
    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="ComposeSpawner">
      <Annotation Term="Redfish.OwningEntity" String="composespawner"/>
    </Schema>

    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="ComposeSpawner.v1_0_0">
      <Annotation Term="Redfish.OwningEntity" String="composespawner"/>
      <Annotation Term="Redfish.Release" String="1.0"/>
      <ComplexType Name="ComposeSpawner" BaseType="Resource.OemObject">
        <Annotation Term="OData.AdditionalProperties" Bool="false"/>
        <Annotation Term="OData.Description" String="Marks a system as composed by a JupyterHub running composespawner."/>
        <Annotation Term="OData.LongDescription" String="This object shall identify the hub and the machine a system was composed for, so the hub's reconciler can tell its own compositions from anyone else's."/>
        <Property Name="Hub" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The identity of the hub that composed this system."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the identity of the hub that composed this system."/>
        </Property>
        <Property Name="Machine" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The hub's identifier of the composed machine."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the identifier the hub's ledger uses for this composed machine."/>
        </Property>
        <Property Name="Owner" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The user and server the machine belongs to."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the user and server name, as user/server, that the machine was composed for."/>
        </Property>
      </ComplexType>
    </Schema>

    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="ComposeSpawner.v1_1_0">
      <Annotation Term="Redfish.OwningEntity" String="composespawner"/>
      <Annotation Term="Redfish.Release" String="1.1"/>
      <ComplexType Name="Mark" BaseType="Resource.OemObject">
        <Annotation Term="OData.AdditionalProperties" Bool="false"/>
        <Annotation Term="OData.Description" String="Marks a system as composed by a JupyterHub running composespawner, for the machines that share it."/>
        <Annotation Term="OData.LongDescription" String="This object shall identify the hub that composed a system and every machine of that hub that holds part of it, so the hub's reconciler can tell its own compositions from anyone else's on a host that several machines share."/>
        <Property Name="Hub" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The identity of the hub that composed this system."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the identity of the hub that composed this system."/>
        </Property>
        <Property Name="Machines" Type="Collection(ComposeSpawner.v1_1_0.MachineRef)" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The hub's machines that share this system."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain one entry for each of the hub's machines that holds a share of this system, and at least one; a system that no machine holds shall carry no mark."/>
        </Property>
      </ComplexType>
      <ComplexType Name="MachineRef">
        <Annotation Term="OData.AdditionalProperties" Bool="false"/>
        <Annotation Term="OData.Description" String="One machine that holds a share of a system."/>
        <Annotation Term="OData.LongDescription" String="This type shall identify one machine of the hub that holds a share of a system, and whom it belongs to."/>
        <Property Name="Machine" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The hub's identifier of the machine."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the identifier the hub's ledger uses for this machine."/>
        </Property>
        <Property Name="Owner" Type="Edm.String" Nullable="false">
          <Annotation Term="OData.Permissions" EnumMember="OData.Permission/ReadWrite"/>
          <Annotation Term="OData.Description" String="The user and server the machine belongs to."/>
          <Annotation Term="OData.LongDescription" String="This property shall contain the user and server name, as user/server, that the machine belongs to."/>
        </Property>
      </ComplexType>
    </Schema>
  </edmx:DataServices>
</edmx:Edmx>
"""  # noqa: E501
