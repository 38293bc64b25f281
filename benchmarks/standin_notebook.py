"""A single-user server stand-in for load benchmarks: answers HTTP, nothing else.

JupyterHub counts a server as up once any non-5xx answer comes from the URL in
``JUPYTERHUB_SERVICE_URL``; this answers every GET with 200 there. It imports
only the standard library so that hundreds start in well under a second each
(a real JupyterLab takes 5-10 s here), and it exits at once on SIGINT or
SIGTERM, the signals a local-process spawner stops it with.

Run by the hub as ``python -I path/to/standin_notebook.py [ignored args]``.
"""

from __future__ import annotations

import os
import signal
from functools import cache
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"standin": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        # The hub warns about servers without it (as if they were older than 0.8).
        self.send_header("X-JupyterHub-Version", hub_version())
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet: the hub's log is the one worth reading."""


@cache
def hub_version() -> str:
    from importlib.metadata import version  # only once a request comes

    return version("jupyterhub")


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(0))
    url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
    server = HTTPServer((url.hostname or "127.0.0.1", url.port or 8888), Answer)
    server.serve_forever()


if __name__ == "__main__":
    main()
