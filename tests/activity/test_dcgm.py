"""The DCGM exporter's text, parsed: a real capture, garbage, MIG and repeated series,
and the HTTP reader against a small aiohttp server (in this process)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from composespawner.activity import ActivitySource, ActivityUnreadable
from composespawner.activity.dcgm import DcgmExporter, parse_dcgm
from composespawner.domain.activity import GpuActivity

FIXTURES = Path(__file__).with_name("fixtures")
T4 = "20c56d28-0da5-6d26-a36a-e7af1ce2586e"


def capture() -> str:
    return (FIXTURES / "dcgm-exporter-t4-driver460.txt").read_text(encoding="utf-8")


def series(field: str, value: object, uuid: str | None = "GPU-AAAA", **labels: str) -> str:
    """One sample line in the exporter's label set (written for these tests)."""
    all_labels = {"gpu": "0", **({"UUID": uuid} if uuid is not None else {}), **labels}
    rendered = ",".join(f'{key}="{value}"' for key, value in all_labels.items())
    return f"{field}{{{rendered}}} {value}\n"


def gpu(utilization: object, memory: object, uuid: str | None = "GPU-AAAA", **labels: str) -> str:
    return series("DCGM_FI_DEV_GPU_UTIL", utilization, uuid, **labels) + series(
        "DCGM_FI_DEV_FB_USED", memory, uuid, **labels
    )


def test_real_capture_reads_the_t4_idle() -> None:
    reading = parse_dcgm(capture(), "host-01", 1000.0)
    assert reading.host_id == "host-01"
    assert reading.at == 1000.0
    # UUIDs key without the "GPU-" prefix, lower-cased; the exporter cannot count processes.
    assert dict(reading.gpus) == {T4: GpuActivity(T4, 0.0, 0.0, None)}


def test_several_gpus_and_a_sample_without_uuid() -> None:
    text = (
        gpu(37, 4845, "GPU-AAAA")
        + gpu(0, 3, "GPU-BBBB", gpu="1")
        + gpu(99, 80000, None, gpu="2")  # no UUID label: that GPU is unknown, not idle
    )
    reading = parse_dcgm(text, "h", 1.0)
    assert dict(reading.gpus) == {
        "aaaa": GpuActivity("aaaa", 37.0, 4845.0, None),
        "bbbb": GpuActivity("bbbb", 0.0, 3.0, None),
    }


def test_mig_instances_take_the_busiest_and_the_sum() -> None:
    """Modelled on the MIG sample in NVIDIA's docs: the whole GPU's series and each instance's."""
    text = (
        gpu(5, 1000, GPU_I_PROFILE="1g.5gb", GPU_I_ID="13")
        + gpu(60, 3000, GPU_I_PROFILE="3g.20gb", GPU_I_ID="1")
        + gpu(0, 3500)  # the whole GPU, smaller than its instances' sum
    )
    activity = parse_dcgm(text, "h", 1.0).gpus["aaaa"]
    assert (activity.utilization, activity.memory_used_mib) == (60.0, 4000.0)


def test_whole_gpu_memory_counts_when_larger_than_its_instances() -> None:
    text = gpu(0, 500, GPU_I_ID="1") + gpu(0, 9000)
    assert parse_dcgm(text, "h", 1.0).gpus["aaaa"].memory_used_mib == 9000.0


def test_series_repeated_per_pod_are_not_added_up() -> None:
    """Kubernetes pod mapping repeats a shared GPU's figures once per pod."""
    text = gpu(20, 2048, pod="a", namespace="x") + gpu(20, 2048, pod="b", namespace="x")
    activity = parse_dcgm(text, "h", 1.0).gpus["aaaa"]
    assert (activity.utilization, activity.memory_used_mib) == (20.0, 2048.0)


def test_both_fields_declared_without_samples_is_a_host_without_gpus() -> None:
    text = "".join(
        f"# HELP {field} help\n# TYPE {field} gauge\n"
        for field in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
    )
    assert dict(parse_dcgm(text, "h", 1.0).gpus) == {}  # nothing listed: nothing idle


def test_a_gpu_dcgm_left_blank_is_left_out() -> None:
    """DCGM prints its "no value" as the top of the int64 range (as in NVIDIA's README)."""
    text = gpu(9223372036854775794, 4000, "GPU-AAAA") + gpu(12, 300, "GPU-BBBB", gpu="1")
    assert set(parse_dcgm(text, "h", 1.0).gpus) == {"bbbb"}  # aaaa: unknown, never idle


