"""The GPU quota decision, pure: the store feeds it numbers read under the user's lock."""

from __future__ import annotations

from collections.abc import Sequence

from composespawner.ledger.errors import QuotaExceeded
from composespawner.ledger.records import ServerUse


def check_gpu_quota(user: str, limit: int | None, asked: int, in_use: Sequence[ServerUse]) -> None:
    """Raise :class:`QuotaExceeded` if ``asked`` more GPUs would take ``user`` past ``limit``.

    ``limit`` None means no limit. Asking for no GPUs never exceeds a quota, so a
    user at their limit can still start a CPU-only server.
    """
    if limit is None or asked == 0:
        return
    if sum(use.gpus for use in in_use) + asked > limit:
        raise QuotaExceeded(user, limit, asked, in_use)
