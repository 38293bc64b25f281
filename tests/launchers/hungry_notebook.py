"""A notebook stand-in for share tests: answers HTTP, and eats memory or starts a child on request.

Run as ``python -I hungry_notebook.py [PORT [ADDRESS]]`` (without a port: where
``JUPYTERHUB_SERVICE_URL`` says, as a host's agent starts a notebook). ``GET /`` answers ``ok``;
``GET /allocate/N`` takes N MiB more, written (so the pages are really
used), then answers; ``GET /child`` starts a long sleep in a session of its
own (as a kernel outlives a notebook that dies) and answers its pid. SIGTERM
and SIGINT end it at once, as a local spawner stops it.
"""

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

CHUNK = 64 << 20
held: list[bytes] = []


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/allocate/"):
            for _ in range(int(self.path.rsplit("/", 1)[1]) * (1 << 20) // CHUNK):
                held.append(b"\x01" * CHUNK)  # written, not a lazily mapped zero page
            body = f"holding {len(held) * CHUNK >> 20} MiB"
        elif self.path == "/forks":
            body = forks_until_refused()
        elif self.path.startswith("/open/"):
            body = opened(self.path.removeprefix("/open"))
        elif self.path.startswith("/connect/"):
            host, port = self.path.split("/")[2:4]
            body = connected(host, int(port))
        elif self.path.startswith("/tmp/"):
            body = in_tmp(self.path.removeprefix("/tmp/"))
        elif self.path.startswith("/shm/"):
            body = left_in_shared_memory(int(self.path.rsplit("/", 1)[1]))
        elif self.path == "/child":
            child = subprocess.Popen(
                [sys.executable, "-I", "-c", "import time; time.sleep(600)"],
                start_new_session=True,
            )
            body = str(child.pid)
        else:
            body = "ok"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test says what matters."""


def forks_until_refused(most: int = 1000) -> str:
    """Fork until the kernel refuses (at most ``most``: a host without a limit must
    survive its test), then let the children go: how many, and the error."""
    read, write = os.pipe()
    made, said = 0, "none"
    while made < most:
        try:
            pid = os.fork()
        except OSError as e:
            said = errno.errorcode[e.errno]
            break
        if pid == 0:
            os.close(write)
            os.read(read, 1)  # until the parent closes its end
            os._exit(0)
        made += 1
    os.close(write)
    os.close(read)
    for _ in range(made):  # reaped: the next count starts from the notebook alone
        os.wait()
    return f"{made} {said}"


def left_in_shared_memory(mib: int) -> str:
    """A file of ``mib`` MiB in /dev/shm and a System V segment of as many, written, as a
    DataLoader's workers or a crashed multiprocessing pool leave them."""
    with open(f"/dev/shm/cs-hungry-{os.getpid()}-{len(held)}", "wb") as file:
        file.write(b"x" * (mib << 20))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    segment = libc.shmget(0, mib << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    ctypes.memset(libc.shmat(segment, None, 0), 1, mib << 20)
    held.append(b"")  # the next file's name differs
    return f"left {mib} MiB"


def opened(path: str) -> str:
    """Whether ``path`` (a device node) opens: "opened", or the error's name."""
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as e:
        return errno.errorcode[e.errno]
    return "opened"


def connected(host: str, port: int) -> str:
    """Whether a TCP connection to ``host:port`` opens: "connected", or the error's name."""
    try:
        socket.create_connection((host, port), timeout=3).close()
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e))
    return "connected"


def in_tmp(name: str) -> str:
    """``name`` written into /tmp (when given), then what /tmp holds, sorted."""
    if name:
        with open(os.path.join("/tmp", name), "w") as file:
            file.write("secret")
    return " ".join(sorted(os.listdir("/tmp")))


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    if len(sys.argv) > 1:
        address = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"  # a container's: 0.0.0.0
        port = int(sys.argv[1])
    else:  # as a host's agent starts a notebook: where JUPYTERHUB_SERVICE_URL says
        url = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
        address, port = str(url.hostname), int(url.port or 80)
    HTTPServer((address, port), Answer).serve_forever()


if __name__ == "__main__":
    main()
