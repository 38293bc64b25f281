"""Scoring starter-kit submissions on blind data, as challenge platforms do.

A submission is the user's pre-processing and model as one TorchScript module
(what a kit's record cell saves). The portal scores it itself, on data no
notebook can read: each kit's ``score(predict, secret)`` makes its blind set
from a seed drawn from the portal's secret, which never leaves the portal but
on the scorer's standard input. The same model always gets the same score, so
every score on a leaderboard can be checked again from what was submitted.

The scorer (``images/kits/score.py``) runs in the kit's stack environment, as
an unprivileged account, without a network and within a time limit: a
submission is code, if only TorchScript.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import pwd
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from composespawner.domain.catalog import Kit
from composespawner.launchers.accounts import switch_account_command

MAX_MODEL_BYTES = 5 * 1024 * 1024  # the kits' models are tens of kB
SCORE_TIMEOUT = 180.0  # seconds; the kits score in a few


class SubmissionRefused(Exception):
    """A submission that cannot be scored; the message says what to change."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def blind_seed(secret: bytes, kit_id: str) -> int:
    """The seed of a kit's blind data: the same for a kit as long as the secret is."""
    digest = hmac.new(secret, kit_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big")


def read_secret(path: Path) -> bytes:
    """The portal's scoring secret, made (32 random bytes, mode 0600) if missing."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    secret = secrets.token_bytes(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_bytes()
    with os.fdopen(fd, "wb") as file:
        file.write(secret)
    return secret


@dataclass(frozen=True)
class Scorer:
    """Scores submissions in a kit's stack ``python``, as ``account`` (None: this one)."""

    secret: bytes
    account: pwd.struct_passwd | None = None
    timeout: float = SCORE_TIMEOUT

    async def score(self, kit: Kit, python: Path, model: bytes) -> float:
        """The submission's score on ``kit``'s blind data; SubmissionRefused says why not."""
        if not model:
            raise SubmissionRefused("The submission has no model: save one with torch.jit.save.")
        if len(model) > MAX_MODEL_BYTES:
            raise SubmissionRefused(
                f"The model is {len(model):,} bytes; at most {MAX_MODEL_BYTES:,} are scored.",
                status=413,
            )
        with tempfile.TemporaryDirectory(prefix="compose-score-") as folder:
            path = Path(folder) / "model.pt"
            path.write_bytes(model)
            if self.account is not None:
                for owned in (Path(folder), path):
                    os.chown(owned, self.account.pw_uid, self.account.pw_gid)
            return await self._run(kit, python, path)

    async def _run(self, kit: Kit, python: Path, model: Path) -> float:
        script = kit.folder.parent / "score.py"
        # Without a network of its own (as root: unshare needs it), as the account.
        isolate = ["unshare", "--net"] if os.geteuid() == 0 else []
        command = [
            *isolate,
            *switch_account_command(self.account),
            str(python),
            "-I",
            str(script),
            str(kit.folder),
            kit.module,
            str(model),
        ]
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd="/",
        )
        seed = f"{blind_seed(self.secret, kit.id)}\n".encode()
        try:
            out, err = await asyncio.wait_for(process.communicate(seed), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise SubmissionRefused(
                f"Scoring took over {self.timeout:.0f} s: submit a smaller or faster model."
            ) from None
        if process.returncode in (2, 3):  # the scorer's own verdict on the model
            reason = err.decode(errors="replace").strip().splitlines()[-1]
            raise SubmissionRefused(f"Your model could not be scored: {reason}.")
        if process.returncode != 0:
            raise RuntimeError(f"the scorer exited with {process.returncode}: {err[-2000:]!r}")
        return float(json.loads(out.decode().strip().splitlines()[-1])["score"])
