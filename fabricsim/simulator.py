"""The running service behind the handlers: fabric state, sessions, tasks, faults, state file.

No tornado here: a handler hands :class:`Simulator` the work of a write and is
answered through the two methods of :class:`Answering`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from . import resources, uris
from .activity import ActivityBoard
from .commands import Stanza
from .errors import InternalError, SimulatorError
from .faults import FaultSwitch
from .persistence import StateFile
from .quirks import NO_QUIRKS, ServiceQuirks
from .sessions import SessionStore
from .state import CompositionRequest, FabricState
from .tasks import Outcome, Task, TaskStore

log = logging.getLogger("fabricsim")

Work = Callable[[], Outcome]


class Answering(Protocol):
    """What a write is answered through (a request handler)."""

    def send_accepted(self, task: Task) -> None: ...

    def send_outcome(self, outcome: Outcome) -> None: ...


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    username: str = "admin"
    password: str = "fabric-password"
    async_tasks: bool = False  # answer writes of blocks and systems with 202 + task monitor
    task_duration_s: float = 0.2
    faults_api: bool = False  # serve /sim/faults, /sim/state and /sim/activity
    session_timeout_s: int = 1800
    quirks: ServiceQuirks = NO_QUIRKS  # answer like an older or looser service


class Simulator:
    """The running service: fabric state, sessions, tasks, faults, state file."""

    def __init__(
        self,
        state: FabricState,
        config: SimulatorConfig,
        *,
        state_file: StateFile | None = None,
    ) -> None:
        self.state = state
        self.config = config
        self.state_file = state_file
        self.sessions = SessionStore(timeout_s=config.session_timeout_s)
        self.tasks = TaskStore()
        self.faults = FaultSwitch()
        self.activity = ActivityBoard()  # what the GPUs do, as the hosts' DCGM exporters say
        self._next_save: asyncio.Future[None] | None = None

    @property
    def view(self) -> resources.ServiceView:
        return resources.ServiceView(
            self.state, self.sessions, self.tasks, self.config.session_timeout_s, self.config.quirks
        )

    def describe_quirks(self) -> list[str]:
        """How this service departs from DMTF's current mockups, for its log."""
        quirks = self.config.quirks
        described = [f"not expandable: {h}" for h in sorted(self.state.not_expandable)]
        if quirks.zone_capabilities:
            described.append("composition advertised on resource zones")
        if quirks.composed_blocks_read_only:
            described.append("composed systems' blocks read-only")
        if quirks.stale_block_status:
            described.append("stale block status")
        if quirks.error_bodies != "redfish":
            described.append(f"{quirks.error_bodies} error bodies")
        return described

    def check_credentials(self, username: str, password: str) -> bool:
        user_ok = secrets.compare_digest(username.encode(), self.config.username.encode())
        password_ok = secrets.compare_digest(password.encode(), self.config.password.encode())
        return user_ok and password_ok

    def run(self, work: Work) -> Outcome:
        """Do a task's write now; the answer it gets. Saves the state when it changed."""
        outcome, changed = _apply(work)
        if changed:
            self.save()
        return outcome

    def start_task(self, name: str, work: Work) -> Task:
        """Do ``work`` after the task duration, as a Redfish task."""
        task = self.tasks.create(name, self.config.task_duration_s)
        asyncio.get_running_loop().call_later(
            self.config.task_duration_s, self._finish_task, task, work
        )
        return task

    def _finish_task(self, task: Task, work: Work) -> None:
        if self.faults.settings.task_failure:
            task.finish(Outcome.refused(InternalError()))
        else:
            task.finish(self.run(work))
        log.info("task %s (%s) ended: %s", task.id, task.name, task.state)

    def compose(self, request: CompositionRequest) -> Outcome:
        system_id = self.state.compose_system(request)
        created = resources.system(self.view, system_id)
        return Outcome(201, created, location=uris.system_uri(system_id))

    def decompose(self, system_id: str, if_match: str | None = None) -> Outcome:
        self.state.decompose_system(system_id, if_match=if_match)
        return Outcome(204)

    def apply_manifest(self, stanzas: list[Stanza]) -> Outcome:
        """CompositionService.Compose with RequestType Apply: every stanza, or none."""
        undo: list[Callable[[], None]] = []
        answers = []
        try:
            for stanza in stanzas:
                answers.append(self._apply_stanza(stanza, undo))
        except SimulatorError:
            for step in reversed(undo):
                step()
            raise
        return Outcome(200, resources.compose_response(answers))

    def _apply_stanza(self, stanza: Stanza, undo: list[Callable[[], None]]) -> dict[str, Any]:
        state = self.state
        if stanza.compose is not None:
            system_id = state.compose_system(stanza.compose)

            def take_apart() -> None:
                state.decompose_system(system_id)

            undo.append(take_apart)
            kind, response = "ComposeSystem", resources.system(self.view, system_id)
        else:
            assert stanza.decompose is not None
            system_id = stanza.decompose
            response = resources.system(self.view, system_id)
            gone, tag = state.decompose_system(system_id)
            undo.append(lambda: state.restore_system(system_id, gone, tag))
            kind = "DecomposeSystem"
        return {"StanzaType": kind, "StanzaId": stanza.stanza_id, "Response": response}

    async def write(self, handler: Answering, name: str, work: Work) -> None:
        """Answer a write once it is saved, or with 202 and a task monitor under --async-tasks."""
        if self.config.async_tasks:
            handler.send_accepted(self.start_task(name, work))
            return
        outcome, changed = _apply(work)
        if changed:
            await self.saved()
        handler.send_outcome(outcome)

    def save(self) -> None:
        if self.state_file is not None:
            self.state_file.save(self.state.to_json())

    async def saved(self) -> None:
        """Save the state, once for all the changes made in this turn of the loop.

        A group commit: under a burst of writes (a spawn storm attaches hundreds
        of devices) one save serves every write of a turn, where a save per write
        spent most of the simulator's time rewriting the same file. Each write is
        still answered only once its change is in the file.
        """
        if self.state_file is None:
            return
        if self._next_save is None:
            loop = asyncio.get_running_loop()
            self._next_save = loop.create_future()
            loop.call_soon(self._save_now)
        # Shielded: a writer whose client went away must not cancel the others' save.
        await asyncio.shield(self._next_save)

    def _save_now(self) -> None:
        done, self._next_save = self._next_save, None
        assert done is not None
        try:
            self.save()
        except Exception as err:  # each waiting writer answers it (a 500)
            done.set_exception(err)
        else:
            done.set_result(None)


def _apply(work: Work) -> tuple[Outcome, bool]:
    """Do a write: its answer, and whether it changed the state (a refusal changes nothing)."""
    try:
        return work(), True
    except SimulatorError as err:
        return Outcome.refused(err), False
