"""Inside a notebook's container: the hub's services at their loopback addresses, relayed.

A notebook in a container of its own reaches nothing on the host's loopback, and it
must still reach the hub's API (its login, its activity) and the GPU portal at the
addresses its environment names (``http://127.0.0.1:8081/hub/api``). This program,
run by the image's Python as the container's first process under podman's init,
listens on each of those addresses in the container's own network and carries each
connection to a Unix socket the hub serves for that service alone (a folder bind-
mounted read-only: :mod:`.relay`); then it runs the notebook's command and ends with
it, passing on the signals it gets.

Standard library only, and self-contained: its source is given to ``python -c``, so
any stack's image runs it as it is.

    python -I -c SOURCE HOST:PORT=SOCKET [HOST:PORT=SOCKET ...] -- COMMAND ...
"""

import contextlib
import signal
import socket
import subprocess
import sys
import threading

CHUNK = 65536


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until it ends (then end ``sink``'s writing), or until
    either fails (then end both, so that the other direction stops too)."""
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def carry(client: socket.socket, path: str) -> None:
    """One connection: to the hub's socket at ``path``, both ways."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
    except OSError:
        pass  # the hub is not serving: the notebook sees its connection end
    finally:
        client.close()
        upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=carry, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    split = argv.index("--")
    for relayed in argv[:split]:
        address, path = relayed.split("=", 1)
        host, port = address.rsplit(":", 1)
        listener = socket.create_server((host, int(port)))
        threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    notebook = subprocess.Popen(argv[split + 1 :])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: notebook.send_signal(number))
    status = notebook.wait()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
