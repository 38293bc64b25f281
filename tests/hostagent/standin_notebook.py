"""A notebook stand-in for the host agent's tests: answers HTTP where the hub said.

It listens on the host and port of ``JUPYTERHUB_SERVICE_URL`` (as
jupyterhub-singleuser does, which the agent rewrites to the host's address and
the port it chose) and answers every GET with 200 and ``ok``. SIGTERM ends it
at once, as a stop sends it. Standard library only: it runs as a fresh account.
"""

import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        data = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    url = urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = HTTPServer((url.hostname or "", url.port or 0), Answer)
    print(f"listening on {url.hostname}:{url.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
