"""MachineRequest: the validated, typed form of what a user asked for.

Parsing is pure: it takes the raw form fields or REST ``user_options`` and the
catalog and either returns a :class:`MachineRequest` or raises
:class:`RequestError` with a message a person can act on. Nothing here knows
whether the hardware is free; that is placement's question.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from composespawner.domain.catalog import Catalog, GpuModel, Size
from composespawner.domain.cohorts import SizeChoice, StackChoice

FIELDS = ("gpu_model", "gpu_count", "gpu_share", "size", "network", "scratch_gb", "stack", "kit")
# Options people try for a size; the message points them at "size".
_SIZE_WORDS = frozenset({"cores", "cpus", "cpu", "memory", "memory_gib", "mem", "ram"})
# Every field at its longest takes a few hundred bytes. JupyterHub stores what
# it is sent in its own database before the spawner sees it, so anything bigger
# is refused before it can be kept.
MAX_OPTIONS_BYTES = 4096
# Fields a browser or JupyterHub adds to form posts that are not ours to judge.
_FORM_NOISE = frozenset({"_xsrf"})
# JupyterHub's own rule for new server names is a "safe slug"; we re-check
# because the name is written into the fabric's composition tag.
_SERVER_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$", re.IGNORECASE)
# The form's count selector offers a share of one GPU as "1/4" beside the counts.
_FORM_SHARE = re.compile(r"1/([0-9]{1,2})")
_SHARE_LABELS = {2: "½", 3: "⅓", 4: "¼", 8: "⅛"}
_SHARE_WORDS = {
    2: ("half", "halves"),
    3: ("third", "thirds"),
    4: ("quarter", "quarters"),
    8: ("eighth", "eighths"),
}
# Letters whose names start with a vowel sound: "an NVIDIA T4", "an H100", "a T4".
_VOWEL_LETTERS = frozenset("AEFHILMNORSX")


class RequestError(ValueError):
    """Bad input. ``str(err)`` is safe to show the user; ``field`` names the culprit."""

    status = 400

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class OptionsTooLarge(RequestError):
    status = 413


class StackNotAllowed(RequestError):
    """A stack the user's cohorts do not use."""

    status = 403


class SizeNotAllowed(RequestError):
    """A size the user's cohorts do not use."""

    status = 403


@dataclass(frozen=True, slots=True)
class MachineRequest:
    gpu_model: str | None  # catalog GpuModel.id; None for a CPU-only server (gpu_count 0)
    gpu_count: int
    network: str  # catalog NetworkChoice.id
    scratch_gb: int
    stack: str | None = None
    kit: str | None = None  # catalog Kit.id, on its stack
    size: str = "whole"  # catalog Size.id: the share of its host's cores and memory
    gpu_share: int = 1  # n: 1/n of its one GPU, time-sliced with other holders; 1: whole GPUs

    def to_options(self) -> dict[str, Any]:
        """JSON-able ``user_options``; parsing them back gives an equal request.

        Whole GPUs leave ``gpu_share`` out, so options stored before shares stay equal.
        """
        options = {k: v for k, v in asdict(self).items() if v is not None}
        if self.gpu_share == 1:
            del options["gpu_share"]
        return options

    @property
    def gpus(self) -> float:
        """The GPUs this request counts as against a quota: a quarter of one is 0.25."""
        return self.gpu_count / self.gpu_share

    def describe(self, catalog: Catalog) -> str:
        size = catalog.size(self.size)
        room = size.label if size else self.size
        if self.gpu_model is None:
            return f"CPU only, {room}"
        model = catalog.gpu_model(self.gpu_model)
        label = model.label if model else self.gpu_model
        if self.gpu_share > 1:
            return f"{share_phrase(self.gpu_share, label)}, {room}"
        return f"{self.gpu_count} × {label}, {room}"

    def share_of(self, catalog: Catalog) -> Size:
        """The catalog size this request runs in (validated: it is listed)."""
        size = catalog.size(self.size)
        assert size is not None, "request was validated"
        return size


def check_size(options: Mapping[str, Any]) -> None:
    """Refuse options (a form post or ``user_options``) too big to be a request of ours."""
    size = options_size(options)
    if size > MAX_OPTIONS_BYTES:
        raise OptionsTooLarge(
            f"Your spawn options are {size:,} bytes; at most {MAX_OPTIONS_BYTES:,} bytes are"
            f" accepted. Send only {', '.join(FIELDS)}."
        )


def options_size(options: Any) -> int:
    """Bytes of ``options`` as JSON, the way JupyterHub would store them."""
    return len(json.dumps(options, default=str))