def test_a_gpu_lacking_a_figure_is_unknown_and_its_neighbours_still_count() -> None:
    text = gpu(3, 4, "GPU-AAAA") + series("DCGM_FI_DEV_GPU_UTIL", 1, "GPU-BBBB")
    assert set(parse_dcgm(text, "h", 1.0).gpus) == {"aaaa"}  # bbbb: unknown, never idle


def test_other_exporters_lines_are_ignored() -> None:
    text = "go_goroutines 42\n" + gpu(1, 2)
    assert set(parse_dcgm(text, "h", 1.0).gpus) == {"aaaa"}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("<html><body>502 Bad Gateway</body></html>", "not Prometheus text"),
        ("hello world\n", "not Prometheus text"),
        ("", "neither DCGM_FI_DEV_GPU_UTIL nor DCGM_FI_DEV_FB_USED"),
        ("go_goroutines 42\n", "neither"),
        ("# TYPE DCGM_FI_DEV_FB_USED gauge\n", "only DCGM_FI_DEV_FB_USED declared"),
        (gpu(1, 2, None), "no UUID label"),
        (series("DCGM_FI_DEV_GPU_UTIL", 3), "has no DCGM_FI_DEV_FB_USED"),
        (series("DCGM_FI_DEV_FB_USED", 3), "has no DCGM_FI_DEV_GPU_UTIL"),
        (gpu("NaN", 2), "is nan"),
        (gpu(-1, 2), "is -1.0"),
        (gpu(101, 2), "over 100 percent"),
        (gpu(0, "+Inf"), "is inf"),
        (gpu(0, -5), "is -5.0"),
    ],
)
def test_garbage_is_unreadable_never_idle(text: str, said: str) -> None:
    with pytest.raises(ActivityUnreadable) as caught:
        parse_dcgm(text, "host-07", 1.0, where="http://x/metrics")
    assert said in str(caught.value)
    assert "host-07" in str(caught.value)
    assert "http://x/metrics" in str(caught.value)
    assert caught.value.host_id == "host-07"


# --- the HTTP reader ------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Serve one handler on a free loopback port; its /metrics URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/metrics"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_reader_reads_an_exporter(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=capture(), content_type="text/plain")

    url = await serve(metrics)
    async with DcgmExporter({"host-01": url}, timeout=5.0, clock=lambda: 42.0) as reader:
        assert isinstance(reader, ActivitySource)
        reading = await reader.read("host-01")
    assert reading.at == 42.0
    assert reading.gpus[T4].utilization == 0.0


async def test_reader_refuses_an_error_status(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text=capture())

    url = await serve(broken)
    async with DcgmExporter(lambda host: url) as reader:
        with pytest.raises(ActivityUnreadable, match="HTTP 500"):
            await reader.read("host-01")


async def test_reader_gives_up_on_a_hung_exporter_within_its_timeout(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    async def hung(request: web.Request) -> web.Response:
        await asyncio.Event().wait()  # never answers; cancelled when the client leaves
        raise AssertionError("unreachable")

    url = await serve(hung)
    start = time.monotonic()
    async with DcgmExporter({"h": url}, timeout=0.5) as reader:
        with pytest.raises(ActivityUnreadable, match=r"no answer within 0\.5s"):
            await reader.read("h")
    assert time.monotonic() - start < 3.0


async def test_reader_refuses_a_host_it_has_no_url_for() -> None:
    async with DcgmExporter({"h": "http://127.0.0.1:9/metrics"}) as reader:
        with pytest.raises(ActivityUnreadable, match="no exporter URL configured"):
            await reader.read("other")


async def test_reader_refuses_an_exporter_that_is_down() -> None:
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    async with DcgmExporter({"h": "http://127.0.0.1:1/metrics"}, timeout=2.0) as reader:
        with pytest.raises(ActivityUnreadable, match="ClientConnectorError"):
            await reader.read("h")


async def test_reader_refuses_an_empty_answer(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def empty(request: web.Request) -> web.Response:
        return web.Response(text="")

    async with DcgmExporter({"h": await serve(empty)}, timeout=2.0) as reader:
        with pytest.raises(ActivityUnreadable, match="neither"):
            await reader.read("h")


async def test_reader_leaves_a_session_it_was_given_open(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=capture())

    url = await serve(metrics)
    async with aiohttp.ClientSession() as session:
        reader = DcgmExporter({"h": url}, session=session)
        await reader.close()
        assert not session.closed
        assert T4 in (await reader.read("h")).gpus  # still reads through the same session
        await reader.close()
        assert not session.closed
