"""The client against a strict fake Redfish service that misbehaves on cue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import pytest

from composespawner.domain.hardware import CompositionTag, HostMark
from composespawner.fabric.base import (
    DeviceInUse,
    DeviceNotFound,
    FabricAuthError,
    FabricDeadlineExceeded,
    FabricRefused,
    FabricTaskFailed,
    FabricUnreachable,
    StaleETag,
)
from composespawner.fabric.redfish import RedfishFabric, RedfishTimeouts

from .conftest import FAST_RETRY, FAST_TIMEOUTS
from .fake_redfish import (
    ADD,
    PASSWORD,
    REMOVE,
    SYSTEMS,
    USER,
    FakeRedfish,
    FakeRedfishServer,
    Fault,
    Reply,
    error_body,
)

HOST1 = f"{SYSTEMS}/host-1"
ADD1 = f"{HOST1}/{ADD}"
REMOVE1 = f"{HOST1}/{REMOVE}"
BLOCKS_COLLECTION = "/redfish/v1/CompositionService/ResourceBlocks"


def count(service: FakeRedfish, method: str, path: str) -> int:
    return sum(1 for m, uri in service.requests if m == method and uri.split("?")[0] == path)


# -- sessions ---------------------------------------------------------------------------------


async def test_logs_in_once_and_uses_the_token(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    inventory = await fabric.inventory()
    assert [h.system_id for h in inventory.hosts] == ["host-1", "host-2"]
    assert fake_service.service.logins == 1  # the concurrent discovery shared one login


async def test_close_deletes_the_session(fake_service: FakeRedfishServer) -> None:
    fabric = RedfishFabric(fake_service.url, username=USER, password=PASSWORD)
    await fabric.inventory()
    await fabric.close()
    assert fake_service.service.logouts == ["1"]
    assert fake_service.service.tokens == {}


async def test_expired_session_logs_in_again_once(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.inventory()
    fake_service.service.expire_sessions()
    inventory = await fabric.inventory()
    assert len(inventory.devices) == 3
    assert fake_service.service.logins == 2


async def test_refused_even_after_a_fresh_login_is_an_auth_error(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.inventory()
    fake_service.service.authorized = lambda headers: False  # type: ignore[method-assign]
    with pytest.raises(FabricAuthError) as refused:
        await fabric.attach("host-1", "gpu-1")
    assert refused.value.status == 401
    assert fake_service.service.logins == 2


async def test_wrong_password_is_an_auth_error(fake_service: FakeRedfishServer) -> None:
    fabric = RedfishFabric(fake_service.url, username=USER, password="nope", retry=FAST_RETRY)
    try:
        with pytest.raises(FabricAuthError):
            await fabric.inventory()
    finally:
        await fabric.close()
    assert fake_service.service.logins == 0


@pytest.mark.parametrize(("cap", "most"), [(2, 2), (64, 10)])
async def test_requests_in_flight_never_exceed_the_cap(
    fake_service: FakeRedfishServer, cap: int, most: int
) -> None:
    fabric = RedfishFabric(fake_service.url, username=USER, password=PASSWORD, max_in_flight=cap)
    await fabric.host_mark("host-1")  # log in and discover first: only the reads race
    fake_service.service.latency = 0.02
    fake_service.service.most_in_flight = 0
    try:
        marks = await asyncio.gather(*(fabric.host_mark("host-1") for _ in range(10)))
    finally:
        await fabric.close()
    assert len(marks) == 10
    assert fake_service.service.most_in_flight == most


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        RedfishFabric("http://127.0.0.1:1", username=USER, password=PASSWORD, max_in_flight=0)


async def test_basic_auth_when_the_service_has_no_sessions() -> None:
    server = FakeRedfishServer(FakeRedfish(sessions=False))
    server.start()
    fabric = RedfishFabric(server.url, username=USER, password=PASSWORD, retry=FAST_RETRY)
    try:
        await fabric.attach("host-1", "gpu-1")
    finally:
        await fabric.close()
        await server.stop()
    assert server.service.attached["host-1"] == ["gpu-1"]


async def test_secrets_never_reach_the_log(
    fake_service: FakeRedfishServer, fabric: RedfishFabric, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake_service.service.fail(Fault("GET", BLOCKS_COLLECTION, "drop"))
    await fabric.inventory()
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "ada/"))
    await fabric.close()
    assert "GET /redfish/v1/Systems" in caplog.text  # requests are logged...
    assert PASSWORD not in caplog.text  # ...but never the password
    assert "token-1" not in caplog.text  # ...or the session token


# -- attach / detach --------------------------------------------------------------------------


async def test_attach_and_detach(fake_service: FakeRedfishServer, fabric: RedfishFabric) -> None:
    await fabric.attach("host-1", "gpu-1")
    await fabric.attach("host-1", "gpu-2")
    inventory = await fabric.inventory()
    host = inventory.host("host-1")
    assert host is not None
    assert host.attached == ("gpu-1", "gpu-2")
    gpu = inventory.device("gpu-1")
    assert gpu is not None
    assert (gpu.state, gpu.attached_to, gpu.memory_gib) == ("attached", "host-1", 40)
    await fabric.detach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-2"]


async def test_a_service_without_resource_zones_still_attaches(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    # Discovery looks for composition advertised on the zones (older services do
    # that): a service without a zones collection still has expandable hosts.
    zones = "/redfish/v1/CompositionService/ResourceZones"
    missing = Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI", zones))
    fake_service.service.fail(Fault("GET", zones, "status", reply=missing))
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    assert count(fake_service.service, "GET", zones) == 1


async def test_attach_sends_no_system_etag(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    """A shared host's ETag changes with every neighbour's attach: only the block matters."""
    fake_service.service.versions["host-1"] = 7
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.action_payloads == [
        {"ResourceBlock": {"@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/gpu-1"}}
    ]


async def test_attach_and_detach_are_idempotent(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.attach("host-1", "gpu-1")
    await fabric.attach("host-1", "gpu-1")
    await fabric.detach("host-1", "gpu-1")
    await fabric.detach("host-1", "gpu-1")
    assert count(fake_service.service, "POST", ADD1) == 1
    assert count(fake_service.service, "POST", REMOVE1) == 1


async def test_block_of_another_host_is_in_use(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    with pytest.raises(DeviceInUse) as refused:
        await fabric.attach("host-1", "gpu-3")
    assert refused.value.status == 409
    assert refused.value.message_ids == ("Composition.1.1.3.ResourceBlockInUse",)
    assert fake_service.service.attached["host-2"] == ["gpu-3"]


async def test_unknown_block_and_system_are_not_found(fabric: RedfishFabric) -> None:
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-1", "gpu-9")
    with pytest.raises(DeviceNotFound):
        await fabric.attach("host-9", "gpu-1")


async def test_lost_answer_then_in_use_is_success_when_attached_here(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    # The first POST attaches and its answer is lost; the retry is told "in use".
    fake_service.service.fail(Fault("POST", ADD1, "lost_answer"))
    in_use = Reply(409, error_body("Composition.1.1.3.ResourceBlockInUse", "gpu-1"))
    fake_service.service.fail(Fault("POST", ADD1, "status", reply=in_use))
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    assert count(fake_service.service, "POST", ADD1) == 2


async def test_lost_answer_then_not_found_is_success_when_detached(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.attach("host-1", "gpu-1")
    fake_service.service.fail(Fault("POST", REMOVE1, "lost_answer"))
    await fabric.detach("host-1", "gpu-1")  # the retry is answered 400 ResourceBlockNotFound
    assert fake_service.service.attached["host-1"] == []
    assert count(fake_service.service, "POST", REMOVE1) == 2


async def test_stale_etag_is_read_again(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    stale = Reply(412, error_body("Base.1.22.1.PreconditionFailed"))
    fake_service.service.fail(Fault("POST", ADD1, "status", reply=stale))
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    assert count(fake_service.service, "GET", HOST1) == 2


async def test_etag_that_stays_stale_gives_up(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    stale = Reply(412, error_body("Base.1.22.1.PreconditionFailed"))
    fake_service.service.fail(Fault("POST", ADD1, "status", times=99, reply=stale))
    with pytest.raises(StaleETag):
        await fabric.attach("host-1", "gpu-1")
    assert count(fake_service.service, "POST", ADD1) == FAST_RETRY.etag_attempts


# -- tasks ------------------------------------------------------------------------------------


async def test_accepted_task_is_followed_to_its_end(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    running = {"@odata.type": "#Task.v1_7_4.Task", "TaskState": "Running"}
    fake_service.service.fail(Fault("POST", ADD1, "task", polls=2, task_body=running))
    await fabric.attach("host-1", "gpu-1")
    assert count(fake_service.service, "GET", "/redfish/v1/TaskService/TaskMonitors/1") == 3
    assert fake_service.service.attached["host-1"] == ["gpu-1"]


async def test_task_ending_in_exception_fails(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    failed_task = {
        "@odata.type": "#Task.v1_7_4.Task",
        "TaskState": "Exception",
        "Messages": [{"MessageId": "Composition.1.1.3.NoResourceMatch", "Message": "no luck"}],
    }
    fake_service.service.fail(Fault("POST", ADD1, "task", reply=Reply(200, failed_task)))
    with pytest.raises(FabricTaskFailed) as failed:
        await fabric.attach("host-1", "gpu-1")
    assert failed.value.message_ids == ("Composition.1.1.3.NoResourceMatch",)
    assert "no luck" in str(failed.value)


async def test_task_refusal_is_the_same_error_as_a_direct_refusal(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    fake_service.service.fail(Fault("POST", ADD1, "task"))  # final answer: the real 409
    with pytest.raises(DeviceInUse) as refused:
        await fabric.attach("host-1", "gpu-3")
    assert refused.value.message_ids == ("Composition.1.1.3.ResourceBlockInUse",)


async def test_task_ending_in_an_internal_error_fails(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    broken = Reply(500, error_body("Base.1.22.1.InternalError", "firmware hiccup"))
    fake_service.service.fail(Fault("POST", ADD1, "task", reply=broken))
    with pytest.raises(FabricTaskFailed) as failed:
        await fabric.attach("host-1", "gpu-1")
    assert failed.value.message_ids == ("Base.1.22.1.InternalError",)


async def test_vanished_monitor_is_settled_by_looking_at_the_host(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    gone = Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI"))
    fake_service.service.fail(Fault("POST", ADD1, "task", reply=gone))
    await fabric.attach("host-1", "gpu-1")  # the work was done: success
    assert fake_service.service.attached["host-1"] == ["gpu-1"]


async def test_vanished_monitor_without_the_work_done_is_unknown(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    gone = Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI"))
    fake_service.service.fail(Fault("POST", ADD1, "task", reply=gone))
    with pytest.raises(FabricUnreachable) as unknown:
        await fabric.attach("host-1", "gpu-3")  # refused underneath, but we cannot know
    assert "task monitor" in str(unknown.value)


async def test_task_that_outlives_the_deadline(fake_service: FakeRedfishServer) -> None:
    timeouts = RedfishTimeouts(connect=1, request=1, operation=0.6, task_poll_max=0.05)
    fabric = RedfishFabric(
        fake_service.url, username=USER, password=PASSWORD, timeouts=timeouts, retry=FAST_RETRY
    )
    fake_service.service.fail(Fault("POST", ADD1, "task", polls=10**6))
    started = time.monotonic()
    try:
        with pytest.raises(FabricDeadlineExceeded):
            await fabric.attach("host-1", "gpu-1")
    finally:
        await fabric.close()
    assert time.monotonic() - started < 0.6 + 0.5


# -- transport faults -------------------------------------------------------------------------


async def test_unavailable_then_success(
    fake_service: FakeRedfishServer, fabric: RedfishFabric, caplog: pytest.LogCaptureFixture
) -> None:
    busy = Reply(503, error_body("Base.1.22.1.ServiceTemporarilyUnavailable"), {"Retry-After": "0"})
    fake_service.service.fail(Fault("GET", HOST1, "status", times=2, reply=busy))
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    assert count(fake_service.service, "GET", HOST1) == 3
    assert "answered 503; trying again" in caplog.text


async def test_unavailable_for_good_is_refused(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    busy = Reply(503, error_body("Base.1.22.1.ServiceTemporarilyUnavailable"))
    fake_service.service.fail(Fault("GET", HOST1, "status", times=99, reply=busy))
    with pytest.raises(FabricRefused) as refused:
        await fabric.attach("host-1", "gpu-1")
    assert refused.value.status == 503
    assert count(fake_service.service, "GET", HOST1) == FAST_RETRY.attempts


async def test_dropped_connection_is_retried(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    fake_service.service.fail(Fault("GET", BLOCKS_COLLECTION, "drop", times=2))
    inventory = await fabric.inventory()
    assert len(inventory.devices) == 3
    assert count(fake_service.service, "GET", BLOCKS_COLLECTION) == 3


async def test_connection_dropped_every_time_is_unreachable(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    fake_service.service.fail(Fault("GET", BLOCKS_COLLECTION, "drop", times=99))
    with pytest.raises(FabricUnreachable) as unreachable:
        await fabric.inventory()
    assert not isinstance(unreachable.value, FabricDeadlineExceeded)
    # Each of our tries is two GETs: aiohttp sends an idempotent request once more
    # when its connection drops (RFC 9112 section 9.3.1), then gives up to us.
    assert count(fake_service.service, "GET", BLOCKS_COLLECTION) == 2 * FAST_RETRY.attempts


async def test_service_that_never_answers_hits_the_deadline(
    fake_service: FakeRedfishServer,
) -> None:
    timeouts = RedfishTimeouts(connect=0.5, request=0.3, operation=1.0)
    fabric = RedfishFabric(
        fake_service.url, username=USER, password=PASSWORD, timeouts=timeouts, retry=FAST_RETRY
    )
    fake_service.service.fail(Fault("GET", HOST1, "hang", times=99))
    started = time.monotonic()
    try:
        with pytest.raises(FabricDeadlineExceeded):
            await fabric.attach("host-1", "gpu-1")
    finally:
        await fabric.close()
    assert time.monotonic() - started < 1.0 + 0.5


async def test_nobody_listening_is_unreachable() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fabric = RedfishFabric(
        f"http://127.0.0.1:{port}", username=USER, password=PASSWORD, retry=FAST_RETRY
    )
    try:
        with pytest.raises(FabricUnreachable):
            await fabric.inventory()
    finally:
        await fabric.close()


async def test_silent_tcp_peer_hits_the_deadline() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    timeouts = RedfishTimeouts(connect=0.5, request=0.2, operation=0.8)
    fabric = RedfishFabric(
        f"http://127.0.0.1:{port}", username=USER, password=PASSWORD, timeouts=timeouts
    )
    try:
        with pytest.raises(FabricDeadlineExceeded):
            await fabric.leave_host("host-1", CompositionTag("hub-a", "m-1", "ada/"))
    finally:
        await fabric.close()
        for writer in accepted:
            await closed(writer)
        server.close()
        await server.wait_closed()
    assert accepted


async def test_garbage_instead_of_http_is_unreachable() -> None:
    answering: set[asyncio.Task[None]] = set()

    async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answering.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 two hundred\r\nno headers here\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client hung up first
        finally:
            await closed(writer)

    server = await asyncio.start_server(babble, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    fabric = RedfishFabric(
        f"http://127.0.0.1:{port}", username=USER, password=PASSWORD, retry=FAST_RETRY
    )
    try:
        with pytest.raises(FabricUnreachable) as unreachable:
            await fabric.inventory()
    finally:
        await fabric.close()
        server.close()
        await server.wait_closed()  # before 3.12 it does not wait for the handlers: we do
        await asyncio.wait_for(asyncio.gather(*answering), timeout=5)
    assert "tried 4 times" in str(unreachable.value)


async def closed(writer: asyncio.StreamWriter) -> None:
    """Close a test server's end of a connection while the loop lives (a stream
    left to the garbage collector after the loop closed warns in whichever test
    runs then)."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


