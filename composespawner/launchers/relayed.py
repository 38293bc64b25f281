"""Which of the hub's services a notebook's container reaches through a relay, and the
command that listens for them inside it: pure, and light (a host agent imports it, and
starts afresh for every request). The relay itself is :mod:`.relay`.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

INSIDE = Path(__file__).with_name("relay_inside.py")


def loopback_addresses(urls: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """The loopback (host, port) pairs of ``urls`` (``localhost`` as 127.0.0.1), each
    once, sorted; URLs elsewhere or without a port their scheme does not give, none."""
    found = set()
    for url in urls:
        parts = urlsplit(url)
        host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
        try:
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
            loopback = host is not None and ipaddress.ip_address(host).is_loopback
        except ValueError:
            continue
        if loopback and port and host is not None:
            found.add((host, port))
    return tuple(sorted(found))


def hub_addresses(env: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """The hub's services on loopback that a notebook's environment names."""
    urls = (env.get("JUPYTERHUB_API_URL", ""), env.get("COMPOSE_PORTAL_URL", ""))
    return loopback_addresses(urls)


def socket_path(folder: Path, host: str, port: int) -> Path:
    """The socket that carries ``host:port`` (an IPv6 host without its colons)."""
    return folder / f"{host.replace(':', '_')}-{port}.sock"


def inside_command(
    folder: Path, addresses: Iterable[tuple[str, int]], command: Iterable[str]
) -> list[str]:
    """The container's command: :mod:`.relay_inside` by the image's Python, then the
    notebook's ``command``."""
    relayed = [f"{host}:{port}={socket_path(folder, host, port)}" for host, port in addresses]
    return ["python", "-I", "-S", "-c", inside_source(), *relayed, "--", *command]


@functools.cache
def inside_source() -> str:
    """:mod:`.relay_inside`'s source, read once."""
    return INSIDE.read_text()
