"""The final answer of a Redfish write: at once, or through a 202 task monitor.

By DSP0266 a service may answer a write with ``202 Accepted`` and a task
monitor in ``Location``; polling the monitor gives the operation's own answer
when the work is done. :func:`outcome` hides the difference from callers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from composespawner.fabric.base import FabricDeadlineExceeded, FabricRefused, FabricTaskFailed
from composespawner.fabric.redfish.errors import error_messages, has_message, parse_body
from composespawner.fabric.redfish.mapping import dig
from composespawner.fabric.redfish.transport import (
    Deadline,
    RedfishTransport,
    Response,
    retry_after_seconds,
)

_TASK_FAILED = frozenset({"Exception", "Killed", "Cancelled", "Interrupted"})
_TASK_RUNNING = frozenset(
    {"New", "Starting", "Running", "Suspended", "Pending", "Stopping", "Cancelling", "Service"}
)
# Monitor answers that may come from the monitor itself rather than the operation.
_MONITOR_LOST = frozenset({404, 410, 502, 503, 504})
# Message ids that only an operation on blocks gives (never a missing monitor).
_OPERATION_REFUSALS = frozenset(
    {"ResourceBlockInUse", "ResourceBlockNotFound", "IncompatibleZone", "NoResourceMatch"}
)
# How long to wait between task polls when the monitor gives no Retry-After.
_DEFAULT_TASK_POLL = 1.0


class OutcomeUnknown(Exception):
    """A write was accepted but we cannot tell from its answer whether it happened."""


async def outcome(
    transport: RedfishTransport, response: Response, deadline: Deadline, *, poll_max: float
) -> Response:
    """The final answer of a write that succeeded, following a 202 task monitor
    (polled at most ``poll_max`` seconds apart)."""
    if response.status == 202:
        monitor = response.headers.get("Location")
        if not monitor:
            raise OutcomeUnknown("accepted without a task monitor")
        return await _follow_task(transport, monitor, response, deadline, poll_max)
    if not response.ok:
        raise response.refusal()
    return response


async def _follow_task(
    transport: RedfishTransport,
    monitor: str,
    accepted: Response,
    deadline: Deadline,
    poll_max: float,
) -> Response:
    answer = accepted
    while True:
        await asyncio.sleep(_poll_delay(answer, deadline, poll_max))
        answer = await transport.request("GET", monitor, deadline)
        if answer.status != 202 and not _task_running(answer):
            _task_result(answer)
            return answer


def _poll_delay(answer: Response, deadline: Deadline, poll_max: float) -> float:
    asked = retry_after_seconds(answer.headers.get("Retry-After"))
    delay = min(_DEFAULT_TASK_POLL if asked is None else asked, poll_max)
    if delay >= deadline.remaining():
        raise FabricDeadlineExceeded(f"task {answer.path} still running at the deadline")
    return delay


def _task_state(answer: Response) -> Any:
    return dig(parse_body(answer.body), "TaskState")


def _task_running(answer: Response) -> bool:
    return answer.ok and _task_state(answer) in _TASK_RUNNING


def _task_result(answer: Response) -> None:
    """Raise unless a task monitor's final answer says the work was done.

    By DSP0266 the monitor's final answer is the operation's own response, so
    a refusal we know (ResourceBlockInUse, IncompatibleZone, a stale ETag...)
    raises the same error as when the service answers at once: callers need
    not care whether the service works asynchronously. Other failures, and a
    Task that ended in Exception/Killed/Cancelled, raise FabricTaskFailed.
    """
    ids, texts = error_messages(parse_body(answer.body))
    if answer.ok:
        state = _task_state(answer)
        if state in _TASK_FAILED:
            detail = "; ".join(texts) or "no details"
            raise FabricTaskFailed(f"task {answer.path} ended {state}: {detail}", message_ids=ids)
        return
    if answer.status in _MONITOR_LOST and not has_message(ids, _OPERATION_REFUSALS):
        # The monitor is gone or its gateway failed: that says nothing about the work.
        raise OutcomeUnknown(f"task monitor {answer.path} answered {answer.status}")
    refused = answer.refusal()
    if type(refused) is FabricRefused:
        raise FabricTaskFailed(f"task {answer.path} failed: {refused}", message_ids=ids)
    raise refused
