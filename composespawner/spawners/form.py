"""The spawn form: what one user may ask for, rendered from the composer's offer.

The decisions (which model is pre-selected, which counts are offered, whether
anything can be started) are made here in plain Python; the templates only
lay them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2

from composespawner.domain.catalog import Catalog, GpuModel, Size
from composespawner.domain.offers import Availability
from composespawner.domain.quotas import Quota
from composespawner.domain.request import share_phrase, share_word
from composespawner.services.pool import Offer

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("composespawner", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


@dataclass(frozen=True, slots=True)
class SizeChoice:
    size: Size
    fit_now: int  # how many more servers of this size the hosts have room for now


@dataclass(frozen=True, slots=True)
class ShareChoice:
    """A share of one GPU, offered in the count selector beside the whole-GPU counts."""

    size: int  # 4: a quarter of one GPU
    free: int  # how many shares of this size a new server could get now
    label: str  # "¼ of an NVIDIA T4 16GB — 13 quarters free"

    @property
    def value(self) -> str:
        """What the count selector posts for it (``parse_form`` reads "1/4" as a quarter)."""
        return f"1/{self.size}"


@dataclass(frozen=True, slots=True)
class ModelChoice:
    model: GpuModel
    availability: Availability
    kept: str = ""  # what cohorts' sessions keep of this model from the user, if anything
    own: str = ""  # which of its free GPUs are the user's group's own, or lent to them
    shares: tuple[ShareChoice, ...] = ()  # the shares of one GPU of it on offer

    @property
    def askable(self) -> bool:
        return self.availability.most_to_ask > 0 or any(s.free for s in self.shares)

    @property
    def shares_data(self) -> list[dict[str, Any]]:
        """Its shares for the form's script, which offers them when the model is chosen."""
        return [{"value": s.value, "label": s.label, "free": s.free} for s in self.shares]

    @property
    def shares_text(self) -> str:
        """ "Shares of one GPU: 6 halves, 13 quarters free" ("" when none are offered)."""
        if not self.shares:
            return ""
        free = ", ".join(f"{s.free} {share_word(s.size, plural=s.free != 1)}" for s in self.shares)
        return f"Shares of one GPU: {free} free"


def render_form(
    catalog: Catalog, offer: Offer, previous: Mapping[str, Any], *, from_link: bool = False
) -> str:
    """The form for ``offer``, the user's ``previous`` choices pre-selected where still possible.

    ``from_link``: the choices came from a spawn link, and the form says nothing started yet.
    """
    choices = [
        ModelChoice(
            m,
            offer.free[m.id],
            offer.kept.get(m.id, ""),
            offer.own.get(m.id, ""),
            _share_choices(m, offer.shares_free.get(m.id, {})),
        )
        for m in catalog.gpu_models
        if m.id in offer.free
    ]
    sizes = [SizeChoice(size, offer.sizes_free.get(size.id, 0)) for size in offer.sizes]
    # A CPU-only server needs only room on a host: offered whenever some size fits.
    cpu_only = any(s.fit_now for s in sizes)
    wants_cpu = str(previous.get("gpu_count", "")) == "0"
    chosen = None if wants_cpu and cpu_only else _chosen_model(choices, previous.get("gpu_model"))
    most = chosen.availability.most_to_ask if chosen else 0
    amount = _chosen_amount(previous, chosen)
    count = int(amount.partition("/")[0])
    allowed = offer.stacks.stacks
    stacks = [s for s in catalog.stacks if allowed is None or s.id in allowed]
    kits = [k for k in catalog.kits if any(s.id == k.stack for s in stacks)]
    # A user who chose no kit last time is not given their cohort's again.
    kit = previous.get("kit") if "gpu_count" in previous else offer.stacks.starter_kit
    return _TEMPLATES.get_template("compose_form.html").render(
        catalog=catalog,
        choices=choices,
        cpu_only=cpu_only,
        chosen_model=chosen.model.id if chosen else "",
        counts=range(1, most + 1) if chosen else range(1) if cpu_only else range(0),
        shares=chosen.shares if chosen else (),
        any_shares=any(c.shares for c in choices),
        chosen_count=amount,
        sizes=sizes,
        chosen_size=_chosen_size(catalog, offer, previous.get("size"), count),
        defaults={count: size for count, size in catalog.default_sizes},
        previous=previous,
        stacks=stacks,
        kits=kits,
        chosen_kit=kit if isinstance(kit, str) else "",
        restricted_by=", ".join(offer.stacks.restricted_by),
        quota=_quota_view(offer),
        inventory_age=_age_text(offer.inventory_age),
        from_link=from_link,
    )


