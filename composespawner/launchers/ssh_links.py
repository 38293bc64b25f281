"""The hub's SSH connections to its compute hosts' agents: one per host, shared.

Every request is a channel of that connection running the agent's forced
command (:mod:`.agent_protocol`): a JSON request written and ended with EOF,
JSON lines read back. One more channel per host stays open for the agent's
``watch``: the exits of that host's notebooks, as they happen, each handed to
the hub (:class:`LinkHooks`). Each time the watch is made, the host's agent is
also asked which notebooks it runs (``list``), and the hub stops those it holds
as ended: a stop or a start that could not reach the host leaves none behind.

A connection that is lost is made again on the next request; the watch is
made again with it, retrying with backoff while the host does not answer.
A channel the host's sshd refuses (its MaxSessions reached) fails that request
only: the connection, and the other requests and the watch on it, live on.
Host keys are checked against the configured ``known_hosts`` only: a host
that is not listed, or shows another key, is never connected to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncssh
from prometheus_client import Counter

from composespawner.launchers.agent_protocol import (
    Done,
    Exited,
    Failed,
    ListNotebooks,
    Progress,
    RefusedReply,
    Reply,
    Request,
    WatchExits,
    encode_request,
    parse_reply,
)

# The command every channel asks for. sshd runs the forced command whatever is
# asked; the agent sees this as SSH_ORIGINAL_COMMAND and refuses anything else.
AGENT_COMMAND = "composespawner-host"
STDERR_KEPT = 2000  # characters of the agent's stderr kept for the hub's log
WATCH_RETRY_FIRST = 1.0  # seconds before the first try to watch a host again
WATCH_RETRY_MOST = 30.0
LIST_TIMEOUT = 30.0  # seconds for the list of a host's notebooks, when its watch is made
CHANNEL_RETRY_FIRST = 0.05  # seconds before asking again for a channel sshd refused
CHANNEL_RETRY_MOST = 1.0

# On the hub's /hub/metrics: the goal is one connection per host, a channel per request.
SSH_CONNECTIONS = Counter(
    "composespawner_ssh_connections", "SSH connections the hub opened to compute hosts"
)
SSH_CHANNELS = Counter(
    "composespawner_ssh_channels",
    "SSH channels the hub opened to compute hosts' agents (one per request, one per watch)",
)

Log = logging.Logger | logging.LoggerAdapter[Any]
ExitCallback = Callable[["LinkSettings", str, int | None], Awaitable[None]]
ListedCallback = Callable[["HostLink", list[str]], Awaitable[None]]


# AES-GCM first: asyncssh makes a cipher object per packet for chacha20-poly1305 (its
# default first choice), and one for good for AES-GCM, which compute hosts run in
# hardware (2 µs a packet here, 15 for chacha20-poly1305). sshd offers both by default.
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


class AgentRefused(Exception):
    """The agent refused the request (nothing was done); the message is its reason."""


class AgentFailed(Exception):
    """The request failed on the host (what was begun is undone); the message says why."""


class AgentUnintelligible(Exception):
    """The agent's answer was not the protocol's (another program, or it crashed)."""


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """Where and how to reach one host's agent: the pool's key."""

    address: str
    port: int
    username: str
    key: str  # path of the hub's private key
    known_hosts: str
    connect_timeout: float
    keepalive_interval: float
    max_sessions: int = 10  # the hosts' sshd MaxSessions (OpenSSH's default)

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class LinkHooks:
    """What a link tells the hub of its host, and asks it."""

    exited: ExitCallback  # a notebook of the host exited (machine id, status)
    # The machine ids of the notebooks the host's agent runs, each time the watch is made.
    listed: ListedCallback
    # Whether the host is still to be watched while it cannot be reached.
    watched: Callable[[LinkSettings], bool] = lambda settings: True


@dataclass
class Counters:
    """SSH work done by this hub process, for its log (and SSH_* for its metrics)."""

    connections: int = 0  # connections opened (a reconnect counts)
    channels: int = 0  # channels opened (requests and watches)


@dataclass
class Trips:
    """What one request cost: channels it opened, connections made while it waited."""

    channels: int = 0
    connections: int = 0


class HostLink:
    """The connection to one host's agent, made on first use and again after a loss.

    With ``hooks`` it watches the host's notebook exits from its first request on (the
    launcher's links); without, it only asks (the reclaimer's, which reads activity).
    """

    counters: ClassVar[Counters] = Counters()

    def __init__(self, settings: LinkSettings, hooks: LinkHooks | None, log: Log) -> None:
        self.settings = settings
        self._hooks = hooks
        self.log = log
        self._connection: asyncssh.SSHClientConnection | None = None
        self._connecting: asyncio.Future[asyncssh.SSHClientConnection] | None = None
        # sshd runs at most MaxSessions channels of a connection at once and refuses
        # the next; the watch holds one for good.
        self._channels = asyncio.Semaphore(max(1, settings.max_sessions - 1))
        self._watch: asyncio.Task[None] | None = None
        self._listing: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        # While true, the host's agent is watching its notebooks on an open channel and
        # would have reported an exit: a poll needs no channel of its own.
        self.watching = False

    # -- the connection ----------------------------------------------------------

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The open connection, made now if there is none.

        Every request that needs it meanwhile waits for the same attempt, and
        fails with it: a host that does not answer costs one connect_timeout,
        not one per request in line.
        """
        if self._connection is not None and not self._connection.is_closed():
            return self._connection
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connected)
        return await asyncio.shield(self._connecting)

    def _connected(self, attempt: asyncio.Future[asyncssh.SSHClientConnection]) -> None:
        self._connecting = None
        if not attempt.cancelled() and attempt.exception() is None:
            self._connection = attempt.result()

    async def _connect(self) -> asyncssh.SSHClientConnection:
        s = self.settings
        began = time.monotonic()
        connection = await asyncio.wait_for(
            asyncssh.connect(
                s.address,
                s.port,
                username=s.username,
                client_keys=[s.key],
                known_hosts=s.known_hosts,
                # Only what the hub's config says: no ~/.ssh/config, ssh-agent or password.
                config=None,
                agent_path=None,
                password=None,
                kbdint_auth=False,
                preferred_auth="publickey",
                connect_timeout=s.connect_timeout,
                keepalive_interval=s.keepalive_interval,
                keepalive_count_max=3,
                encryption_algs=CIPHERS,
            ),
            # connect_timeout covers the handshake; this bounds the whole of it too.
            s.connect_timeout + 1,
        )
        self.counters.connections += 1
        SSH_CONNECTIONS.inc()
        self.log.info(
            "SSH: connected to %s in %.2f s (%d connections opened by this hub)",
            s.where,
            time.monotonic() - began,
            self.counters.connections,
        )
        return connection

    async def close(self) -> None:
        """Stop watching and close the connection (the hub is shutting down, or a test)."""
        for task in (self._watch, self._listing):
            if task is not None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        self._watch = self._listing = None
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
            await connection.wait_closed()

    # -- one request ---------------------------------------------------------------

    async def request(
        self,
        request: Request,
        within: float,
        progress: Callable[[Progress], None] | None = None,
        trips: Trips | None = None,
    ) -> dict[str, Any]:
        """Send ``request``, follow its progress, and return what the agent answered.

        Raises :class:`AgentRefused`, :class:`AgentFailed`, :class:`AgentUnintelligible`,
        TimeoutError (``within`` seconds for the whole), or the connection's error
        (OSError, asyncssh.Error). ``trips`` counts what it took.
        """
        data = encode_request(request)
        trips = trips if trips is not None else Trips()
        connections = self.counters.connections
        try:
            return await self._request(data, within, progress, trips)
        finally:
            trips.connections = self.counters.connections - connections

    async def _request(
        self,
        data: bytes,
        within: float,
        progress: Callable[[Progress], None] | None,
        trips: Trips,
    ) -> dict[str, Any]:
        async with asyncio.timeout(within), self._channel(await self._reached(), trips) as process:
            process.stdin.write(data)
            process.stdin.write_eof()
            async for line in process.stdout:
                if not line.strip():
                    continue  # the end of a channel closed mid-line
                reply = self._parsed(line, process)
                if isinstance(reply, Progress):
                    if progress is not None:
                        progress(reply)
                elif isinstance(reply, Done):
                    return reply.fields
                elif isinstance(reply, RefusedReply):
                    raise AgentRefused(reply.reason)
                elif isinstance(reply, Failed):
                    raise AgentFailed(reply.reason)
            raise AgentUnintelligible(
                f"the agent on {self.settings.where} ended without an answer"
                f" (its stderr: {process.stderr_tail or 'nothing'})"
            )

    async def _reached(self) -> asyncssh.SSHClientConnection:
        """The connection, with the watch on; made again if it is found broken."""
        connection = await self.connection()
        if self._hooks is not None:
            self.ensure_watch()
        return connection

    @asynccontextmanager
    async def _channel(
        self, connection: asyncssh.SSHClientConnection, trips: Trips | None = None
    ) -> AsyncIterator[Channel]:
        """A request's channel (``trips`` given), when one of max_sessions is free; or
        the watch's, which holds the one kept for it."""
        seat = self._channels if trips is not None else _no_wait()
        async with seat, self._opened(connection, trips or Trips()) as channel:
            yield channel

    @asynccontextmanager
    async def _opened(
        self, connection: asyncssh.SSHClientConnection, trips: Trips
    ) -> AsyncIterator[Channel]:
        trips.channels += 1
        try:
            process = await self._refused_channels_retried(connection)
        except (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, OSError) as e:
            if isinstance(e, asyncssh.ChannelOpenError) and not connection.is_closed():
                raise  # the others on the connection go on
            # Lost before the loss was seen (nothing was sent): once more, on a new one.
            connection.close()
            if self._connection is connection:
                self._connection = None
            connection = await self._reached()
            trips.channels += 1
            process = await connection.create_process(AGENT_COMMAND, encoding=None)
        self.counters.channels += 1
        SSH_CHANNELS.inc()
        channel = Channel(process)
        try:
            yield channel
        finally:
            channel.close()

    async def _refused_channels_retried(
        self, connection: asyncssh.SSHClientConnection
    ) -> asyncssh.SSHClientProcess[bytes]:
        """A channel of ``connection``; one sshd refused is asked for again, with a backoff.

        sshd counts a channel against MaxSessions until its session has wound down on
        the host, a moment after the hub saw it end: in a burst (a class stopping at
        once) a channel within max_sessions can be refused ("open failed"). The
        request's own deadline ends the retries.
        """
        delay = CHANNEL_RETRY_FIRST
        while True:
            try:
                return await connection.create_process(AGENT_COMMAND, encoding=None)
            except asyncssh.ChannelOpenError:
                if connection.is_closed():
                    raise
                self.log.info(
                    "SSH: %s refused a channel (sshd's MaxSessions, sessions still closing);"
                    " asking again in %.2f s (keep c.SSHLauncher.max_sessions at or below the"
                    " hosts' MaxSessions)",
                    self.settings.where,
                    delay,
                )
            # A backoff for the host's sessions to wind down, not a wait for a condition.
            await asyncio.sleep(delay)
            delay = min(delay * 2, CHANNEL_RETRY_MOST)

    def _parsed(self, line: bytes, channel: Channel) -> Reply:
        try:
            return parse_reply(line)
        except ValueError as e:
            raise AgentUnintelligible(
                f"the agent on {self.settings.where} answered {e}"
                f" (its stderr: {channel.stderr_tail or 'nothing'})"
            ) from e

    # -- the exits of this host's notebooks -------------------------------------------

    def ensure_watch(self) -> None:
        """Have a channel follow this host's exits (made again while the host is away)."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._watching())

    async def _watching(self) -> None:
        """Until cancelled, or the host is away and runs none of this hub's notebooks (a
        request starts it again)."""
        s, delay, hooks = self.settings, WATCH_RETRY_FIRST, self._hooks
        assert hooks is not None, "a link without hooks watches nothing"
        while True:
            try:
                connection = await self.connection()
                async with self._channel(connection) as channel:
                    # Ended by EOF as every request; the agent then watches until the
                    # channel closes (its stdout's reader gone).
                    channel.stdin.write(encode_request(WatchExits()))
                    channel.stdin.write_eof()
                    delay = WATCH_RETRY_FIRST
                    self._list_soon()  # what ended while it was not watched
                    self.watching = True
                    try:
                        async for line in channel.stdout:
                            reply = self._parsed(line, channel) if line.strip() else None
                            if isinstance(reply, Exited):
                                await self._exited(reply)
                    finally:
                        self.watching = False
                self.log.warning("SSH: %s's exit watch ended; watching again", s.where)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # anything: the watch must outlive it
                if not hooks.watched(self.settings):
                    self.log.info("SSH: %s runs no notebook of this hub; not watched", s.where)
                    return
                self.log.warning(
                    "SSH: cannot watch %s for notebook exits (%s); again in %.0f s"
                    " (meanwhile the hub's polls find them)",
                    s.where,
                    describe(e),
                    delay,
                )
            # A backoff between tries to reach the host, not a wait for a condition.
            await asyncio.sleep(delay)
            delay = min(delay * 2, WATCH_RETRY_MOST)

    async def _exited(self, exit: Exited) -> None:
        assert self._hooks is not None
        try:
            await self._hooks.exited(self.settings, exit.machine, exit.status)
        except Exception:
            self.log.exception("SSH: handling the exit of %s failed", exit.machine)

    def _list_soon(self) -> None:
        if self._listing is None or self._listing.done():
            self._listing = asyncio.ensure_future(self._list())

    async def _list(self) -> None:
        """Hand the hub the notebooks the host runs (once its watch is made)."""
        try:
            answer = await self.request(ListNotebooks(), LIST_TIMEOUT)
            assert self._hooks is not None
            await self._hooks.listed(self, listed_machines(answer))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the next watch lists again
            self.log.warning(
                "SSH: cannot list the notebooks %s runs (%s); listed again when its watch"
                " is made again",
                self.settings.where,
                describe(e),
            )


class Channel:
    """One agent channel: its stdin, its stdout lines, the tail of its stderr kept."""

    def __init__(self, process: asyncssh.SSHClientProcess[bytes]) -> None:
        self._process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.stderr_tail = ""
        # Read as it comes: unread, it would fill the channel's window and stall stdout.
        self._stderr = asyncio.ensure_future(self._read_stderr())

    async def _read_stderr(self) -> None:
        async for chunk in self._process.stderr:
            text = chunk.decode(errors="replace") if isinstance(chunk, bytes) else str(chunk)
            self.stderr_tail = (self.stderr_tail + text)[-STDERR_KEPT:].strip()

    def close(self) -> None:
        self._stderr.cancel()
        with suppress(Exception):
            self._process.close()


@asynccontextmanager
async def _no_wait() -> AsyncIterator[None]:
    yield


def listed_machines(answer: dict[str, Any]) -> list[str]:
    """The machine ids in the agent's answer to ``list``."""
    notebooks = answer.get("notebooks")
    if not isinstance(notebooks, list):
        raise AgentUnintelligible(f"the agent's list has no notebooks: {answer!r:.200}")
    found = (n.get("machine") for n in notebooks if isinstance(n, dict))
    return [machine for machine in found if isinstance(machine, str) and machine]


def describe(error: BaseException) -> str:
    """An error as a log line names it (asyncssh's often have an empty str())."""
    text = str(error) or getattr(error, "reason", "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class HostLinks:
    """Every host link of this hub process, by their settings (one per host)."""

    def __init__(self) -> None:
        self._links: dict[LinkSettings, HostLink] = {}

    def link(self, settings: LinkSettings, hooks: LinkHooks | None, log: Log) -> HostLink:
        link = self._links.get(settings)
        # A link belongs to the event loop it was made on (a test's loop ends with it).
        if link is None or link.loop is not asyncio.get_running_loop():
            link = self._links[settings] = HostLink(settings, hooks, log)
        return link

    async def close(self) -> None:
        links = list(self._links.values())
        self._links.clear()
        for link in links:
            await link.close()
