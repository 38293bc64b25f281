"""The spawn form says what may be asked for, and why not when nothing may.

Rendered from real placement numbers (``availability`` over a small pool) with
the demo's catalog and templates, then read back as HTML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path

from composespawner.domain.catalog import Catalog
from composespawner.domain.cohorts import StackChoice
from composespawner.domain.hardware import CompositionTag, Device, Host, HostMark, Inventory, Share
from composespawner.domain.offers import availability, sizes_free
from composespawner.domain.placement import Pool, pool_for
from composespawner.domain.quotas import Quota, QuotaRule, effective_quota
from composespawner.domain.rooms import HostUse
from composespawner.services.pool import Offer
from composespawner.spawners.form import render_form, render_unavailable

CATALOG = Catalog.from_file(Path(__file__).resolve().parents[2] / "hub_config" / "catalog.toml")
T4, A100 = "NVIDIA T4", "NVIDIA A100 80GB PCIe"


def gpus(model: str, zone: str, n: int) -> tuple[Device, ...]:
    return tuple(
        Device(f"{zone}-{model}-{i}", "gpu", model, frozenset({zone}), zone, "free")
        for i in range(n)
    )


def host(system: str, zone: str, busy: bool = False) -> Host:
    attached = ("elsewhere",) if busy else ()
    return Host(system, f"{system}-b", frozenset({zone}), 64, 512, "enabled", attached)


def offer(
    inventory: Inventory, *, in_use: int = 0, limit: int | None = 4, pool: Pool | None = None
) -> Offer:
    """What Composer.offer computes, for the demo catalog's T4 and A100."""
    pool = pool or pool_for(inventory, held=(), owners={}, groups=())
    quota_left = None if limit is None else max(limit - in_use, 0)
    free = {
        m.id: availability(
            pool,
            m.fabric_models,
            label=m.label,
            per_machine_cap=CATALOG.max_gpus_per_machine,
            quota_left=quota_left,
        )
        for m in CATALOG.gpu_models
        if m.id in ("t4", "a100")
    }
    return Offer(free=free, gpus_in_use=in_use, quota=Quota.site_default(limit))


@dataclass
class Form(HTMLParser):
    """The parts of the rendered form a person acts on."""

    models: dict[str, dict[str, str | None]] = field(default_factory=dict)  # radio attributes
    counts: list[str] = field(default_factory=list)  # the count selector's options
    count_disabled: bool = False
    count_labels: dict[str, str] = field(default_factory=dict)  # option value → its text
    count_closed: list[str] = field(default_factory=list)  # disabled options
    count_chosen: str | None = None
    notes: dict[str, str] = field(default_factory=dict)  # model id → its free/why text
    ids: set[str] = field(default_factory=set)
    # stack and kit: each select's options, and which is selected
    choices: dict[str, list[str]] = field(default_factory=dict)
    selected: dict[str, str] = field(default_factory=dict)
    _note_of: str | None = None
    _in_count: bool = False
    _count_option: str | None = None
    _select: str | None = None

    def __post_init__(self) -> None:
        super().__init__()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "input" and a.get("name") == "gpu_model" and a.get("type") == "radio":
            self.models[str(a["value"])] = a
        elif tag == "select" and a.get("name") == "gpu_count":
            self.count_disabled = "disabled" in a
            self._in_count = True
        elif tag == "select":
            self._select = str(a.get("name"))
            self.choices[self._select] = []
        elif tag == "option" and self._select:
            self.choices[self._select].append(str(a.get("value")))
            if "selected" in a:
                self.selected[self._select] = str(a.get("value"))
        elif tag == "option" and self._in_count:
            self._count_option = str(a.get("value"))
            self.counts.append(self._count_option)
            self.count_labels[self._count_option] = ""
            if "disabled" in a:
                self.count_closed.append(self._count_option)
            if "selected" in a:
                self.count_chosen = self._count_option
        elif tag == "span" and "compose-free" in (a.get("class") or ""):
            self._note_of = str(a["data-model"])
            self.notes[self._note_of] = ""

    def handle_data(self, data: str) -> None:
        if self._note_of:
            self.notes[self._note_of] += data
        if self._count_option is not None:
            self.count_labels[self._count_option] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._note_of = None
        if tag == "option":
            self._count_option = None
        if tag == "select":
            self._in_count = False
            self._select = None

    def enabled(self) -> list[str]:
        return [m for m, a in self.models.items() if "disabled" not in a]

    def checked(self) -> list[str]:
        return [m for m, a in self.models.items() if "checked" in a]

    def note(self, model: str) -> str:
        return " ".join(self.notes[model].split())


