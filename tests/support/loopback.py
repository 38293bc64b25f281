"""A tornado application served on a free port of 127.0.0.1, in the test's event loop."""

from __future__ import annotations

import asyncio
import ssl

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application


class LoopbackServer:
    """Serves :meth:`application` once started; ``released`` is set at stop, so a
    handler told to hang can wait on it and end with the test."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.released = asyncio.Event()
        self._server: HTTPServer | None = None
        self.port = 0
        self.tls = tls  # None: plain HTTP

    def application(self) -> Application:
        raise NotImplementedError

    def start(self) -> None:
        sockets = bind_sockets(0, "127.0.0.1")
        self._server = HTTPServer(self.application(), ssl_options=self.tls)
        self._server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
