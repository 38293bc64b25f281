"""The GPU portal's endpoints the extension uses, all in one place, called as the client does.

``composespawner.client`` is in every stack (the launchers copy it there) and knows the
portal's address (``$COMPOSE_PORTAL_URL``), this server's name and the token: each call
is the client's, so that authentication, timeouts and the portal's error messages are
its own. Blocking (urllib): the handlers run these in a thread.

Portal endpoints, relative to ``$COMPOSE_PORTAL_URL`` (``{gpus}`` is
``api/me/servers/{server}/gpus``, or ``api/me/server/gpus`` for the default server):

- ``GET {gpus}``: the machine (exists; the extension reads the optional per-GPU
  ``idle_s`` and ``warning`` {``reclaim_at``, ``message``, ``keep_allowed``} when present);
- ``POST {gpus}`` ``{"count": n}``: grow (exists: ``client.grow``);
- ``DELETE {gpus}/{gpu}``: give one GPU back (exists: ``client.shrink``);
- ``POST {gpus}/{gpu}/keep``: *Keep* (``client.keep``; 404 for a GPU the server does not
  hold, 409 with a message when the policy allows no more presses).
"""

from __future__ import annotations

from typing import Any

from composespawner import client

MACHINE_TIMEOUT = 10.0  # seconds; polled every 30 s, so a slow answer is dropped, not queued
MOST_GPUS_AT_ONCE = 8  # one click adds one; more is a typing slip, and the portal's quota decides


def machine() -> dict[str, Any]:
    """The portal's whole answer for this server, as the extension's frontend reads it."""
    return client.machine_json(timeout=MACHINE_TIMEOUT)


def grow(count: int) -> dict[str, Any]:
    """``count`` more GPUs; writes the server's manifest and .env as ``client.grow`` does."""
    return _resized(client.grow(count))


def give_back(gpu: str) -> dict[str, Any]:
    """Give one GPU back; writes the manifest and .env as ``client.shrink`` does."""
    return _resized(client.shrink(gpu))


def keep(gpu: str) -> dict[str, Any]:
    """Press *Keep* for one warned GPU: the portal holds off its reclaim for a while."""
    return {"message": client.keep(gpu)}


def _resized(resized: client.Resized) -> dict[str, Any]:
    return {
        "next_step": resized.next_step,
        "gpus": [{"id": g.id, "model": g.model} for g in resized.machine.gpus],
    }


def grow_count(body: object) -> int:
    """The ``count`` of a grow request; ValueError says what to send."""
    count = body.get("count", 1) if isinstance(body, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MOST_GPUS_AT_ONCE:
        raise ValueError(f'Send {{"count": n}} with n from 1 to {MOST_GPUS_AT_ONCE}.')
    return count


def gpu_named(body: object) -> str:
    """The ``gpu`` id of a give-back or keep request; ValueError says what to send."""
    gpu = body.get("gpu") if isinstance(body, dict) else None
    if not isinstance(gpu, str) or not gpu or len(gpu) > 200:
        raise ValueError('Send {"gpu": "<the GPU\'s id>"}, as GET /compose/machine lists it.')
    return gpu