def read(html: str) -> Form:
    form = Form()
    form.feed(html)
    return form


def render(inventory: Inventory, previous: dict[str, object] | None = None, **kw: int) -> Form:
    return read(render_form(CATALOG, offer(inventory, **kw), previous or {}))


def test_no_free_host_shows_the_model_disabled_with_the_reason() -> None:
    inventory = Inventory(
        hosts=(host("h1", "r1", busy=True), host("h2", "r2")),
        devices=(*gpus(T4, "r1", 8), *gpus(A100, "r2", 2)),
        zones=("r1", "r2"),
    )
    form = render(inventory)
    assert form.enabled() == ["a100"]
    assert form.note("t4") == "No free host in a rack with free NVIDIA T4 16GB GPUs right now:" + (
        " choose another model or try again when a server stops."
    )
    assert "8 free" not in form.note("t4")
    assert form.note("a100") == "2 free · up to 2 per machine"
    assert form.checked() == ["a100"]
    assert form.counts == ["1", "2"]


def test_one_gpu_of_quota_left_offers_a_count_of_one() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 8), zones=("r1",))
    form = render(inventory, {"gpu_model": "t4", "gpu_count": 3}, in_use=3)
    assert form.checked() == ["t4"]
    assert form.counts == ["1"]
    assert form.note("t4") == "8 free · up to 4 per machine · 1 within your quota"
    assert form.models["t4"]["data-most"] == "1"


def test_quota_used_up_disables_every_model_and_the_count() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 8), zones=("r1",))
    form = render(inventory, in_use=4)
    assert form.enabled() == []
    assert form.checked() == []
    assert form.note("t4").startswith("Your GPU quota is used up: stop one of your servers")
    assert form.count_disabled
    assert form.counts == []


def test_without_a_limit_the_count_follows_the_machine() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    form = render(inventory, limit=None)
    assert form.counts == ["1", "2", "3"]


def test_the_quota_says_where_each_limit_comes_from_as_text() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    cohort = "<b>cs-101</b>"
    rules = [
        QuotaRule("site", gpus_held=0),
        QuotaRule("cohort", cohort, gpus_per_server=1, models=frozenset({"t4"}), servers=2),
    ]
    quota = effective_quota(rules, "u", {cohort})
    html = " ".join(render_form(CATALOG, replace(offer(inventory), quota=quota), {}).split())
    assert (
        "<strong>0</strong> of 0 GPUs left (0 in use by your other servers), from the site default."
        in html
    )
    assert "At most 1 GPUs per server (cohort &lt;b&gt;cs-101&lt;/b&gt;)." in html
    assert "At most 2 servers at once (cohort &lt;b&gt;cs-101&lt;/b&gt;)." in html
    assert "GPU models: t4 (cohort &lt;b&gt;cs-101&lt;/b&gt;)." in html
    assert "<b>cs-101" not in html


def test_an_old_inventory_says_how_old() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    aged = replace(offer(inventory), inventory_age=40.2)
    html = render_form(CATALOG, aged, {})
    assert "Free counts as of 40 s ago: the GPU fabric is slow to answer." in " ".join(html.split())
    assert "compose-stale" not in render_form(CATALOG, offer(inventory), {})


def test_the_unavailable_banner_takes_start_away() -> None:
    form = read(render_unavailable())
    assert "compose-unavailable" in form.ids
    assert 'setAttribute("disabled"' in render_unavailable()


