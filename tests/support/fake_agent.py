"""A compute host's agent behind an in-process SSH server, for the SSH launcher's unit tests.

Strict where the launcher could tell the difference: it pins its own host key
(the launcher's known_hosts must list it), takes only the hub's key, runs only
``composespawner-host`` (anything else is refused, as the real agent does), reads
one request to EOF and checks it with the real :func:`parse_request`; a second
start of a running machine is refused. A watch stays open until the hub closes
its channel and says each exit :meth:`FakeAgent.exit` is told of.

It can hold starts until released (a slow build), refuse or fail the next start,
refuse the next channels as sshd does at MaxSessions, drop every connection
(its sshd restarted), and stop listening until told to again (the host went away).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from composespawner.launchers.agent_protocol import (
    ListNotebooks,
    PollNotebook,
    Refused,
    Request,
    StartNotebook,
    StopNotebook,
    WatchExits,
    parse_request,
    reply,
)

NOTEBOOK_IP = "127.0.0.1"


@dataclass
class FakeAgent:
    folder: Path
    requests: list[Request] = field(default_factory=list)
    running: dict[str, StartNotebook] = field(default_factory=dict)
    connections: int = 0
    refuse_next: str | None = None
    fail_next: str | None = None
    hold: asyncio.Event | None = None  # starts wait for it when set
    prohibit: int = 0  # the next channels refused ("administratively prohibited")
    commands: list[str] = field(default_factory=list)
    open_now: int = 0  # request channels open at once (a watch not counted)
    most_open: int = 0
    _watches: list[asyncssh.SSHServerProcess[bytes]] = field(default_factory=list)
    _server: asyncssh.SSHAcceptor | None = None
    _conns: list[asyncssh.SSHServerConnection] = field(default_factory=list)
    port: int = 0  # 0 until it first listens; the same port after
    _host_key: asyncssh.SSHKey = field(default_factory=lambda: _new_key())
    _client_key: asyncssh.SSHKey = field(default_factory=lambda: _new_key())
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ciphers(self) -> list[str]:
        """The cipher each connection from the hub negotiated (as the host received)."""
        return [str(conn.get_extra_info("recv_cipher")) for conn in self._conns]

    @property
    def key(self) -> Path:
        return self.folder / "hub_key"

    @property
    def known_hosts(self) -> Path:
        return self.folder / "known_hosts"

    async def __aenter__(self) -> FakeAgent:
        self._client_key.write_private_key(str(self.key))
        await self.come_back()
        line = self._host_key.export_public_key().decode().strip()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {line}\n")
        return self

    async def come_back(self) -> None:
        """Listen (again, on the same port): the host is up."""
        agent = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                agent.connections += 1
                agent._conns.append(conn)

            def session_requested(self) -> asyncssh.SSHServerSession[bytes]:
                if agent.prohibit > 0:
                    agent.prohibit -= 1
                    raise asyncssh.ChannelOpenError(
                        asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "open failed"
                    )
                return asyncssh.SSHServerProcess(agent._serve, None, 0, False)

        self._server = await asyncssh.listen(
            "127.0.0.1",
            self.port,
            server_host_keys=[self._host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(
                self._client_key.export_public_key().decode()
            ),
            server_factory=Server,  # its session_requested runs _serve
            encoding=None,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def go_away(self) -> None:
        """Drop every connection and stop listening: the host cannot be reached."""
        self.drop()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def __aexit__(self, *exc: object) -> None:
        await self.go_away()

    def drop(self) -> None:
        """Close every connection, as a host that went away (its sshd restarted)."""
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        self._watches.clear()

    def exit(self, machine: str) -> None:
        """The machine's notebook exited: every open watch says so."""
        self.running.pop(machine, None)
        for watch in self._watches:
            watch.stdout.write(reply(exited=machine, status=None))

    @property
    def watching(self) -> int:
        return len(self._watches)

    async def until(self, check: Callable[[], bool], within: float = 5) -> None:
        """Until ``check()`` holds, looked at after each request the fake serves."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(check)

    async def _note(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _serve(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.commands.append(process.command or "")
        if process.command != "composespawner-host":
            process.stdout.write(reply(ok=False, refused="this key runs composespawner-host only"))
            process.exit(1)
            return
        data = await process.stdin.read()
        try:
            request = parse_request(data)
        except Refused as e:
            process.stdout.write(reply(ok=False, refused=str(e)))
            process.exit(1)
            return
        self.requests.append(request)
        if isinstance(request, WatchExits):
            self._watches.append(process)
            await self._note()
            await process.channel.wait_closed()
            if process in self._watches:
                self._watches.remove(process)
            await self._note()
            return
        await self._note()
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            process.stdout.write(await self._answer(request, process))
        finally:
            self.open_now -= 1
        process.exit(0)
        await self._note()

    async def _answer(self, request: Request, process: asyncssh.SSHServerProcess[bytes]) -> bytes:
        if isinstance(request, StartNotebook):
            return await self._start(request, process)
        if isinstance(request, StopNotebook):
            self.running.pop(request.machine, None)
            return reply(ok=True, status=None)
        if isinstance(request, PollNotebook):
            return reply(ok=True, running=request.machine in self.running, status=None)
        assert isinstance(request, ListNotebooks)
        return reply(ok=True, notebooks=[{"machine": m} for m in self.running])

    async def _start(
        self, request: StartNotebook, process: asyncssh.SSHServerProcess[bytes]
    ) -> bytes:
        if request.machine in self.running:
            return reply(ok=False, refused=f"machine {request.machine} is already running")
        refused, self.refuse_next = self.refuse_next, None
        if refused:
            return reply(ok=False, refused=refused)
        failed, self.fail_next = self.fail_next, None
        if failed:
            return reply(ok=False, error=failed)
        process.stdout.write(reply(progress="building the stack's environment", percent=50))
        if self.hold is not None:
            await self.hold.wait()
        self.running[request.machine] = request
        return reply(ok=True, ip=NOTEBOOK_IP, port=40000 + len(self.running), pid=4242)


def _new_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")
