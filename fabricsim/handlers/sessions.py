"""The SessionService's sessions: logging in, listing, logging out."""

from __future__ import annotations

from .. import resources, uris
from ..commands import parse_login
from ..errors import AccessUnauthorized, OperationNotAllowed, ResourceMissing
from .base import RedfishHandler


class SessionsHandler(RedfishHandler):
    ALLOW = "GET, HEAD, POST"

    def is_open(self) -> bool:
        return self.request.method == "POST"  # logging in

    def get(self) -> None:
        self.send_resource(resources.session_collection(self.sim.view))

    def post(self) -> None:
        username, password = parse_login(self.request.body)
        if not self.sim.check_credentials(username, password):
            raise AccessUnauthorized()
        session = self.sim.sessions.create(username)
        self.set_header("X-Auth-Token", session.token)
        self.set_header("Location", uris.session_uri(session.id))
        self.send_json(resources.session_resource(session), status=201)


class SessionMembersHandler(SessionsHandler):
    """``POST .../Sessions/Members``: the same as POST to the collection (DSP0266)."""

    ALLOW = "POST"

    def get(self) -> None:
        raise OperationNotAllowed()


class SessionHandler(RedfishHandler):
    ALLOW = "GET, HEAD, DELETE"

    def get(self, session_id: str) -> None:
        self.send_resource(resources.session(self.sim.view, session_id))

    def delete(self, session_id: str) -> None:
        if not self.sim.sessions.delete(session_id):
            raise ResourceMissing(self.request.path)
        self.set_status(204)
        self.finish()