def parse_form(
    form: Mapping[str, list[str]], catalog: Catalog, visible_models: Collection[str]
) -> MachineRequest:
    """Parse a spawn-form post (every value a list of strings)."""
    check_size(form)
    fields: dict[str, Any] = {}
    for key, values in form.items():
        if key in _FORM_NOISE:
            continue
        if len(values) != 1:
            raise RequestError(f"Give exactly one value for '{_shown(key)}'.", key)
        fields[key] = values[0]
    return parse_options(_form_share(fields), catalog, visible_models)


def _form_share(fields: dict[str, Any]) -> dict[str, Any]:
    """A form's share as the API's integer ``gpu_share``: forms post strings, and the
    count selector posts a share of one GPU as ``gpu_count=1/4``."""
    chosen = _FORM_SHARE.fullmatch(str(fields.get("gpu_count", "")).strip())
    if chosen:
        if fields.get("gpu_share", chosen[1]) != chosen[1]:
            raise RequestError(
                f"You chose {chosen[0]} of a GPU and gpu_share '{_shown(fields['gpu_share'])}':"
                " choose one share.",
                "gpu_share",
            )
        fields = {**fields, "gpu_count": "1", "gpu_share": chosen[1]}
    share = fields.get("gpu_share")
    if share == "":
        return {k: v for k, v in fields.items() if k != "gpu_share"}
    if isinstance(share, str) and _integer(share) is not None:
        return {**fields, "gpu_share": _integer(share)}
    return fields


def parse_options(
    options: Mapping[str, Any], catalog: Catalog, visible_models: Collection[str]
) -> MachineRequest:
    """Parse ``user_options`` from the REST API (or an already flattened form)."""
    check_size(options)
    unknown = sorted(set(options) - set(FIELDS))
    if unknown:
        shown = ", ".join(f"'{_shown(k)}'" for k in unknown)
        hint = ""
        if _SIZE_WORDS & {str(k).lower() for k in unknown}:
            hint = f' Cores and memory come in sizes: give "size", one of {_size_ids(catalog)}.'
        raise RequestError(
            f"Unknown option {shown}. Allowed options: {', '.join(FIELDS)}.{hint}", unknown[0]
        )
    kit = _kit(options.get("kit"), catalog)
    count = _gpu_count(options.get("gpu_count"), catalog)
    model = _gpu_model(options.get("gpu_model"), count, catalog, visible_models)
    share = _gpu_share(options.get("gpu_share"), count, model, catalog, visible_models)
    return MachineRequest(
        gpu_model=model,
        gpu_count=count,
        gpu_share=share,
        size=_shared_size(_size(options.get("size"), count, catalog), share, catalog),
        network=_network(options.get("network", catalog.networks[0].id), catalog),
        scratch_gb=_scratch(options.get("scratch_gb", 0), catalog),
        stack=_stack_for(kit, options.get("stack"), catalog),
        kit=kit,
    )


def _shared_size(size: str, share: int, catalog: Catalog) -> str:
    """A share's server runs in a share of a host: a whole host would keep the GPU's
    other holders off it, for the price of a fraction."""
    chosen = catalog.size(size)
    if share > 1 and chosen is not None and chosen.whole_host:
        sizes = ", ".join(s.id for s in catalog.sizes if not s.whole_host)
        raise RequestError(
            f"A share of a GPU runs in a share of a host, not in {chosen.label}: choose a"
            f" size ({sizes}), or whole GPUs (gpu_share 1) for a whole host.",
            "size",
        )
    return size


def check_server_name(name: str) -> None:
    """Refuse server names that are not plain slugs (markup, spaces, slashes...)."""
    if name and not _SERVER_NAME.match(name):
        raise RequestError(
            f"Server name '{_shown(name)}' is not allowed: use up to 63 letters, digits,"
            " '.', '_' or '-', starting and ending with a letter or digit.",
            "server_name",
        )


def _gpu_model(value: Any, count: int, catalog: Catalog, visible: Collection[str]) -> str | None:
    if count == 0:
        if value is None or value == "":
            return None
        raise RequestError(
            "A CPU-only server (gpu_count 0) has no GPU model: leave gpu_model out,"
            " or ask for at least one GPU.",
            "gpu_model",
        )
    if value is None or value == "":
        raise RequestError(
            "Choose a GPU model, or ask for 0 GPUs for a CPU-only server.", "gpu_model"
        )
    # Models a user may not use are reported exactly like unknown ones: their
    # existence is not ours to reveal.
    if not isinstance(value, str) or value not in visible or catalog.gpu_model(value) is None:
        choices = ", ".join(m for m in (g.id for g in catalog.gpu_models) if m in visible)
        raise RequestError(
            f"Unknown GPU model '{_shown(value)}'. Choose one of: {choices}.", "gpu_model"
        )
    return value


