"""The quota decisions, pure.

:func:`check_use` is made inside the claim's transaction, on numbers read under
the user's lock, so concurrent spawns cannot jointly pass a limit (invariant 3).
:func:`check_ask` needs no lock: what one server asks for does not depend on
anybody's use, so the composer makes it before it places anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from composespawner.domain.quotas import Quota
from composespawner.ledger.errors import QuotaExceeded, gpus
from composespawner.ledger.records import ServerUse, server_label


@dataclass(frozen=True)
class Use:
    """What a user holds while they ask for more: read under their lock."""

    servers: Sequence[ServerUse] = ()  # their other live servers
    gpu_hours_week: float = 0.0  # GPU-hours in the last 7 days, live machines' so far included

    @property
    def gpus(self) -> float:
        """GPUs held at once: a share of 1/n counts 1/n."""
        return sum(use.gpus for use in self.servers)

    @property
    def cores(self) -> int:
        return sum(use.cores for use in self.servers)

    @property
    def memory_gib(self) -> int:
        return sum(use.memory_gib for use in self.servers)


def check_ask(user: str, quota: Quota, model: str | None, asked: float) -> None:
    """Raise :class:`QuotaExceeded` unless one server may have ``asked`` GPUs of ``model``."""
    if asked == 0:
        return  # a server without GPUs is within every GPU limit
    models = quota.models
    if model is not None and not quota.allows_model(model):
        allowed = ", ".join(sorted(models.value or ()))
        choose = f"Choose one of: {allowed}." if allowed else "You may not use GPUs at all."
        raise QuotaExceeded(
            user,
            "models",
            models.source,
            f"GPU model {model} is not allowed by {models.source}. {choose}"
            " Ask an admin if your work needs it.",
        )
    per_server = quota.gpus_per_server
    if per_server.value is not None and asked > per_server.value:
        raise QuotaExceeded(
            user,
            "gpus_per_server",
            per_server.source,
            f"You asked for {gpus(asked)} on one server but {per_server.source} allows"
            f" {gpus(per_server.value)} per server. Ask for fewer.",
        )


def check_use(
    user: str, quota: Quota, asked: float, use: Use, *, cores: int = 0, memory_gib: int = 0
) -> None:
    """Raise :class:`QuotaExceeded` if one more server with ``asked`` GPUs, ``cores`` and
    ``memory_gib`` of its host passes a limit.

    Asking for no GPUs passes the GPU limits, so a user at their limit can still
    start a CPU-only server; servers at once counts every server, and cores and
    memory held at once every server's share (a grow asks for none: its server
    holds its share already).
    """
    _check_share(user, quota, use, cores, memory_gib)
    servers = quota.servers
    if servers.value is not None and len(use.servers) + 1 > servers.value:
        running = len(use.servers)
        raise QuotaExceeded(
            user,
            "servers",
            servers.source,
            f"You have {running} server{'s' if running != 1 else ''} running and"
            f" {servers.source} allows {servers.value} at once. Stop one first.",
        )
    if asked == 0:
        return
    _check_gpus_held(user, quota, asked, use)
    hours = quota.gpu_hours_week
    if hours.value is not None and use.gpu_hours_week >= hours.value:
        raise QuotaExceeded(
            user,
            "gpu_hours_week",
            hours.source,
            f"You have used {use.gpu_hours_week:.1f} GPU-hours in the last 7 days and"
            f" {hours.source} allows {hours.value:g}. Hours stop counting 7 days after"
            " they were used; until then you can start a server without GPUs.",
        )


def _check_gpus_held(user: str, quota: Quota, asked: float, use: Use) -> None:
    held = quota.gpus_held
    # Shares sum as floats: nine ninths make 1.0000000000000002. A real excess is at least
    # 1/720720 (sizes up to 16), far above the tolerance.
    if held.value is None or use.gpus + asked <= held.value + 1e-9:
        return
    you_asked = f"You asked for {gpus(asked)}"
    if held.value == 0:
        message = f"{you_asked} but you may not use GPUs ({held.source} allows 0)."
        message += " Ask an admin for access."
    else:
        limit = f"your limit is {gpus(held.value)} at once (from {held.source})"
        if use.gpus == 0:
            message = f"{you_asked} but {limit}. Ask for fewer."
        else:
            servers = ", ".join(
                f"{server_label(u.server)}: {u.gpus:g}" for u in use.servers if u.gpus
            )
            verb = "is" if use.gpus == 1 else "are"
            message = (
                f"{you_asked} but {limit} and {use.gpus:g} {verb} in use ({servers})."
                " Stop a server or ask for fewer."
            )
    raise QuotaExceeded(user, "gpus_held", held.source, message)


def _check_share(user: str, quota: Quota, use: Use, cores: int, memory_gib: int) -> None:
    """Cores and memory held at once, the new server's share included."""
    size = f"the {cores} cores, {memory_gib} GiB size"
    checks = (
        ("cores_held", quota.cores_held, use.cores, cores, "{} cores", "{}"),
        ("memory_gib_held", quota.memory_gib_held, use.memory_gib, memory_gib, "{} GiB", "{} GiB"),
    )
    for name, limit, held, needs, amount, bare in checks:
        if needs == 0 or limit.value is None or held + needs <= limit.value:
            continue
        if held == 0:
            message = (
                f"The {cores} cores, {memory_gib} GiB size needs {amount.format(needs)} but"
                f" {limit.source} allows {bare.format(limit.value)} at once. "
                + ("Ask an admin for more." if limit.value == 0 else "Choose a smaller size.")
            )
        else:
            message = (
                f"You hold {amount.format(held)} of {bare.format(limit.value)} that"
                f" {limit.source} allows; {size} needs {bare.format(needs)}:"
                " choose a smaller size or stop a server."
            )
        raise QuotaExceeded(user, name, limit.source, message)