def render_unavailable() -> str:
    """The form when no inventory could be read: a banner, and no Start."""
    return _TEMPLATES.get_template("unavailable.html").render()


def _chosen_model(choices: list[ModelChoice], previous: object) -> ModelChoice | None:
    """The previous model if it can still be asked for, else the first that can."""
    askable = [c for c in choices if c.askable]
    return next((c for c in askable if c.model.id == previous), askable[0] if askable else None)


def _chosen_size(catalog: Catalog, offer: Offer, previous: object, count: int) -> str:
    """The previous size if still offered, else the default for the GPU count, else the first."""
    offered = [s.id for s in offer.sizes]
    if isinstance(previous, str) and previous in offered:
        return previous
    default = catalog.default_size(count).id
    return default if default in offered or not offered else offered[0]


def _share_choices(model: GpuModel, free: Mapping[int, int]) -> tuple[ShareChoice, ...]:
    """The shares of ``model`` the offer lists (a size it leaves out is not offered)."""
    return tuple(_share_choice(model, size, free[size]) for size in model.shares if size in free)


def _share_choice(model: GpuModel, size: int, free: int) -> ShareChoice:
    left = f"{free} {share_word(size, plural=free != 1)} free" if free else "none free now"
    return ShareChoice(size, free, f"{share_phrase(size, model.label)} — {left}")


def _chosen_amount(previous: Mapping[str, Any], chosen: ModelChoice | None) -> str:
    """The count selector's choice: the previous share if one is still free, else the
    previous count within what may be asked, else the first free share ("0": CPU only)."""
    if chosen is None:
        return "0"
    free = [s.value for s in chosen.shares if s.free]
    wanted = f"1/{previous.get('gpu_share')}"
    most = chosen.availability.most_to_ask
    if wanted in free or (most == 0 and free):
        return wanted if wanted in free else free[0]
    return str(_chosen_count(previous.get("gpu_count"), most))


def _chosen_count(previous: object, most: int) -> int:
    try:
        count = int(str(previous))
    except ValueError:
        return 1
    return min(max(count, 1), max(most, 1))


def _quota_view(offer: Offer) -> dict[str, Any]:
    quota = offer.quota
    # Shares count as fractions of a GPU: 3.75 left, 0.25 in use.
    return {
        "limit": offer.gpu_limit,
        "in_use": f"{offer.gpus_in_use:g}",
        "left": None if offer.quota_left is None else f"{offer.quota_left:g}",
        "source": quota.gpus_held.source,
        "others": _other_limits(quota),
        "no_gpus": _no_gpus(quota),
    }


def _no_gpus(quota: Quota) -> str:
    """What to tell a user whose quota allows no GPU model at all ("" when it allows some)."""
    models = quota.models
    if models.value is None or models.value:
        return ""
    return (
        f"No GPU models are allowed by {models.source} for now: you can start a"
        " CPU-only server. Ask an admin if your work needs a GPU."
    )


def _other_limits(quota: Quota) -> list[str]:
    """The limits besides GPUs held, one line each, with where each comes from."""
    lines = []
    per_server = quota.gpus_per_server
    if per_server.value is not None:
        lines.append(f"At most {per_server.value} GPUs per server ({per_server.source}).")
    if quota.servers.value is not None:
        lines.append(f"At most {quota.servers.value} servers at once ({quota.servers.source}).")
    if quota.gpu_hours_week.value is not None:
        hours = quota.gpu_hours_week
        lines.append(f"{hours.value:g} GPU-hours per 7 days ({hours.source}).")
    if quota.models.value:  # none at all is said where the models would be
        models = ", ".join(sorted(quota.models.value))
        lines.append(f"GPU models: {models} ({quota.models.source}).")
    return lines


def _age_text(age_s: float | None) -> str:
    """How old the free counts are, for a person; "" when they are fresh."""
    if age_s is None:
        return ""
    if age_s < 90:
        return f"{max(round(age_s), 1)} s ago"
    return f"{round(age_s / 60)} min ago"
