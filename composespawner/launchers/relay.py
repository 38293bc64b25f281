"""The hub's services, and only they, carried into notebooks' containers.

A notebook in a container of its own has a network without the host's loopback (its
neighbours' ports, the database, the proxy's API are there), and still needs the hub's
API and the GPU portal at the loopback addresses its environment names. The hub serves
each such address as a Unix socket in one folder (:class:`HubRelays`); the folder is
bind-mounted read-only into every container, where :mod:`.relay_inside` listens on
the same addresses and carries each connection through the socket. Addresses that are
not on loopback need no relay: the container reaches them as the host does.

On a compute host the hub is elsewhere, and its containers reach it as the host does;
only where the hub's URLs are on the host's own loopback (a hub and its hosts on one
machine, as the tests run them) does the host's agent relay them, one notebook's at a
time: ``python -m composespawner.launchers.relay FOLDER HOST:PORT ...`` (:func:`main`)
serves them until its stdin ends, which is when the notebook's podman process ends.

The sockets let any account on the host reach these services, as their loopback ports
already do; the services check each request's token.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from composespawner.launchers.relayed import socket_path

CONNECT_TIMEOUT = 10.0  # seconds to reach a hub service for one relayed connection
CHUNK = 65536
log = logging.getLogger(__name__)


class HubRelays:
    """The hub's Unix sockets, one per relayed address, served on its event loop."""

    # Each socket's server, by path, made once however many starts ask at a time: one
    # server for every launcher of this hub.
    _serving: ClassVar[dict[Path, asyncio.Future[asyncio.AbstractServer]]] = {}
    # The connections being carried, so that a stop ends them too.
    _carrying: ClassVar[set[asyncio.Task[Any]]] = set()

    @classmethod
    async def serve(cls, folder: Path, addresses: Iterable[tuple[str, int]]) -> None:
        """Serve each of ``addresses`` at its socket in ``folder``, where not yet served."""
        for host, port in addresses:
            path = socket_path(folder, host, port)
            serving = cls._serving.get(path)
            if serving is None or not _still_serving(serving):
                serving = asyncio.ensure_future(cls._start(path, host, port))
                cls._serving[path] = serving
            await asyncio.shield(serving)

    @classmethod
    async def stop(cls) -> None:
        """Stop serving every socket served on this loop (a hub's end, a test's)."""
        loop = asyncio.get_running_loop()
        for path, serving in list(cls._serving.items()):
            if serving.get_loop() is not loop:
                continue
            del cls._serving[path]
            if serving.done() and serving.exception() is None:
                server = serving.result()
                server.close()
                await server.wait_closed()
                with contextlib.suppress(OSError):  # a later hub's, or gone already
                    path.unlink()
        carrying = [task for task in cls._carrying if task.get_loop() is loop]
        for task in carrying:
            task.cancel()
        await asyncio.gather(*carrying, return_exceptions=True)

    @classmethod
    async def _start(cls, path: Path, host: str, port: int) -> asyncio.AbstractServer:
        await asyncio.to_thread(_fresh, path)
        server = await asyncio.start_unix_server(
            functools.partial(cls._carry, host=host, port=port), path=str(path)
        )
        os.chmod(path, 0o666)  # the notebooks' accounts connect; the service checks
        atexit.register(_forget_socket, path, server)  # a hub's end leaves no socket behind
        log.info("serving %s:%d to notebooks' containers at %s", host, port, path)
        return server

    @staticmethod
    async def _carry(
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        host: str,
        port: int,
    ) -> None:
        """One notebook's connection, carried to ``host:port`` both ways; ended by a stop
        (its task is the connection's own: cancelled, it ends quietly)."""
        task = asyncio.current_task()
        assert task is not None  # a server's handler runs as a task
        HubRelays._carrying.add(task)
        ends = [client_writer]
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT
            )
            ends.append(writer)
            await asyncio.gather(_pump(client_reader, writer), _pump(reader, client_writer))
        except (OSError, TimeoutError) as e:
            log.warning("cannot relay a notebook's connection to %s:%d: %s", host, port, e)
        except asyncio.CancelledError:
            pass  # the hub stops serving
        finally:
            HubRelays._carrying.discard(task)
            for end in ends:
                end.close()


def _still_serving(serving: asyncio.Future[asyncio.AbstractServer]) -> bool:
    """Whether ``serving`` is under way or serves, on this loop (a test's loop ends)."""
    if serving.get_loop() is not asyncio.get_running_loop():
        return False
    if not serving.done():
        return True
    return serving.exception() is None and serving.result().is_serving()


def _forget_socket(path: Path, server: asyncio.AbstractServer) -> None:
    """At the process's end: the socket of ``server``, if it still serves (a stopped one's
    is gone already, and the path may be a later server's)."""
    if server.is_serving():
        with contextlib.suppress(OSError):
            path.unlink()


def _fresh(path: Path) -> None:
    """The socket's folder made, and an earlier hub's socket there removed."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until it ends, then end ``sink``'s writing."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except OSError:
        sink.close()


async def serve_until_end_of(fd: int, folder: Path, addresses: Sequence[tuple[str, int]]) -> None:
    """Serve ``addresses`` in ``folder``, say so on stdout, and serve until ``fd`` reads
    its end (what is written to it is read and dropped); then stop, the sockets gone."""
    await HubRelays.serve(folder, addresses)
    print("serving", flush=True)
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()

    def readable() -> None:
        try:
            if not os.read(fd, CHUNK):
                ended.set()
        except OSError:
            ended.set()

    loop.add_reader(fd, readable)
    try:
        await ended.wait()
    finally:
        loop.remove_reader(fd)
        await HubRelays.stop()


def main(argv: Sequence[str]) -> int:
    """``FOLDER HOST:PORT ...``: serve each until stdin ends (a host agent's relay for
    one notebook; it holds the pipe's other end, and so does the notebook's podman)."""
    if len(argv) < 2:
        print("usage: relay FOLDER HOST:PORT [HOST:PORT ...]  (ends at the end of stdin)")
        return 2
    folder = Path(argv[0])
    addresses = []
    for word in argv[1:]:
        host, _, port = word.rpartition(":")
        addresses.append((host.strip("[]"), int(port)))
    logging.basicConfig(level=logging.WARNING, format="relay: %(message)s")
    asyncio.run(serve_until_end_of(sys.stdin.fileno(), folder, addresses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
