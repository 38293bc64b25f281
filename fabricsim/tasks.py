"""Asynchronous operations: Redfish tasks and what their monitors answer (pure).

Under ``--async-tasks`` a write answers ``202 Accepted`` with a task monitor
``Location``; the HTTP layer runs the operation when the task's duration has
passed and records its :class:`Outcome` here. Until then the monitor answers
202; afterwards it answers the operation's final response, every time it is
asked (polling twice is harmless).
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from .errors import SimulatorError, message_info

TaskState = Literal["Running", "Completed", "Exception"]
RETAINED_TASKS = 256


@dataclass(frozen=True, slots=True)
class Outcome:
    """The final HTTP answer of an operation: a status and an optional JSON body."""

    status: int
    body: dict[str, Any] | None = None
    location: str | None = None  # a created resource's URI

    @classmethod
    def refused(cls, error: SimulatorError) -> Outcome:
        return cls(error.status, error.body())

    @property
    def succeeded(self) -> bool:
        return self.status < 400


@dataclass(slots=True)
class Task:
    id: str
    name: str
    started: datetime
    due: float  # clock() reading at which the operation runs
    state: TaskState = "Running"
    ended: datetime | None = None
    outcome: Outcome | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.state = "Completed" if outcome.succeeded else "Exception"
        self.ended = datetime.now(UTC)
        self.messages = _outcome_messages(outcome)

    def retry_after_s(self, now: float) -> int:
        """Whole seconds to wait before polling again (HTTP wants an integer)."""
        return max(1, math.ceil(self.due - now))


class TaskStore:
    """The most recent tasks, oldest forgotten first."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tasks: OrderedDict[str, Task] = OrderedDict()

    def create(self, name: str, duration_s: float) -> Task:
        task = Task(
            # Random, so a monitor URI from before a restart never names a new task.
            id=secrets.token_hex(6),
            name=name,
            started=datetime.now(UTC),
            due=self._clock() + duration_s,
        )
        self._tasks[task.id] = task
        while len(self._tasks) > RETAINED_TASKS:
            self._tasks.popitem(last=False)
        return task

    def get(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def all(self) -> list[Task]:
        return list(self._tasks.values())

    def now(self) -> float:
        return self._clock()


def _outcome_messages(outcome: Outcome) -> list[dict[str, Any]]:
    if outcome.succeeded or outcome.body is None:
        return [_task_message(message_info("Success"))]
    infos = outcome.body.get("error", {}).get("@Message.ExtendedInfo", [])
    return [_task_message(info) for info in infos]


def _task_message(info: dict[str, Any]) -> dict[str, Any]:
    # Inside a Task the Message type is implied by the schema.
    return {key: value for key, value in info.items() if key != "@odata.type"}
