"""Systems and what changes them: composing, decomposing, tagging, attaching and
detaching blocks, the Compose action, and the task monitors of those writes."""

from __future__ import annotations

from .. import resources, uris
from ..commands import (
    parse_block_command,
    parse_compose_action,
    parse_system_create,
    parse_system_patch,
)
from ..composed import BLOCKS_PATH
from ..errors import (
    ETagMismatch,
    InternalError,
    OperationNotAllowed,
    PropertyNotWritable,
    ResourceMissing,
)
from ..simulator import Simulator
from ..tasks import Outcome
from .base import RedfishHandler


class SystemsHandler(RedfishHandler):
    """The Systems collection; POST composes a system under specific composition."""

    def initialize(self, simulator: Simulator) -> None:
        super().initialize(simulator)
        self.ALLOW = "GET, HEAD, POST" if self._creates() else "GET, HEAD"

    def _creates(self) -> bool:
        return self.sim.state.composition == "specific"

    def get(self) -> None:
        self.send_resource(resources.system_collection(self.sim.view))

    async def post(self) -> None:
        if not self._creates():
            raise OperationNotAllowed()
        request = parse_system_create(self.request.body)
        check_attachments(self.sim, request.blocks)
        await self.sim.write(self, f"compose {request.name}", lambda: self.sim.compose(request))

    def _not_allowed(self) -> None:
        raise OperationNotAllowed()

    put = patch = delete = _not_allowed


class SystemHandler(RedfishHandler):
    ALLOW = "GET, HEAD, PATCH"

    def initialize(self, simulator: Simulator) -> None:
        super().initialize(simulator)
        if not simulator.state.expandable:
            self.ALLOW = "GET, HEAD, PATCH, DELETE"

    async def delete(self, system_id: str) -> None:
        """Decompose a composed system; hosts of expandable mode stay.

        ``If-Match`` is optional here, but honoured: a client may take a system
        apart only if nobody changed it since it read it (412 otherwise).
        """
        if not self.sim.state.has_system(system_id):
            raise ResourceMissing(self.request.path)
        if self.sim.state.expandable:
            raise OperationNotAllowed()
        if_match = self._if_match()
        # Checked now, so an asynchronous DELETE is refused at once; and again in the task.
        self.sim.state.check_if_match(system_id, if_match, required=False)
        await self.sim.write(
            self, f"decompose {system_id}", lambda: self.sim.decompose(system_id, if_match)
        )

    def get(self, system_id: str) -> None:
        self.send_resource(resources.system(self.sim.view, system_id))

    async def patch(self, system_id: str) -> None:
        """The mark and/or the whole block list, as one write.

        Answered at once (200 and the system), except that under
        ``--async-tasks`` a PATCH that names blocks attaches and detaches
        them in a task (202), as the block actions do; what can be refused
        at once still is.
        """
        readable = resources.system(self.sim.view, system_id)
        if readable is None or system_id == "Capabilities":
            raise ResourceMissing(self.request.path)
        patch = parse_system_patch(self.request.body, readable)
        if patch.blocks is not None:
            if not resources.blocks_writable(self.sim.view, system_id):
                raise PropertyNotWritable(BLOCKS_PATH)
            attaching = set(patch.blocks) - set(self.sim.state.system_blocks(system_id))
            check_attachments(self.sim, tuple(sorted(attaching)))
        if_match = self._if_match()
        patch.check(self.sim.state, system_id, if_match)

        def work() -> Outcome:
            patch.apply(self.sim.state, system_id, if_match)
            return Outcome(200, resources.system(self.sim.view, system_id))

        if patch.blocks is not None:
            await self.sim.write(self, f"patch {system_id}", work)
            return
        work()  # a mark alone is a quick write: never a task
        await self.sim.saved()
        self.send_resource(resources.system(self.sim.view, system_id))

    def _if_match(self) -> str | None:
        """The request's If-Match; refused as stale under the stale_etags fault."""
        if_match = self.request.headers.get("If-Match")
        if if_match is not None and self.sim.faults.settings.stale_etags:
            raise ETagMismatch()
        return if_match


class ActionHandler(RedfishHandler):
    """``POST /Systems/{id}/Actions/ComputerSystem.{Add,Remove}ResourceBlock``."""

    ALLOW = "POST"

    async def post(self, system_id: str, action: str) -> None:
        command = parse_block_command(system_id, action, self.request.body)
        command.check(self.sim.state)
        if command.action == uris.ADD_RESOURCE_BLOCK and self.sim.faults.attachment_fails():
            raise InternalError()
        if command.gives_etags and self.sim.faults.settings.stale_etags:
            raise ETagMismatch()

        def work() -> Outcome:
            command.apply(self.sim.state)
            return Outcome(204)

        await self.sim.write(self, f"{command.action} {command.block_id}", work)


class ComposeActionHandler(RedfishHandler):
    """``POST .../Actions/CompositionService.Compose``, where the service offers it."""

    ALLOW = "POST"

    async def post(self) -> None:
        if self.sim.state.composition != "action":
            raise ResourceMissing(self.request.path)
        stanzas = parse_compose_action(self.request.body)
        for stanza in stanzas:
            if stanza.compose is not None:
                check_attachments(self.sim, stanza.compose.blocks)
        await self.sim.write(self, "compose manifest", lambda: self.sim.apply_manifest(stanzas))


def check_attachments(simulator: Simulator, blocks: tuple[str, ...]) -> None:
    """The fail-after-k-attachments fault, counting each device a composition takes."""
    for block_id in blocks:
        if not simulator.state.is_host_block(block_id) and simulator.faults.attachment_fails():
            raise InternalError()


class TaskMonitorHandler(RedfishHandler):
    """A task monitor: 202 while the task runs, then the operation's final answer."""

    ALLOW = "GET"

    def get(self, task_id: str) -> None:
        task = self.sim.tasks.get(task_id)
        if task is None:
            raise ResourceMissing(self.request.path)
        if task.outcome is None:
            self.send_accepted(task)
        else:
            self.send_outcome(task.outcome)
