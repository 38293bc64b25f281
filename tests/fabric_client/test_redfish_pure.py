"""The client's pure parts: error mapping, retry arithmetic, document mapping."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from composespawner.domain.hardware import CompositionTag, Host, HostMark
from composespawner.fabric.base import (
    DeviceInUse,
    DeviceNotFound,
    FabricAuthError,
    FabricRefused,
    IncompatibleZone,
    NoResourceMatch,
    StaleETag,
)
from composespawner.fabric.redfish import RedfishRetry
from composespawner.fabric.redfish.capabilities import zones_create_systems
from composespawner.fabric.redfish.errors import (
    BODY_EXCERPT_CHARS,
    parse_body,
    refusal,
    short_message_id,
)
from composespawner.fabric.redfish.mapping import (
    blocks_writable,
    build_inventory,
    deep_expand_query,
    device_from_block,
    device_state,
    expand_query,
    expand_subordinates,
    gpu_memory_gib,
    host_cores,
    host_from_system,
    host_mark,
    inline_parts,
    mark_object,
    nvme_drives,
)
from composespawner.fabric.redfish.transport import (
    backoff_delay,
    local_path,
    origin_of,
    retry_after_seconds,
)


def error(*message_ids: str) -> dict[str, Any]:
    infos = [{"MessageId": m, "Message": f"said {m}"} for m in message_ids]
    return {"error": {"code": "Base.1.22.1.GeneralError", "@Message.ExtendedInfo": infos}}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (409, error("Composition.1.1.3.ResourceBlockInUse"), DeviceInUse),
        (400, error("Composition.1.1.3.ResourceBlockNotFound"), DeviceNotFound),
        (400, error("Composition.1.1.3.IncompatibleZone"), IncompatibleZone),
        (400, error("Composition.1.1.3.NoResourceMatch"), NoResourceMatch),
        (400, error("Composition.1.0.0.SpecifiedResourceAlreadyReserved"), DeviceInUse),
        (412, error("Base.1.22.1.PreconditionFailed"), StaleETag),
        (428, error("Base.1.8.1.PreconditionRequired"), StaleETag),
        (412, None, StaleETag),
        (404, None, DeviceNotFound),
        (401, None, FabricAuthError),
        (403, error("Base.1.22.1.InsufficientPrivilege"), FabricAuthError),
        (400, error("Base.1.22.1.PropertyValueNotInList"), FabricRefused),
        (503, error("Base.1.22.1.ServiceTemporarilyUnavailable"), FabricRefused),
        (500, b"not json", FabricRefused),
        # A vendor copy of the registry under its own prefix still matches.
        (400, error("ContosoComposition.2.0.IncompatibleZone"), IncompatibleZone),
    ],
)
def test_refusal_mapping(status: int, body: Any, expected: type[FabricRefused]) -> None:
    mapped = refusal(status, body, "POST /x")
    assert type(mapped) is expected
    assert mapped.status == status
    assert str(mapped).startswith(f"POST /x: HTTP {status}")


def test_refusal_keeps_message_ids_and_text() -> None:
    mapped = refusal(400, error("Base.1.22.1.Foo", "Composition.1.1.3.IncompatibleZone"), "op")
    assert mapped.message_ids == ("Base.1.22.1.Foo", "Composition.1.1.3.IncompatibleZone")
    assert "said Composition.1.1.3.IncompatibleZone" in str(mapped)
    assert isinstance(mapped, IncompatibleZone)


ZONE_ERROR = "The requested resource blocks span multiple resource zones."
ERROR_PAGE = f"""<!DOCTYPE html>
<html><head><title>400 Bad Request</title>
<style>body {{ font-family: sans-serif; }} h1 {{ color: #333; }}</style></head>
<body><h1>400 Bad Request</h1>
<p>{ZONE_ERROR}</p>
<hr><address>a &amp; b proxy</address></body></html>
"""


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (f"400 Bad Request: {ZONE_ERROR}\n".encode(), f"400 Bad Request: {ZONE_ERROR}"),
        (
            ERROR_PAGE.encode(),
            f"400 Bad Request {ZONE_ERROR} a & b proxy",
        ),
        (
            f'{{"title": "Bad Request", "status": 400, "detail": "{ZONE_ERROR}"}}'.encode(),
            f'{{"title": "Bad Request", "status": 400, "detail": "{ZONE_ERROR}"}}',
        ),
        (b'{"error": {}}', '{"error": {}}'),  # a Redfish error without a word in it
    ],
    ids=["text", "html", "json", "empty-redfish-error"],
)
def test_an_error_body_that_is_no_redfish_error_is_shown(body: bytes, shown: str) -> None:
    mapped = refusal(400, parse_body(body), "POST /x", body)
    assert str(mapped) == f"POST /x: HTTP 400: {shown}"
    assert type(mapped) is FabricRefused


def test_a_long_error_body_is_cut_short() -> None:
    body = b"<html><body>" + b"proxy says no; " * 1000 + b"</body></html>"
    message = str(refusal(502, None, "GET /x", body))
    detail = message.removeprefix("GET /x: HTTP 502: ")
    assert detail.startswith("proxy says no; proxy says no;")
    assert detail.endswith("\u2026")
    assert len(detail) == BODY_EXCERPT_CHARS


def test_an_error_without_a_body_has_no_details() -> None:
    assert str(refusal(500, None, "GET /x", b"")) == "GET /x: HTTP 500: no details"


def test_short_message_id() -> None:
    assert short_message_id("Composition.1.1.3.IncompatibleZone") == "IncompatibleZone"
    assert short_message_id("IncompatibleZone") == "IncompatibleZone"


def test_retry_after() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Wed, 01 Jan 2025 12:00:10 GMT", now) == 10.0
    assert retry_after_seconds("Wed, 01 Jan 2025 11:00:00 GMT", now) == 0.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    retry = RedfishRetry(backoff_first=0.2, backoff_max=1.0)
    rng = random.Random(7)
    first = [backoff_delay(1, retry, rng) for _ in range(50)]
    late = [backoff_delay(6, retry, rng) for _ in range(50)]
    assert all(0.1 <= d <= 0.2 for d in first)
    assert all(0.5 <= d <= 1.0 for d in late)
    assert len(set(first)) > 1  # jittered


def test_links_stay_on_the_configured_service() -> None:
    assert local_path("https://evil.example/redfish/v1/Tasks/1?x=1") == "/redfish/v1/Tasks/1?x=1"
    assert origin_of("https://fm.example:8443/redfish/v1/") == "https://fm.example:8443"
    with pytest.raises(ValueError, match="http"):
        origin_of("fm.example")


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (
            {"ExpandQuery": {"NoLinks": True, "Levels": True, "MaxLevels": 6}},
            "$expand=.($levels=1)",
        ),
        ({"ExpandQuery": {"NoLinks": True, "Levels": False}}, "$expand=."),
        ({"ExpandQuery": {"ExpandAll": True, "Levels": True}}, "$expand=*($levels=1)"),
        ({"ExpandQuery": {"Links": True}}, None),
        ({"ExpandQuery": False}, None),
        ({}, None),
    ],
)
def test_expand_query(features: dict[str, Any], expected: str | None) -> None:
    assert expand_query({"ProtocolFeaturesSupported": features}) == expected


@pytest.mark.parametrize(
    ("expand", "expected"),
    [
        ({"NoLinks": True, "Levels": True, "MaxLevels": 6}, "$expand=.($levels=3)"),
        ({"NoLinks": True, "Levels": True, "MaxLevels": 2}, "$expand=.($levels=2)"),
        ({"ExpandAll": True, "Levels": True, "MaxLevels": 3}, None),  # * follows Links too
        ({"NoLinks": True, "Levels": True, "MaxLevels": 1}, None),
        ({"NoLinks": True, "Levels": True}, None),  # MaxLevels unsaid: 1
        ({"NoLinks": True, "Levels": False, "MaxLevels": 6}, None),  # no ($levels=N) at all
    ],
)
def test_deep_expand_query(expand: dict[str, Any], expected: str | None) -> None:
    root = {"ProtocolFeaturesSupported": {"ExpandQuery": expand}}
    assert deep_expand_query(root) == expected


RESOURCES: dict[str, dict[str, Any]] = {
    "/c": {"@odata.id": "/c", "Members": [{"@odata.id": "/c/b"}, {"@odata.id": "/c/gone"}]},
    "/c/b": {
        "@odata.id": "/c/b",
        "Storage": [{"@odata.id": "/c/b/s"}],
        "Links": {"Zones": [{"@odata.id": "/z"}]},
        "Status": {"Health": "OK", "Sensor": {"@odata.id": "/c/b/t"}},
    },
    "/c/b/s": {"@odata.id": "/c/b/s", "Drives": [{"@odata.id": "/c/b/s/d"}]},
    "/c/b/s/d": {"@odata.id": "/c/b/s/d", "CapacityBytes": 1},
    "/c/b/t": {"@odata.id": "/c/b/t", "Reading": 40},
    "/z": {"@odata.id": "/z"},
}


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_expand_subordinates_goes_levels_deep_and_leaves_links(levels: int) -> None:
    expanded = expand_subordinates(RESOURCES["/c"], RESOURCES.get, levels)
    member, missing = expanded["Members"]
    assert missing == {"@odata.id": "/c/gone"}  # not found: stays a reference
    assert member["Links"] == {"Zones": [{"@odata.id": "/z"}]}
    storage = member["Storage"][0]
    sensor = member["Status"]["Sensor"]  # inside an embedded object: still subordinate
    if levels == 1:
        assert (storage, sensor) == ({"@odata.id": "/c/b/s"}, {"@odata.id": "/c/b/t"})
    else:
        assert sensor == RESOURCES["/c/b/t"]
        drive = RESOURCES["/c/b/s/d"] if levels == 3 else {"@odata.id": "/c/b/s/d"}
        assert storage == {"@odata.id": "/c/b/s", "Drives": [drive]}


def test_inline_parts_are_device_parts_and_compute_blocks_cpus_and_dimms() -> None:
    gpu = {"@odata.id": "/b/g/Processors/0/", "ProcessorType": "GPU"}
    drive = {"@odata.id": "/b/n/Drives/0", "Protocol": "NVMe"}
    storage = {"@odata.id": "/b/n/Storage/0", "Drives": [drive, {"@odata.id": "/b/n/Drives/1"}]}
    cpu = {"@odata.id": "/b/c/P/0", "TotalCores": 8}
    dimm = {"@odata.id": "/b/c/M/0", "CapacityMiB": 8192}
    blocks = [
        block(Processors=[gpu]),
        block(Storage=[storage], EthernetInterfaces=[{"@odata.id": "/b/n/Eth/0"}]),
        # A compute block's onboard NIC is never a device: only its capacity is read.
        block(
            ResourceBlockType=["Compute"],
            Processors=[cpu],
            Memory=[dimm],
            EthernetInterfaces=[{"@odata.id": "/b/c/E/0", "x": 1}],
        ),
    ]
    assert inline_parts(blocks) == {
        "/b/g/Processors/0": gpu,
        "/b/n/Storage/0": storage,
        "/b/n/Drives/0": drive,
        "/b/c/P/0": cpu,
        "/b/c/M/0": dimm,
    }


def block(state: str = "Enabled", composition: str = "Unused", **extra: Any) -> dict[str, Any]:
    return {
        "@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/b1",
        "Id": "b1",
        "ResourceBlockType": ["Processor"],
        "Status": {"State": state},
        "CompositionStatus": {"CompositionState": composition, "Reserved": False},
        "Processors": [{"@odata.id": "/p/gpu"}],
        **extra,
    }


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (block(), "free"),
        (block(composition="Composed"), "attached"),
        (block(composition="ComposedAndAvailable"), "attached"),
        (block(Links={"ComputerSystems": [{"@odata.id": "/redfish/v1/Systems/h1"}]}), "attached"),
        (block(state="Disabled"), "unavailable"),
        (block(composition="Failed"), "unavailable"),
        (block(CompositionStatus={"CompositionState": "Unused", "Reserved": True}), "unavailable"),
        ({"Id": "b1"}, "unavailable"),
    ],
)
def test_device_state(document: dict[str, Any], expected: str) -> None:
    assert device_state(document) == expected


@pytest.mark.parametrize(
    ("processor", "expected"),
    [
        ({"MemorySummary": {"TotalMemorySizeMiB": 81920}}, 80),
        ({"ProcessorMemory": [{"CapacityMiB": 24576}, {"CapacityMiB": 24576}]}, 48),
        ({"MemorySummary": {}, "ProcessorMemory": [{"CapacityMiB": 16000}]}, 16),
        ({}, None),
    ],
)
def test_gpu_memory(processor: dict[str, Any], expected: int | None) -> None:
    assert gpu_memory_gib(processor) == expected


def test_gpu_block_becomes_a_device() -> None:
    parts = {"/p/gpu": {"ProcessorType": "GPU", "Model": "X100", "ProcessorMemory": []}}
    device = device_from_block(block(), parts, frozenset({"z"}))
    assert device is not None
    assert (device.kind, device.model, device.memory_gib, device.chassis, device.uuid) == (
        "gpu",
        "X100",
        None,
        "",
        None,
    )


def test_a_gpus_uuid_is_what_container_runtimes_select_it_by() -> None:
    uuid = "6d0e4d29-3f4a-5b7e-9c1d-2a3b4c5d6e7f"
    parts = {"/p/gpu": {"ProcessorType": "GPU", "Model": "X100", "UUID": uuid}}
    device = device_from_block(block(), parts, frozenset({"z"}))
    assert device is not None
    assert device.uuid == uuid


def test_cpu_only_processor_block_is_not_a_device() -> None:
    parts = {"/p/gpu": {"ProcessorType": "CPU", "Model": "Xeon"}}
    assert device_from_block(block(), parts, frozenset()) is None


def test_only_nvme_drives_count() -> None:
    parts = {
        "/d/1": {"Protocol": "SAS", "Model": "spinner"},
        "/d/2": {"Model": "unknown protocol"},
        "/s/1": {"@odata.type": "#Storage.v1_15_0.Storage", "Drives": [{"@odata.id": "/d/3"}]},
        "/d/3": {"Protocol": "NVMe", "Model": "via storage"},
    }
    document = {
        "Drives": [{"@odata.id": "/d/1"}, {"@odata.id": "/d/2"}],
        "Storage": [{"@odata.id": "/s/1"}],
    }
    models = [d["Model"] for d in nvme_drives(document, parts)]
    assert models == ["unknown protocol", "via storage"]


def test_a_drive_linked_directly_and_through_storage_counts_once() -> None:
    parts = {
        "/d/1": {"@odata.id": "/d/1", "Protocol": "NVMe", "CapacityBytes": 2 * 10**12},
        "/s/1": {"@odata.type": "#Storage.v1_15_0.Storage", "Drives": [{"@odata.id": "/d/1/"}]},
    }
    document = block(
        ResourceBlockType=["Storage"],
        Processors=[],
        Drives=[{"@odata.id": "/d/1"}],
        Storage=[{"@odata.id": "/s/1"}],
    )
    assert len(nvme_drives(document, parts)) == 1
    device = device_from_block(document, parts, frozenset())
    assert device is not None
    assert (device.kind, device.capacity_gb) == ("nvme", 2000)


def expandable_host(own_block_types: list[str]) -> Host | None:
    """DMTF's mockup host SystemAfterAddResourceAction, its own block typed as given."""
    blocks_uri = "/redfish/v1/CompositionService/ResourceBlocks"
    system = {
        "@odata.id": "/redfish/v1/Systems/SystemAfterAddResourceAction",
        "Id": "SystemAfterAddResourceAction",
        "Composition": {"UseCases": ["ExpandableSystem"]},
        "Status": {"State": "Enabled"},
        "Links": {
            "ResourceBlocks": [
                {"@odata.id": f"{blocks_uri}/SystemBlock12"},
                {"@odata.id": f"{blocks_uri}/DriveBlock10"},
            ]
        },
    }
    blocks = {
        f"{blocks_uri}/SystemBlock12": {
            "Id": "SystemBlock12",
            "ResourceBlockType": own_block_types,
            "Status": {"State": "Enabled"},
            "Links": {"Zones": [{"@odata.id": "/redfish/v1/CompositionService/ResourceZones/3"}]},
        },
        f"{blocks_uri}/DriveBlock10": {"Id": "DriveBlock10", "ResourceBlockType": ["Storage"]},
    }
    return host_from_system(system, blocks, {})


@pytest.mark.parametrize(
    "own_block_types", [["ComputerSystem"], ["Compute"], ["Compute", "Network"]]
)
def test_a_host_is_found_by_its_own_block_of_either_type(own_block_types: list[str]) -> None:
    host = expandable_host(own_block_types)
    assert host is not None
    assert (host.system_id, host.block_id, host.zones, host.attached, host.state) == (
        "SystemAfterAddResourceAction",
        "SystemBlock12",
        frozenset({"3"}),
        ("DriveBlock10",),
        "enabled",
    )


def test_a_system_without_a_block_of_its_own_is_no_host() -> None:
    assert expandable_host(["Storage"]) is None


M = CompositionTag("h", "m", "o/")
N = CompositionTag("h", "n", "p/q")


@pytest.mark.parametrize(
    ("oem", "expected"),
    [
        ({"ComposeSpawner": {"Hub": "h", "Machine": "m", "Owner": "o/"}}, HostMark("h", (M,))),
        (
            {
                "ComposeSpawner": {
                    "Hub": "h",
                    "Machines": [
                        {"Machine": "m", "Owner": "o/"},
                        {"Machine": "n", "Owner": "p/q"},
                    ],
                }
            },
            HostMark("h", (M, N)),
        ),
        ({"ComposeSpawner": {"Hub": "h", "Machines": []}}, None),
        ({"ComposeSpawner": {"Hub": "h", "Machines": [{"Machine": "m"}]}}, None),
        ({"ComposeSpawner": {"Hub": "", "Machines": [{"Machine": "m", "Owner": "o"}]}}, None),
        ({"ComposeSpawner": {"Hub": "h", "Machine": "m"}}, None),
        ({"ComposeSpawner": {"Hub": "h", "Machine": 3, "Owner": "o"}}, None),
        ({"ComposeSpawner": None}, None),
        ({"Contoso": {}}, None),
    ],
)
def test_host_mark(oem: dict[str, Any], expected: HostMark | None) -> None:
    """Either version of the mark is read; anything not clearly ours is nobody's mark."""
    assert host_mark({"Oem": oem}) == expected


def test_a_mark_reads_back_as_written() -> None:
    mark = HostMark("h", (M, N))
    assert host_mark({"Oem": {"ComposeSpawner": mark_object(mark)}}) == mark
    assert mark_object(None) is None


@pytest.mark.parametrize(
    ("summary", "cores"),
    [({"CoreCount": 64, "Count": 2}, 64), ({"Count": 2}, 2), ({}, 0), ({"CoreCount": "x"}, 0)],
)
def test_host_cores_are_core_count_where_the_service_says(
    summary: dict[str, Any], cores: int
) -> None:
    assert host_cores({"ProcessorSummary": summary}) == cores


BLOCKS = "/redfish/v1/CompositionService/ResourceBlocks"
ZONES = "/redfish/v1/CompositionService/ResourceZones"
SYSTEM_CAPABILITIES = "/redfish/v1/Systems/Capabilities"


def zone(**extra: Any) -> dict[str, Any]:
    links = {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/b1"}]}
    return {"@odata.id": f"{ZONES}/1", "Id": "1", "Links": links, **extra}


COLLECTION_CAPABILITIES = {
    "Capabilities": [
        {
            "CapabilitiesObject": {"@odata.id": SYSTEM_CAPABILITIES},
            "UseCase": "ComputerSystemComposition",
            "Links": {"TargetCollection": {"@odata.id": "/redfish/v1/Systems"}},
        }
    ]
}
LINKED = {"ResourceBlocks": [], "CapabilitiesObjects": [{"@odata.id": SYSTEM_CAPABILITIES}]}
A_SYSTEM_TO_CREATE = {
    SYSTEM_CAPABILITIES: {
        "@odata.id": SYSTEM_CAPABILITIES,
        "@odata.type": "#ComputerSystem.v1_5_0.ComputerSystem",
        "Links": {"ResourceBlocks@Redfish.RequiredOnCreate": True},
    }
}


@pytest.mark.parametrize(
    ("zones", "capabilities", "expected"),
    [
        ([zone(), zone(Links=LINKED)], A_SYSTEM_TO_CREATE, True),
        ([zone(**{"@Redfish.CollectionCapabilities": COLLECTION_CAPABILITIES})], {}, True),
        # A link to capabilities we could not read, or that are not a system's: no.
        ([zone(Links=LINKED)], {}, False),
        ([zone(Links=LINKED)], {SYSTEM_CAPABILITIES: {"@odata.type": "#Zone.v1_0_0.Zone"}}, False),
        ([zone(), zone()], {}, False),
        ([], {}, False),
    ],
    ids=["links", "annotation", "unread", "not-a-system", "none", "no-zones"],
)
def test_zones_that_advertise_composing_whole_systems(
    zones: list[dict[str, Any]], capabilities: dict[str, Any], expected: bool
) -> None:
    assert zones_create_systems(zones, capabilities) is expected


GPU_PART = {"/p/gpu": {"ProcessorType": "GPU", "Model": "X100"}}


def unused_block(block_id: str, types: list[str]) -> dict[str, Any]:
    """A block that reads Unused and names no system, whatever holds it."""
    return {
        "@odata.id": f"{BLOCKS}/{block_id}",
        "Id": block_id,
        "ResourceBlockType": types,
        "Status": {"State": "Enabled"},
        "CompositionStatus": {"CompositionState": "Unused", "Reserved": False},
        "Processors": [{"@odata.id": "/p/gpu"}] if types == ["Processor"] else [],
        "Links": {"ComputerSystems": []},
    }


def system_of(system_id: str, *block_ids: str, **extra: Any) -> dict[str, Any]:
    links = {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/{b}"} for b in block_ids]}
    return {
        "@odata.id": f"/redfish/v1/Systems/{system_id}",
        "Id": system_id,
        "Links": links,
        **extra,
    }


def test_a_device_a_system_links_is_in_use_whatever_its_block_says() -> None:
    blocks = [
        unused_block("h1-block", ["ComputerSystem"]),
        unused_block("gpu-1", ["Processor"]),
        unused_block("gpu-2", ["Processor"]),
    ]
    host = system_of("h1", "h1-block", "gpu-1", Composition={"UseCases": ["ExpandableSystem"]})
    inventory = build_inventory(blocks=blocks, zones=[], systems=[host], parts=GPU_PART)
    held, free = inventory.device("gpu-1"), inventory.device("gpu-2")
    assert held is not None
    assert free is not None
    assert (held.state, held.attached_to) == ("attached", "h1")
    assert (free.state, free.attached_to) == ("free", None)


def test_a_compute_block_a_system_links_is_in_use_whatever_it_says() -> None:
    blocks = [
        unused_block("c1", ["Compute"]),
        unused_block("c2", ["Compute"]),
        unused_block("gpu-1", ["Processor"]),
    ]
    theirs = system_of("composed-1", "c1", "gpu-1", Status={"State": "Enabled"})
    inventory = build_inventory(
        blocks=blocks, zones=[], systems=[theirs], parts=GPU_PART, whole_systems=True
    )
    taken, free = inventory.host("c1"), inventory.host("c2")
    assert taken is not None
    assert free is not None
    assert (taken.state, taken.mark, taken.attached) == ("unavailable", None, ("gpu-1",))
    assert free.state == "enabled"
    device = inventory.device("gpu-1")
    assert device is not None
    assert (device.state, device.attached_to) == ("attached", "c1")


# -- whole systems shared by machines ----------------------------------------------------------

CPU = {"@odata.type": "#Processor.v1_22_0.Processor", "ProcessorType": "CPU", "TotalCores": 8}
DIMM = {"@odata.type": "#Memory.v1_20_0.Memory", "CapacityMiB": 32768}
COMPUTE_PARTS = {"/c/P/0": CPU, "/c/P/1": CPU, "/c/M/0": DIMM, "/c/M/1": DIMM}
OURS = {"ComposeSpawner": {"Hub": "h", "Machines": [{"Machine": "m", "Owner": "o/"}]}}


def compute_block(block_id: str, *, parts: bool) -> dict[str, Any]:
    found = unused_block(block_id, ["Compute"])
    if parts:
        found["Processors"] = [{"@odata.id": "/c/P/0"}, {"@odata.id": "/c/P/1"}]
        found["Memory"] = [{"@odata.id": "/c/M/0"}, {"@odata.id": "/c/M/1"}]
    return found


def writable_system(*block_ids: str, writable: list[str] | None) -> dict[str, Any]:
    system = system_of("composed-1", *block_ids, Oem=OURS, Status={"State": "Enabled"})
    if writable is not None:
        system["Links"]["@Redfish.WriteableProperties"] = writable
    return system


@pytest.mark.parametrize(
    ("parts", "writable", "expected"),
    [
        (True, True, (16, 64, True)),  # capacity from the block's CPUs and DIMMs
        (True, None, (16, 64, False)),  # the service has not said its blocks may change
        (True, False, (16, 64, False)),  # it said they may not
        (False, True, (0, 0, False)),  # capacity unknown: never shared
    ],
)
def test_a_free_compute_block_is_shared_only_where_blocks_change_and_its_size_is_known(
    parts: bool, writable: bool | None, expected: tuple[int, int, bool]
) -> None:
    inventory = build_inventory(
        blocks=[compute_block("c1", parts=parts)],
        zones=[],
        systems=[],
        parts=COMPUTE_PARTS,
        whole_systems=True,
        blocks_writable=writable,
    )
    host = inventory.host("c1")
    assert host is not None
    assert (host.cpus, host.memory_gib, host.shareable) == expected
    assert inventory.largest_host() == ((16, 64) if expected[2] else (0, 0))


def test_a_composed_systems_summary_gives_its_size_where_the_block_does_not() -> None:
    system = writable_system("c1", writable=["ResourceBlocks"])
    system["ProcessorSummary"] = {"CoreCount": 64}
    system["MemorySummary"] = {"TotalSystemMemoryGiB": 512}
    inventory = build_inventory(
        blocks=[compute_block("c1", parts=False)],
        zones=[],
        systems=[system],
        parts={},
        whole_systems=True,
        blocks_writable=blocks_writable(system),
    )
    host = inventory.host("c1")
    assert host is not None
    assert (host.cpus, host.memory_gib, host.state, host.shareable) == (64, 512, "enabled", True)
    assert host.mark == HostMark("h", (M,))


@pytest.mark.parametrize(
    ("links", "expected"),
    [
        ({"@Redfish.WriteableProperties": ["ResourceBlocks"]}, True),
        ({"@Redfish.WriteableProperties": []}, False),
        ({"@Redfish.WriteableProperties": "ResourceBlocks"}, None),  # malformed: not said
        ({}, None),
    ],
)
def test_blocks_writable(links: dict[str, Any], expected: bool | None) -> None:
    assert blocks_writable({"Links": links}) is expected
    if "@Redfish.WriteableProperties" in links:  # the annotation beside Links says the same
        beside = {"Links@Redfish.WriteableProperties": links["@Redfish.WriteableProperties"]}
        assert blocks_writable(beside) is expected
