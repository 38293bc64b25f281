"""Code run in a real kernel of a running notebook server, as JupyterLab runs it.

Jupyter Server's REST API starts the kernel, its websocket carries one
``execute_request`` and the replies; the kernel is shut down afterwards. The
caller authenticates as the notebook itself, with its own hub token.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Executed:
    stdout: str
    error: str | None  # the traceback, if the code raised


def run_in_kernel(server_url: str, token: str, code: str, timeout: float = 90) -> Executed:
    """Run ``code`` in a new kernel of the notebook server at ``server_url``."""
    return asyncio.run(asyncio.wait_for(_run(server_url, token, code), timeout))


async def _run(server_url: str, token: str, code: str) -> Executed:
    base = server_url.rstrip("/")
    headers = {"Authorization": f"token {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(f"{base}/api/kernels", json={"name": "python3"}) as response:
            assert response.status == 201, await response.text()
            kernel = (await response.json())["id"]
        try:
            async with session.ws_connect(f"{base}/api/kernels/{kernel}/channels") as ws:
                return await _execute(ws, code)
        finally:
            async with session.delete(f"{base}/api/kernels/{kernel}") as response:
                assert response.status == 204, await response.text()


async def _execute(ws: aiohttp.ClientWebSocketResponse, code: str) -> Executed:
    msg_id = uuid.uuid4().hex
    await ws.send_json(
        {
            "header": {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "username": "test",
                "session": uuid.uuid4().hex,
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": {
                "code": code,
                "silent": False,
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            "channel": "shell",
            "buffers": [],
        }
    )
    out: list[str] = []
    error = None
    async for message in ws:
        reply = message.json()
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = reply["msg_type"], reply["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            error = "\n".join(content["traceback"])
        elif kind == "status" and content["execution_state"] == "idle":
            break
    return Executed("".join(out), error)