def test_a_cohorts_stacks_and_kit_shape_the_form() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 1), zones=("r1",))
    anyone = read(render_form(CATALOG, offer(inventory), {}))
    assert anyone.choices["stack"] == ["pytorch", "tensorflow"]
    assert anyone.choices["kit"] == ["", "digits", "eeg-seizures", "pathology"]
    assert "kit" not in anyone.selected  # None, the first

    course = StackChoice(frozenset({"pytorch"}), "eeg-seizures", ("cs-101",))
    member = read(render_form(CATALOG, replace(offer(inventory), stacks=course), {}))
    assert member.choices["stack"] == ["pytorch"]
    assert member.selected["kit"] == "eeg-seizures"  # the cohort's
    # Who started without a kit before is not given the cohort's again.
    before = {"gpu_model": "t4", "gpu_count": 1}
    again = read(render_form(CATALOG, replace(offer(inventory), stacks=course), before))
    assert "kit" not in again.selected

    other = StackChoice(frozenset({"tensorflow"}), None, ("cs-102",))
    tf_only = read(render_form(CATALOG, replace(offer(inventory), stacks=other), {}))
    assert tf_only.choices["stack"] == ["tensorflow"]
    assert "kit" not in tf_only.choices  # every kit runs on PyTorch


def test_a_quota_that_allows_no_gpu_model_says_so_where_the_models_would_be() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    rules = [QuotaRule("cohort", "cs-101", models=frozenset())]
    quota = effective_quota(rules, "u", {"cs-101"})
    closed = replace(offer(inventory), free={}, quota=quota)
    html = " ".join(render_form(CATALOG, closed, {}).split())
    form = read(render_form(CATALOG, closed, {}))
    assert list(form.models) == [""]  # only a CPU-only server (here: no host room offered)
    assert "compose-no-gpus" in form.ids
    assert "No GPU models are allowed by cohort cs-101 for now" in html
    assert "compose-no-gpus" not in render_form(CATALOG, offer(inventory), {})


def sized_offer(inventory: Inventory, use: dict[str, HostUse] | None = None) -> Offer:
    """An offer with the demo catalog's sizes and what fits of each on ``inventory``."""
    pool = pool_for(inventory, held=(), owners={}, groups=(), hub="hub", use=use or {})
    shares = {s.id: None if s.whole_host else Share(s.cores, s.memory_gib) for s in CATALOG.sizes}
    fits = sizes_free(pool, shares)
    return replace(offer(inventory, pool=pool), sizes=CATALOG.sizes, sizes_free=fits)


def test_sizes_show_what_fits_now_and_the_default_for_the_count() -> None:
    marked = HostMark("hub", (CompositionTag("hub", "m", "u/"),))
    busy = Host("h1", "h1-b", frozenset({"r1"}), 64, 512, "enabled", mark=marked)
    inventory = Inventory(hosts=(busy,), devices=gpus(T4, "r1", 3), zones=("r1",))
    use = {"h1": HostUse(cores=60, memory_gib=100, slots=0, machines=1)}
    html = render_form(CATALOG, sized_offer(inventory, use), {"gpu_model": "t4", "gpu_count": 1})
    form = read(html)
    assert form.choices["size"] == ["small", "medium", "large", "xlarge", "whole"]
    assert form.selected["size"] == "medium"  # the demo's default for one GPU
    text = " ".join(html.split())
    assert "2 cores, 8 GiB — room for 2 now" in text  # 4 cores left on the one host
    assert "8 cores, 64 GiB — no host has room now" in text
    assert form.checked() == ["t4"]


def test_a_cpu_only_server_is_offered_and_kept_as_chosen() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=(), zones=("r1",))
    form = read(render_form(CATALOG, sized_offer(inventory), {"gpu_count": 0, "size": "large"}))
    assert form.enabled() == [""]  # no GPU is free: CPU only
    assert form.checked() == [""]
    assert form.counts == ["0"]
    assert form.selected["size"] == "large"
    fresh = read(render_form(CATALOG, sized_offer(inventory), {}))
    assert fresh.checked() == [""]
    assert fresh.selected["size"] == "small"  # the default for no GPU


