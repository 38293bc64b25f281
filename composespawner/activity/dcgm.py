"""GPU activity from NVIDIA's DCGM exporter: its Prometheus text, parsed, and an HTTP reader.

The exporter (``dcgm-exporter``; the Kubernetes GPU operator runs one per node) serves
``/metrics`` with one sample per GPU and field, labelled by the GPU's ``UUID``. Two
fields are read: ``DCGM_FI_DEV_GPU_UTIL`` (percent of the sample period a kernel ran)
and ``DCGM_FI_DEV_FB_USED`` (framebuffer in use, MiB). The exporter cannot count
processes, so every GPU's ``processes`` is None and the policy falls back on memory.

Anything that does not make sense raises :class:`ActivityUnreadable` rather than
giving a reading that could look idle.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from composespawner.activity import ActivityUnreadable
from composespawner.domain.activity import ActivityReading, GpuActivity, gpu_uuid

UTILIZATION = "DCGM_FI_DEV_GPU_UTIL"
MEMORY_USED = "DCGM_FI_DEV_FB_USED"
DEFAULT_TIMEOUT = 5.0  # seconds for one GET: an exporter answers from its cache
# DCGM marks a value it has not got ("blank") with the top of the int64 range; the
# exporter prints it as a number (9223372036854775794 in its README).
DCGM_BLANK_FLOOR = 9.2e18
# A MIG instance's samples carry its GPU instance id; the whole GPU's do not.
MIG_INSTANCE_LABEL = "GPU_I_ID"


@dataclass(frozen=True, slots=True)
class _Sample:
    field: str
    uuid: str
    instance: str | None  # MIG GPU instance id; None: the whole GPU
    value: float


def parse_dcgm(
    text: str, host_id: str, at: float, *, where: str = "DCGM exporter"
) -> ActivityReading:
    """The reading a DCGM exporter's ``/metrics`` text gives for ``host_id`` at ``at``.

    A sample without a ``UUID`` label is left out (that GPU is unknown). Raises
    :class:`ActivityUnreadable` when the text is not Prometheus text, has neither
    field, has fields but no UUIDs, gives a GPU one field without the other, or a
    value that cannot be true (NaN, negative, utilisation over 100). A GPU with a
    field DCGM left blank is left out (unknown).
    Both fields declared (``# TYPE``) with no sample is a host without GPUs: an empty
    reading, which says nothing is idle.
    """
    declared, samples = _samples(text, host_id, where)
    if not declared:
        raise ActivityUnreadable(
            host_id, where, f"neither {UTILIZATION} nor {MEMORY_USED} in its answer"
        )
    if not samples:
        if len(declared) < 2:
            only = declared.pop()
            raise ActivityUnreadable(host_id, where, f"only {only} declared, and no samples")
        return ActivityReading(host_id, at, {})  # the exporter sees no GPU on this host
    labelled = [s for s in samples if s.uuid]
    if not labelled:
        raise ActivityUnreadable(
            host_id, where, "its samples carry no UUID label (is it an NVIDIA DCGM exporter?)"
        )
    for sample in labelled:
        problem = _implausible(sample)
        if problem:
            raise ActivityUnreadable(host_id, where, problem)
    # DCGM has no value for these GPUs (a field it cannot read on them, as GPU_UTIL under
    # MIG): each is left out, unknown, and the host's other GPUs are still read.
    blank = {s.uuid for s in labelled if s.value >= DCGM_BLANK_FLOOR}
    known = [s for s in labelled if s.uuid not in blank]
    return ActivityReading(host_id, at, _per_gpu(known, host_id, where))


def _samples(text: str, host_id: str, where: str) -> tuple[set[str], list[_Sample]]:
    """The two fields' families declared, and their samples.

    The parser reads lazily, so every error of the text surfaces here.
    """
    declared: set[str] = set()
    found = []
    try:
        for family in text_string_to_metric_families(text):
            if family.name in (UTILIZATION, MEMORY_USED):
                declared.add(family.name)
            for sample in family.samples:
                if sample.name not in (UTILIZATION, MEMORY_USED):
                    continue
                uuid = sample.labels.get("UUID") or sample.labels.get("uuid") or ""
                instance = sample.labels.get(MIG_INSTANCE_LABEL) or None
                found.append(_Sample(sample.name, gpu_uuid(uuid), instance, float(sample.value)))
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise ActivityUnreadable(host_id, where, f"not Prometheus text: {err}") from err
    return declared, found


def _implausible(sample: _Sample) -> str | None:
    value = sample.value
    gpu = f"GPU {sample.uuid}"
    if math.isnan(value) or math.isinf(value) or value < 0:
        return f"{sample.field} of {gpu} is {value}"
    if value >= DCGM_BLANK_FLOOR:
        return None  # not a figure at all: the GPU is left out (parse_dcgm)
    if sample.field == UTILIZATION and value > 100:
        return f"{UTILIZATION} of {gpu} is {value}, over 100 percent"
    return None


def _per_gpu(samples: Iterable[_Sample], host_id: str, where: str) -> dict[str, GpuActivity]:
    """One activity per UUID, however many samples the exporter gave it.

    Several samples of one GPU come from two sources. Under Kubernetes pod mapping a
    GPU shared by several pods is repeated once per pod with the same figures: within
    one (GPU, instance) the largest counts. Under MIG each GPU instance has its own
    samples (``GPU_I_ID``), often beside the whole GPU's: the GPU's utilisation is the
    busiest instance's, its memory the sum of its instances' or the whole GPU's figure,
    whichever is larger. Every choice errs towards "in use", never towards idle.
    """
    series: dict[tuple[str, str | None, str], float] = {}
    for s in samples:
        key = (s.uuid, s.instance, s.field)
        series[key] = max(series.get(key, 0.0), s.value)
    fields: dict[str, dict[str, list[tuple[str | None, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for (uuid, instance, field), value in series.items():
        fields[uuid][field].append((instance, value))
    gpus, lacking = {}, []
    for uuid, by_field in sorted(fields.items()):
        missing = [f for f in (UTILIZATION, MEMORY_USED) if f not in by_field]
        if missing:
            # This GPU is unknown (as a MIG GPU without GPU_UTIL is); the others still
            # count. Only an exporter that gives no GPU both figures is unreadable.
            lacking.append(f"GPU {uuid} has no {missing[0]}")
            continue
        utilization = max(value for _, value in by_field[UTILIZATION])
        gpus[uuid] = GpuActivity(uuid, utilization, _memory(by_field[MEMORY_USED]), None)
    if lacking and not gpus:
        raise ActivityUnreadable(host_id, where, "; ".join(lacking))
    return gpus


def _memory(values: list[tuple[str | None, float]]) -> float:
    whole = max((v for instance, v in values if instance is None), default=0.0)
    instances = sum(v for instance, v in values if instance is not None)
    return max(whole, instances)


class DcgmExporter:
    """Reads each host's DCGM exporter over HTTP (an :class:`ActivitySource`).

    ``url_for`` gives a host's ``/metrics`` URL: a mapping of host id to URL, or a
    function of the host id. Every GET has ``timeout`` seconds in all.
    """

    def __init__(
        self,
        url_for: Callable[[str], str] | Mapping[str, str],
        timeout: float = DEFAULT_TIMEOUT,
        *,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._url_for = url_for
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None
        self._clock = clock

    def url(self, host_id: str) -> str:
        """The exporter URL of a host; :class:`ActivityUnreadable` for a host it has none for."""
        if isinstance(self._url_for, Mapping):
            found = self._url_for.get(host_id)
            if found is None:
                raise ActivityUnreadable(host_id, "DCGM exporter", "no exporter URL configured")
            return found
        return self._url_for(host_id)

    async def read(self, host_id: str) -> ActivityReading:
        url = self.url(host_id)
        text = await self._get(host_id, url)
        return parse_dcgm(text, host_id, self._clock(), where=url)

    async def _get(self, host_id: str, url: str) -> str:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._http().get(url, timeout=timeout) as answer:
                if answer.status != 200:
                    raise ActivityUnreadable(host_id, url, f"HTTP {answer.status} {answer.reason}")
                return await answer.text()
        except TimeoutError as err:
            raise ActivityUnreadable(host_id, url, f"no answer within {self.timeout:g}s") from err
        except (aiohttp.ClientError, UnicodeDecodeError) as err:
            raise ActivityUnreadable(host_id, url, _said(err)) from err

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        """Close the HTTP session this reader opened (not one it was given)."""
        if self._session is not None and self._owns_session:
            await self._session.close()
            self._session = None  # a later read opens a new one

    async def __aenter__(self) -> DcgmExporter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _said(error: BaseException) -> str:
    """An error for a message, its kind named (some errors' own text is empty)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
