"""Discovery over HTTP: the resources the Redfish client reads, and their shapes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from .harness import BLOCKS, SYSTEMS, RedfishClient, shared_dir

EDMX = "{http://docs.oasis-open.org/odata/ns/edmx}"


def test_versions_document_and_service_root_need_no_login(client: RedfishClient) -> None:
    assert client.get("/redfish", auth=False).json == {"v1": "/redfish/v1/"}
    for path in ("/redfish/v1/", "/redfish/v1"):
        root = client.get(path, auth=False)
        assert root.status == 200
        assert root.headers["OData-Version"] == "4.0"
    service = root.json
    assert service["CompositionService"] == {"@odata.id": "/redfish/v1/CompositionService"}
    assert service["Systems"] == {"@odata.id": SYSTEMS}
    assert service["Links"]["Sessions"] == {"@odata.id": "/redfish/v1/SessionService/Sessions"}
    assert service["UUID"] == "3f0f7c5e-5d3a-4c6e-9b1e-2c1a9d6f0a01"
    expand = service["ProtocolFeaturesSupported"]["ExpandQuery"]
    assert (expand["NoLinks"], expand["MaxLevels"]) == (True, 3)


def test_metadata_references_schemas_that_exist(client: RedfishClient) -> None:
    answer = client.get("/redfish/v1/$metadata", auth=False)
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("application/xml")
    references = [r.attrib["Uri"] for r in ET.fromstring(answer.body).iter(f"{EDMX}Reference")]
    csdl = shared_dir() / "redfish" / "csdl"
    dmtf = [uri for uri in references if uri.startswith("http://redfish.dmtf.org/")]
    assert len(dmtf) > 15
    assert all((csdl / uri.rsplit("/", 1)[-1]).is_file() for uri in dmtf)
    local = [uri for uri in references if uri.startswith("/")]
    assert local == ["/redfish/v1/Schemas/ComposeSpawner_v1.xml"]
    oem_schema = client.get(local[0], auth=False)
    assert oem_schema.status == 200
    assert ET.fromstring(oem_schema.body).tag == f"{EDMX}Edmx"


def test_odata_service_document_is_open(client: RedfishClient) -> None:
    document = client.get("/redfish/v1/odata", auth=False).json
    assert {"name": "Service", "kind": "Singleton", "url": "/redfish/v1/"} in document["value"]


def test_resource_blocks_list_every_device_and_host(client: RedfishClient) -> None:
    collection = client.get(BLOCKS).json
    members = [m["@odata.id"].rsplit("/", 1)[-1] for m in collection["Members"]]
    assert collection["Members@odata.count"] == len(members) == 8 + 50
    assert {"host-01-block", "host-08-block", "r1-a100-1", "x1-rtx6000-2"} <= set(members)


def test_expand_inlines_blocks_and_systems_in_one_request(client: RedfishClient) -> None:
    blocks = client.get(f"{BLOCKS}?$expand=.($levels=1)").json["Members"]
    assert len(blocks) == 58
    assert all("ResourceBlockType" in block for block in blocks)
    systems = client.get(f"{SYSTEMS}?$expand=.").json["Members"]
    assert [s["Id"] for s in systems] == [f"host-0{n}" for n in range(1, 9)]


def test_two_levels_bring_each_device_with_its_parts(client: RedfishClient) -> None:
    shallow = client.get(f"{BLOCKS}?$expand=.($levels=1)").json["Members"]
    deep = client.get(f"{BLOCKS}?$expand=.($levels=2)").json["Members"]
    gpu = next(b for b in deep if b["Id"] == "r1-a100-1")
    (processor,) = gpu["Processors"]
    assert processor == client.get(processor["@odata.id"]).json
    assert processor["ProcessorType"] == "GPU"
    assert next(b for b in shallow if b["Id"] == "r1-a100-1")["Processors"] == [
        {"@odata.id": processor["@odata.id"]}
    ]
    # Links are not subordinate: they stay references at any depth.
    assert all(set(z) == {"@odata.id"} for z in gpu["Links"]["Zones"])


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("$expand=*", 400, "QueryParameterValueFormatError"),
        ("$expand=.($levels=4)", 400, "QueryParameterValueFormatError"),
        ("$expand=.($levels=0)", 400, "QueryParameterValueFormatError"),
        ("$top=2", 501, "QueryParameterUnsupported"),
    ],
)
def test_unsupported_queries_are_refused(
    client: RedfishClient, query: str, status: int, message: str
) -> None:
    answer = client.get(f"{BLOCKS}?{query}")
    assert answer.status == status
    assert answer.message_ids == [f"Base.1.22.1.{message}"]


def test_expanding_the_service_root_needs_a_login(client: RedfishClient) -> None:
    assert client.get("/redfish/v1/?$expand=.", auth=False).status == 401
    expanded = client.get("/redfish/v1/?$expand=.").json
    assert expanded["Systems"]["Members@odata.count"] == 8


def test_gpu_block(client: RedfishClient) -> None:
    answer = client.get(f"{BLOCKS}/r1-a100-1")
    block = answer.json
    assert answer.headers["ETag"] == block["@odata.etag"]
    assert block["ResourceBlockType"] == ["Processor"]
    assert block["Status"] == {"State": "Enabled", "Health": "OK"}
    assert block["CompositionStatus"] == {
        "CompositionState": "Unused",
        "Reserved": False,
        "SharingCapable": False,
        "MaxCompositions": 1,
        "NumberOfCompositions": 0,
    }
    assert block["Links"] == {
        "Chassis": [{"@odata.id": "/redfish/v1/Chassis/rack-1"}],
        "Zones": [{"@odata.id": "/redfish/v1/CompositionService/ResourceZones/rack-1"}],
        "ComputerSystems": [],
    }
    gpu_uri = block["Processors"][0]["@odata.id"]
    assert gpu_uri == f"{BLOCKS}/r1-a100-1/Processors/GPU0"
    gpu = client.get(gpu_uri).json
    assert gpu["ProcessorType"] == "GPU"
    assert (gpu["Manufacturer"], gpu["Model"]) == ("NVIDIA", "NVIDIA A100 80GB PCIe")
    assert gpu["MemorySummary"]["TotalMemorySizeMiB"] == 80 * 1024


def test_nic_block(client: RedfishClient) -> None:
    block = client.get(f"{BLOCKS}/r1-nic100-1").json
    assert block["ResourceBlockType"] == ["Network"]
    port = client.get(block["EthernetInterfaces"][0]["@odata.id"]).json
    assert port["@odata.id"].endswith("/r1-nic100-1/EthernetInterfaces/Port0")
    assert port["SpeedMbps"] == 100_000
    assert port["Description"] == "ConnectX-6 Dx 100GbE"


def test_nvme_block(client: RedfishClient) -> None:
    block = client.get(f"{BLOCKS}/r2-nvme-6").json
    assert block["ResourceBlockType"] == ["Storage"]
    drive = client.get(block["Drives"][0]["@odata.id"]).json
    assert drive["@odata.id"].endswith("/r2-nvme-6/Drives/Drive0")
    assert drive["CapacityBytes"] == 1920 * 10**9
    assert (drive["Protocol"], drive["MediaType"]) == ("NVMe", "SSD")
    assert (drive["Manufacturer"], drive["Model"]) == ("Samsung", "PM1733 1.92TB")


def test_host_block_and_system(client: RedfishClient) -> None:
    block = client.get(f"{BLOCKS}/host-05-block").json
    assert block["ResourceBlockType"] == ["ComputerSystem"]
    assert block["ComputerSystems"] == [{"@odata.id": f"{SYSTEMS}/host-05"}]
    answer = client.get(f"{SYSTEMS}/host-05")
    system = answer.json
    assert answer.headers["ETag"] == system["@odata.etag"]
    assert system["SystemType"] == "Physical"
    assert system["Composition"] == {"UseCases": ["ExpandableSystem"]}
    assert (system["ProcessorSummary"]["Count"], system["ProcessorSummary"]["CoreCount"]) == (2, 64)
    assert system["MemorySummary"]["TotalSystemMemoryGiB"] == 512
    assert system["Links"]["ResourceBlocks"] == [{"@odata.id": f"{BLOCKS}/host-05-block"}]
    assert system["Links"]["Chassis"] == [{"@odata.id": "/redfish/v1/Chassis/rack-2"}]
    add = system["Actions"]["#ComputerSystem.AddResourceBlock"]["target"]
    assert add == f"{SYSTEMS}/host-05/Actions/ComputerSystem.AddResourceBlock"
    assert "#ComputerSystem.RemoveResourceBlock" in system["Actions"]
    assert system["Oem"] == {}


def test_zones_hold_their_rack_and_the_shared_chassis(client: RedfishClient) -> None:
    zone = client.get("/redfish/v1/CompositionService/ResourceZones/rack-1").json
    assert zone["ZoneType"] == "ZoneOfResourceBlocks"
    blocks = {link["@odata.id"].rsplit("/", 1)[-1] for link in zone["Links"]["ResourceBlocks"]}
    assert {"host-01-block", "r1-a100-1", "x1-rtx6000-1"} <= blocks
    assert not any(block.startswith(("r2-", "host-05")) for block in blocks)
    composition = client.get("/redfish/v1/CompositionService").json
    assert composition["AllowOverprovisioning"] is False
    assert composition["ServiceEnabled"] is True


def test_chassis(client: RedfishClient) -> None:
    rack = client.get("/redfish/v1/Chassis/rack-1").json
    assert rack["ChassisType"] == "Rack"
    assert len(rack["Links"]["ComputerSystems"]) == 4
    expansion = client.get("/redfish/v1/Chassis/expansion-1").json
    assert expansion["ChassisType"] == "Expansion"
    assert [b["@odata.id"].rsplit("/", 1)[-1] for b in expansion["Links"]["ResourceBlocks"]] == [
        "x1-rtx6000-1",
        "x1-rtx6000-2",
    ]


def test_unknown_uri_is_404(client: RedfishClient) -> None:
    for path in (
        f"{BLOCKS}/no-such-block",
        "/redfish/v1/Nothing",
        f"{BLOCKS}/r1-nic25-1/Drives/Drive0",
    ):
        answer = client.get(path)
        assert answer.status == 404
        assert answer.message_ids == ["Base.1.22.1.ResourceMissingAtURI"]


def test_wrong_method_is_405_with_allow(client: RedfishClient) -> None:
    answer = client.delete(f"{BLOCKS}/r1-a100-1")
    assert answer.status == 405
    assert answer.headers["Allow"] == "GET, HEAD"
    assert answer.message_ids == ["Base.1.22.1.OperationNotAllowed"]
    assert client.post(BLOCKS, {}).status == 405
    assert client.delete(f"{SYSTEMS}/host-01").headers["Allow"] == "GET, HEAD, PATCH"


def test_head_answers_without_a_body(client: RedfishClient) -> None:
    answer = client.request("HEAD", f"{SYSTEMS}/host-01")
    assert answer.status == 200
    assert answer.body == b""
    assert answer.headers["ETag"]