# -- tags -------------------------------------------------------------------------------------


async def test_join_and_leave_a_host(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    tag = CompositionTag(hub="hub-a", machine="m-42", owner="ada/thesis")
    await fabric.join_host("host-1", tag)
    await fabric.join_host("host-1", tag)  # already there: no second write
    host = (await fabric.inventory()).host("host-1")
    assert host is not None
    assert host.mark == HostMark.of(tag)
    await fabric.leave_host("host-1", tag)
    await fabric.leave_host("host-1", tag)  # gone already: no second write
    host = (await fabric.inventory()).host("host-1")
    assert host is not None
    assert host.mark is None
    assert "ComposeSpawner" not in fake_service.service.oem["host-1"]
    assert count(fake_service.service, "PATCH", HOST1) == 2


async def test_join_retries_a_stale_etag(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    stale = Reply(412, error_body("Base.1.22.1.PreconditionFailed"))
    fake_service.service.fail(Fault("PATCH", HOST1, "status", reply=stale))
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    assert fake_service.service.oem["host-1"]["ComposeSpawner"]["Machines"] == [
        {"Machine": "m-1", "Owner": "bob/"}
    ]
    assert count(fake_service.service, "PATCH", HOST1) == 2


async def test_attach_after_joining_starts_from_the_mark_answer(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    fake_service.service.patch_answers_resource = True
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    # One read, before the PATCH; the attach used the PATCH's answer and its ETag.
    assert count(fake_service.service, "GET", HOST1) == 1
    await fabric.attach("host-1", "gpu-2")  # nothing remembered now: read first
    assert count(fake_service.service, "GET", HOST1) == 2


async def test_a_remembered_etag_gone_stale_is_read_again(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    fake_service.service.patch_answers_resource = True
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    fake_service.service.versions["host-1"] += 1  # someone else changed the system
    # Attaching sends no system ETag (a neighbour's write changes it): a mark write does.
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-2", "cy/"))
    machines = fake_service.service.oem["host-1"]["ComposeSpawner"]["Machines"]
    assert [m["Machine"] for m in machines] == ["m-1", "m-2"]
    assert count(fake_service.service, "PATCH", HOST1) == 3  # m-1; m-2 stale, then fresh


async def test_remembered_answers_never_say_done(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.attach("host-1", "gpu-1")
    await fabric.host_mark("host-1")  # remembers host-1 with gpu-1 attached
    fake_service.service.attached["host-1"].clear()  # detached behind our back
    await fabric.attach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == ["gpu-1"]
    assert count(fake_service.service, "POST", ADD1) == 2


async def test_detach_after_reading_the_mark_starts_from_that_read(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.attach("host-1", "gpu-1")
    reads = count(fake_service.service, "GET", HOST1)
    _, linked = await fabric.host_mark("host-1")
    assert "gpu-1" in linked
    await fabric.detach("host-1", "gpu-1")
    assert fake_service.service.attached["host-1"] == []
    assert count(fake_service.service, "GET", HOST1) == reads + 1


async def test_joining_after_an_inventory_starts_from_its_listing(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.inventory()
    reads = count(fake_service.service, "GET", HOST1)
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    assert fake_service.service.oem["host-1"]["ComposeSpawner"]["Machines"] == [
        {"Machine": "m-1", "Owner": "bob/"}
    ]
    assert count(fake_service.service, "GET", HOST1) == reads  # the listing's ETag did
    assert count(fake_service.service, "PATCH", HOST1) == 1


async def test_a_listing_gone_stale_is_read_again_before_joining(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    await fabric.inventory()
    fake_service.service.versions["host-1"] += 1  # someone else changed the system
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    assert fake_service.service.oem["host-1"]["ComposeSpawner"]["Machines"] == [
        {"Machine": "m-1", "Owner": "bob/"}
    ]
    assert count(fake_service.service, "PATCH", HOST1) == 2  # stale, then fresh


async def test_a_listing_never_says_a_host_is_taken(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    other = {"Hub": "hub-b", "Machine": "m-9", "Owner": "eve/"}
    fake_service.service.oem["host-1"]["ComposeSpawner"] = other
    await fabric.inventory()  # the listing shows host-1 marked by another hub
    fake_service.service.oem["host-1"].clear()  # which let go of it since
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-1", "bob/"))
    assert fake_service.service.oem["host-1"]["ComposeSpawner"]["Hub"] == "hub-a"


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="operation"):
        RedfishTimeouts(operation=0)
    assert FAST_TIMEOUTS.operation > FAST_TIMEOUTS.request


async def test_join_with_a_lost_answer_is_done_once(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    # The PATCH lands but its answer is lost; the retry's If-Match is then stale.
    fake_service.service.fail(Fault("PATCH", HOST1, "lost_answer"))
    tag = CompositionTag("hub-a", "m-2", "cy/")
    await fabric.join_host("host-1", tag)
    host = (await fabric.inventory()).host("host-1")
    assert host is not None
    assert host.mark == HostMark.of(tag)
    assert fake_service.service.versions["host-1"] == 2  # written exactly once


async def test_join_through_a_vanished_task_monitor(
    fake_service: FakeRedfishServer, fabric: RedfishFabric
) -> None:
    gone = Reply(404, error_body("Base.1.22.1.ResourceMissingAtURI"))
    fake_service.service.fail(Fault("PATCH", HOST1, "task", reply=gone))
    await fabric.join_host("host-1", CompositionTag("hub-a", "m-3", "dee/"))
    assert fake_service.service.oem["host-1"]["ComposeSpawner"]["Machines"] == [
        {"Machine": "m-3", "Owner": "dee/"}
    ]
