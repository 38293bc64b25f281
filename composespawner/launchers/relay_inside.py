"""Inside a notebook's container: the hub's services at their loopback addresses, relayed.

A notebook in a container of its own reaches nothing on the host's loopback, and it
must still reach the hub's API (its login, its activity) and the GPU portal at the
addresses its environment names (``http://127.0.0.1:8081/hub/api``). This program,
run by the image's Python as the container's first process under podman's init,
listens on each of those addresses in the container's own network and carries each
connection to a Unix socket the hub serves for that service alone (a folder bind-
mounted read-only: :mod:`.relay`); then it runs the notebook's command and ends with
it, passing on the signals it gets.

Self-contained, and built-in modules only (``_socket``, ``_thread``, ``_signal``, and
``os``), run without ``site``: its source is given to ``python -I -S -c``, so any
stack's image runs it as it is, and it starts in a third of the time ``socket``,
``threading``, ``signal`` and ``subprocess`` would take to import (every notebook's
start pays for it, a class's all at once).

    python -I -S -c SOURCE HOST:PORT=SOCKET [HOST:PORT=SOCKET ...] -- COMMAND ...
"""

from __future__ import annotations

import _signal
import _socket
import _thread
import os
import sys

CHUNK = 65536
SHUT_WR, SHUT_RDWR = 1, 2
FORWARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


def pump(
    source: _socket.socket, sink: _socket.socket, done: _thread.LockType | None = None
) -> None:
    """Copy ``source`` to ``sink`` until it ends (then end ``sink``'s writing), or until
    either fails (then end both, so that the other direction stops too); release
    ``done`` at the end."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
        sink.shutdown(SHUT_WR)
    except OSError:
        for end in (source, sink):
            try:  # noqa: SIM105  # contextlib would cost the start its imports
                end.shutdown(SHUT_RDWR)
            except OSError:
                pass
    finally:
        if done is not None:
            done.release()


def carry(client: _socket.socket, path: str) -> None:
    """One connection: to the hub's socket at ``path``, both ways."""
    upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        back = _thread.allocate_lock()
        back.acquire()
        _thread.start_new_thread(pump, (upstream, client, back))
        pump(client, upstream)
        back.acquire()  # the other direction is done too
    except OSError:
        pass  # the hub is not serving: the notebook sees its connection end
    finally:
        client.close()
        upstream.close()


def serve(listener: _socket.socket, path: str) -> None:
    while True:
        fd, _ = listener._accept()  # type: ignore[attr-defined]  # _socket's: (fd, address)
        client = _socket.socket(fileno=fd)
        _thread.start_new_thread(carry, (client, path))


def listening(host: str, port: int) -> _socket.socket:
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    listener = _socket.socket(family, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    return listener


def main(argv: list[str]) -> int:
    split = argv.index("--")
    for relayed in argv[:split]:
        address, path = relayed.split("=", 1)
        host, port = address.rsplit(":", 1)
        _thread.start_new_thread(serve, (listening(host, int(port)), path))
    command = argv[split + 1 :]
    # A stop that comes before the notebook has started waits for it (blocked here,
    # not in the notebook), then is passed on like any later one.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, FORWARDED)
    notebook = os.posix_spawnp(command[0], command, os.environ, setsigmask=())
    for signum in FORWARDED:
        _signal.signal(signum, lambda number, _frame: os.kill(notebook, number))
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, FORWARDED)
    _, status = os.waitpid(notebook, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