def _gpu_count(value: Any, catalog: Catalog) -> int:
    top = catalog.max_gpus_per_machine
    count = _integer(value)
    if count is None:
        raise RequestError(
            f"GPU count must be a whole number from 0 (CPU only) to {top}, not '{_shown(value)}'.",
            "gpu_count",
        )
    if not 0 <= count <= top:
        raise RequestError(
            f"GPU count must be from 0 (CPU only) to {top} (the most one machine can hold);"
            f" got {count}.",
            "gpu_count",
        )
    return count


def _gpu_share(
    value: Any, count: int, model_id: str | None, catalog: Catalog, visible: Collection[str]
) -> int:
    """The share size asked for (1: whole GPUs), of a model offered in that size."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(
            "gpu_share is the number of shares one GPU is split into: send an integer such"
            f" as 4 (a quarter of one GPU), or 1 for whole GPUs; not '{_shown(value)}'.",
            "gpu_share",
        )
    if value == 1:
        return 1
    if value < 1:
        raise RequestError(
            f"gpu_share must be 1 (whole GPUs) or a share size such as 4 (a quarter of one"
            f" GPU); got {value}.",
            "gpu_share",
        )
    model = catalog.gpu_model(model_id) if model_id else None
    if model is None or count != 1:
        instead = "leave gpu_share out" if count == 0 else f"gpu_share 1 for {count} whole GPUs"
        raise RequestError(
            f"A share is of exactly one GPU: send gpu_count 1 with gpu_share {value}, or"
            f" {instead}.",
            "gpu_share",
        )
    if value not in model.shares:
        raise RequestError(_share_not_offered(model, value, catalog, visible), "gpu_share")
    return value


def _share_not_offered(
    model: GpuModel, size: int, catalog: Catalog, visible: Collection[str]
) -> str:
    if model.shares:
        words = _listed([share_word(n, plural=True) for n in model.shares], "and")
        return (
            f"{model.label} is offered in {words} (gpu_share {_either(model.shares)}),"
            f" not in {share_word(size, plural=True)}: ask for one of those, or gpu_share 1"
            " for whole GPUs."
        )
    shared = [m for m in catalog.gpu_models if m.shares and m.id in visible]
    elsewhere = "; ".join(f"{m.label} ({m.id}: gpu_share {_either(m.shares)})" for m in shared)
    return f"{model.label} is offered only whole: ask for gpu_share 1" + (
        f", or choose a model offered in shares: {elsewhere}." if shared else "."
    )


def _either(sizes: tuple[int, ...]) -> str:
    return _listed([str(n) for n in sizes], "or")


def _listed(items: list[str], conjunction: str) -> str:
    """Items as a sentence lists them: "2, 4 or 8"."""
    *rest, last = items
    return f"{', '.join(rest)} {conjunction} {last}" if rest else last


def share_label(size: int) -> str:
    """A share of one GPU as a fraction: 4 is "¼"."""
    return _SHARE_LABELS.get(size, f"1/{size}")


def share_word(size: int, *, plural: bool = False) -> str:
    """A share of one GPU as a word: 4 is "quarter" ("quarters")."""
    words = _SHARE_WORDS.get(size, (f"1/{size}-share", f"1/{size}-shares"))
    return words[plural]


def share_phrase(size: int, label: str) -> str:
    """What a share of one GPU of the model ``label`` is: "¼ of an NVIDIA T4"."""
    return f"{share_label(size)} of {_article(label)} {label}"


def _article(label: str) -> str:
    word = label.split()[0] if label.split() else "?"
    # Names in capitals or with digits ("NVIDIA", "H100", "RTX") are read letter by letter.
    spelled = word[:2].isupper() or any(c.isdigit() for c in word)
    if spelled:
        return "an" if word[0].upper() in _VOWEL_LETTERS else "a"
    return "an" if word[0].lower() in "aeiou" else "a"


def _size(value: Any, gpu_count: int, catalog: Catalog) -> str:
    """The size asked for, or the catalog's default for that many GPUs."""
    if value is None or value == "":
        return catalog.default_size(gpu_count).id
    if not isinstance(value, str) or catalog.size(value) is None:
        raise RequestError(
            f"Unknown size '{_shown(value)}'. Choose one of: {_size_ids(catalog)}.", "size"
        )
    return value


def _size_ids(catalog: Catalog) -> str:
    return ", ".join(f"{s.id} ({s.label})" for s in catalog.sizes)


def _network(value: Any, catalog: Catalog) -> str:
    if not isinstance(value, str) or catalog.network(value) is None:
        choices = ", ".join(n.id for n in catalog.networks)
        raise RequestError(
            f"Unknown network choice '{_shown(value)}'. Choose one of: {choices}.", "network"
        )
    return value