def shared_offer(inventory: Inventory, shares: dict[int, int], in_use: int = 0) -> Offer:
    """The offer, with the T4's shares free as ``shares`` (share size → free)."""
    return replace(offer(inventory, in_use=in_use), shares_free={"t4": shares})


def test_shares_are_offered_beside_the_counts_with_how_many_are_free() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    html = render_form(CATALOG, shared_offer(inventory, {2: 1, 4: 13}), {"gpu_model": "t4"})
    form = read(html)
    assert form.checked() == ["t4"]
    assert form.counts == ["1", "2", "3", "1/2", "1/4"]
    assert form.count_labels["1/4"] == "¼ of an NVIDIA T4 16GB — 13 quarters free"
    assert form.count_labels["1/2"] == "½ of an NVIDIA T4 16GB — 1 half free"
    assert form.count_chosen == "1"
    assert form.note("t4").endswith("Shares of one GPU: 1 half, 13 quarters free")
    assert "Number of GPUs, or a share of one" in html
    # The script offers them again when the T4 is chosen after another model.
    shares = json.loads(form.models["t4"]["data-shares"] or "")
    assert shares[1] == {"value": "1/4", "label": form.count_labels["1/4"], "free": 13}
    assert json.loads(form.models["a100"]["data-shares"] or "") == []


def test_the_previous_share_is_chosen_again_while_one_is_free() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    previous = {"gpu_model": "t4", "gpu_count": 1, "gpu_share": 4}
    form = read(render_form(CATALOG, shared_offer(inventory, {2: 3, 4: 2}), previous))
    assert form.count_chosen == "1/4"
    gone = read(render_form(CATALOG, shared_offer(inventory, {2: 3, 4: 0}), previous))
    assert gone.count_closed == ["1/4"]
    assert gone.count_labels["1/4"] == "¼ of an NVIDIA T4 16GB — none free now"
    assert gone.count_chosen == "1"


def test_a_model_with_only_shares_to_ask_for_is_offered_in_shares() -> None:
    # No whole GPU within the quota left, but the pool counts a quarter as fitting.
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 3), zones=("r1",))
    form = read(render_form(CATALOG, shared_offer(inventory, {2: 0, 4: 1}, in_use=4), {}))
    assert form.enabled() == ["t4"]
    assert form.checked() == ["t4"]
    assert form.counts == ["1/2", "1/4"]
    assert form.count_closed == ["1/2"]
    assert form.count_chosen == "1/4"
    assert not form.count_disabled


def test_a_share_size_the_offer_leaves_out_is_not_offered() -> None:
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 1), zones=("r1",))
    form = read(render_form(CATALOG, shared_offer(inventory, {4: 3}), {}))
    assert form.counts == ["1", "1/4"]
    plain = render_form(CATALOG, offer(inventory), {})
    assert read(plain).counts == ["1"]
    assert "a share of one" not in plain


def test_markup_in_a_shared_models_label_stays_text() -> None:
    marked = replace(
        CATALOG,
        gpu_models=tuple(
            replace(m, label='<img src=x onerror="alert(1)">') if m.id == "t4" else m
            for m in CATALOG.gpu_models
        ),
    )
    inventory = Inventory(hosts=(host("h1", "r1"),), devices=gpus(T4, "r1", 1), zones=("r1",))
    html = render_form(marked, shared_offer(inventory, {4: 3}), {"gpu_model": "t4"})
    assert "<img" not in html
    form = read(html)
    assert form.count_labels["1/4"].startswith('¼ of a <img src=x onerror="alert(1)"> — 3')
    (share,) = json.loads(form.models["t4"]["data-shares"] or "")
    assert share["label"] == form.count_labels["1/4"]