def _scratch(value: Any, catalog: Catalog) -> int:
    size = _integer(value)
    if size is None or size not in catalog.scratch_gb:
        choices = ", ".join(str(s) for s in catalog.scratch_gb)
        raise RequestError(
            f"Scratch size must be one of {choices} (GB), not '{_shown(value)}'.", "scratch_gb"
        )
    return size


def settle_stack(request: MachineRequest, catalog: Catalog, choice: StackChoice) -> MachineRequest:
    """The request on the stack it will run on: the one asked for, if the user's
    cohorts use it, or else the first they use (every server has a stack)."""
    usable = [s for s in catalog.stacks if choice.stacks is None or s.id in choice.stacks]
    if request.stack is None:
        if not catalog.stacks:
            return request
        if not usable:
            raise StackNotAllowed(
                f"Your cohort {', '.join(choice.restricted_by)} uses no stack this hub offers"
                " now: ask its staff to choose one in the GPU portal.",
                "stack",
            )
        return replace(request, stack=usable[0].id)
    if all(s.id != request.stack for s in usable):
        labels = ", ".join(s.label for s in usable) or "none this hub offers now"
        raise StackNotAllowed(
            f"Your cohort {', '.join(choice.restricted_by)} uses these stacks only: {labels}."
            " Choose one of them" + (", or a starter kit on one." if catalog.kits else "."),
            "stack",
        )
    return request


def settle_size(
    request: MachineRequest, catalog: Catalog, choice: SizeChoice, *, named: bool
) -> MachineRequest:
    """The request in the size it will run in: the one ``named``, if the user's cohorts
    use it; for a request that named none, the default for its GPU count if they use
    that, else the first size they use."""
    usable = [s for s in catalog.sizes if choice.allows(s.id)]
    cohorts = ", ".join(choice.restricted_by)
    if named:
        if choice.allows(request.size):
            return request
    else:
        chosen = default_size(catalog, request.gpu_count, choice)
        if chosen is not None:
            return replace(request, size=chosen.id)
    if not usable:
        raise SizeNotAllowed(
            f"Your cohort {cohorts} uses no size this hub offers now: ask its staff to"
            " choose one in the GPU portal.",
            "size",
        )
    labels = "; ".join(s.label for s in usable)
    ids = ", ".join(s.id for s in usable)
    raise SizeNotAllowed(
        f"Your cohort {cohorts} uses these sizes only: {labels}."
        f' Choose one of them ("size": {ids}).',
        "size",
    )


def default_size(catalog: Catalog, gpu_count: int, choice: SizeChoice) -> Size | None:
    """The size a request of ``gpu_count`` GPUs that names none runs in, for a user whose
    cohorts allow ``choice`` (the form preselects it): the catalog's default if allowed,
    else the first allowed size; None when the cohorts use no size on offer."""
    default = catalog.default_size(gpu_count)
    if choice.allows(default.id):
        return default
    return next((s for s in catalog.sizes if choice.allows(s.id)), None)


def _stack(value: Any, catalog: Catalog) -> str | None:
    """The stack asked for; None when none was (:func:`settle_stack` picks one)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value not in {s.id for s in catalog.stacks}:
        choices = ", ".join(s.id for s in catalog.stacks) or "none are offered yet"
        raise RequestError(f"Unknown software stack '{_shown(value)}' ({choices}).", "stack")
    return value


def _kit(value: Any, catalog: Catalog) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or catalog.kit(value) is None:
        choices = ", ".join(k.id for k in catalog.kits) or "none are offered"
        raise RequestError(f"Unknown starter kit '{_shown(value)}' ({choices}).", "kit")
    return value


def _stack_for(kit_id: str | None, value: Any, catalog: Catalog) -> str | None:
    """The stack asked for, or the kit's when none was; a kit runs on its own only."""
    kit = catalog.kit(kit_id) if kit_id else None
    if kit is None:
        return _stack(value, catalog)
    if value is None or value == "":
        return kit.stack
    stack = _stack(value, catalog)
    if stack != kit.stack:
        needed = catalog.stack(kit.stack)
        raise RequestError(
            f"The {kit.label} kit runs on the {needed.label if needed else kit.stack} stack:"
            " choose that stack, or no starter kit.",
            "kit",
        )
    return stack


def _integer(value: Any) -> int | None:
    """An int from an int or a string of ASCII digits; bools and floats are not counts."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,6}", value.strip()):
        return int(value)
    return None


def _shown(value: Any) -> str:
    """A value as it may appear inside a message: short, one line, no markup characters."""
    text = str(value).replace("\n", " ")
    text = re.sub(r"[<>&\"'`]", "?", text)
    return text if len(text) <= 40 else text[:37] + "..."
