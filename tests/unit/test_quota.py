"""The quota hierarchy, pure: which rule wins each limit, and what may not be stored."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composespawner.domain.quotas import (
    InvalidQuota,
    Limit,
    Quota,
    QuotaRule,
    effective_quota,
    under_site_default,
)
from composespawner.ledger import QuotaExceeded, ServerUse
from composespawner.ledger.limits import Use, check_ask, check_use

SITE = QuotaRule("site", gpus_held=2, gpus_per_server=2, servers=2, gpu_hours_week=20.0)
COURSE = QuotaRule("cohort", "cs-101", gpus_held=1, models=frozenset({"t4"}))
LAB = QuotaRule("cohort", "vision-lab", gpus_held=8, gpus_per_server=4, models=frozenset({"a100"}))
ALICE = QuotaRule("user", "alice", gpus_held=3)
RULES = [SITE, COURSE, LAB, ALICE]


def test_the_site_default_applies_to_everyone() -> None:
    quota = effective_quota(RULES, "zoe", frozenset())
    assert quota.gpus_held == Limit(2, "the site default")
    assert quota.models == Limit(None, "no rule")
    assert quota.servers == Limit(2, "the site default")


def test_a_cohort_sets_what_it_names_and_leaves_the_rest_to_the_site() -> None:
    quota = effective_quota(RULES, "bob", frozenset({"cs-101"}))
    assert quota.gpus_held == Limit(1, "cohort cs-101")  # a course may give less than the site
    assert quota.models == Limit(frozenset({"t4"}), "cohort cs-101")
    assert quota.gpus_per_server == Limit(2, "the site default")


def test_the_most_generous_cohort_wins_and_models_add_up() -> None:
    quota = effective_quota(RULES, "carol", frozenset({"cs-101", "vision-lab"}))
    assert quota.gpus_held == Limit(8, "cohort vision-lab")
    assert quota.gpus_per_server == Limit(4, "cohort vision-lab")
    assert quota.models == Limit(frozenset({"t4", "a100"}), "cohorts cs-101, vision-lab")


def test_a_users_own_rule_wins_over_their_cohorts() -> None:
    quota = effective_quota(RULES, "alice", frozenset({"vision-lab"}))
    assert quota.gpus_held == Limit(3, "alice's own quota")
    assert quota.gpus_per_server.source == "cohort vision-lab"


def test_rules_of_other_users_and_groups_do_not_apply() -> None:
    quota = effective_quota(RULES, "alicex", frozenset({"cs-1011"}))
    assert quota == effective_quota([SITE], "alicex", frozenset())


def test_the_ledgers_site_rule_lies_over_the_configs_default() -> None:
    config = QuotaRule("site", gpus_held=4, servers=3)
    stored = QuotaRule("site", gpus_held=1)
    rules = under_site_default([stored, COURSE], config)
    assert rules == [QuotaRule("site", gpus_held=1, servers=3), COURSE]
    assert under_site_default([], config) == [config]


def test_as_dict_is_plain_json() -> None:
    quota = effective_quota(RULES, "carol", frozenset({"cs-101", "vision-lab"}))
    assert quota.as_dict()["models"] == {
        "value": ["a100", "t4"],
        "source": "cohorts cs-101, vision-lab",
    }
    assert quota.as_dict()["gpu_hours_week"] == {"value": 20.0, "source": "the site default"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": "site", "gpus_held": -1}, "gpus_held must be from 0 to 10000, not -1"),
        ({"level": "site", "servers": 10**9}, "servers must be from 0 to 10000"),
        ({"level": "site", "gpus_per_server": 1.5}, "gpus_per_server must be a whole number"),
        ({"level": "site", "gpus_held": True}, "gpus_held must be a number, not bool"),
        ({"level": "site", "gpus_held": "2"}, "gpus_held must be a number, not str"),
        ({"level": "site", "gpu_hours_week": float("nan")}, "gpu_hours_week must be from 0"),
        ({"level": "site", "cores_held": -4}, "cores_held must be from 0 to 1e\\+06, not -4"),
        ({"level": "site", "memory_gib_held": 10**12}, "memory_gib_held must be from 0 to 1e\\+07"),
        ({"level": "site", "cores_held": 2.5}, "cores_held must be a whole number"),
        ({"level": "site", "memory_gib_held": "64"}, "memory_gib_held must be a number, not str"),
        ({"level": "site", "subject": "x"}, "the site default names no subject"),
        ({"level": "cohort"}, "a cohort or user rule must"),
        ({"level": "planet", "subject": "x"}, "level must be one of site, cohort, user"),
    ],
)
def test_a_rule_that_cannot_be_stored_says_why(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidQuota, match=message):
        QuotaRule(**kwargs)


def test_an_ask_outside_the_models_or_per_server_limit_is_refused() -> None:
    course = effective_quota(RULES, "bob", frozenset({"cs-101"}))
    with pytest.raises(QuotaExceeded) as refused:
        check_ask("bob", course, "a100", 1)
    assert refused.value.user_message == (
        "GPU model a100 is not allowed by cohort cs-101. Choose one of: t4."
        " Ask an admin if your work needs it."
    )
    with pytest.raises(QuotaExceeded) as refused:
        check_ask("bob", course, "t4", 3)
    assert refused.value.user_message == (
        "You asked for 3 GPUs on one server but the site default allows 2 GPUs per server."
        " Ask for fewer."
    )
    check_ask("bob", course, "t4", 2)  # within both: no refusal
    check_ask("bob", course, "a100", 0)  # no GPUs: no GPU limit applies


def test_servers_at_once_counts_servers_without_gpus_too() -> None:
    quota = Quota(servers=Limit(2, "cohort cs-101"))
    with pytest.raises(QuotaExceeded) as refused:
        check_use("bob", quota, 0, Use([ServerUse("a", 0), ServerUse("b", 0)]))
    assert refused.value.user_message == (
        "You have 2 servers running and cohort cs-101 allows 2 at once. Stop one first."
    )
    check_use("bob", quota, 1, Use([ServerUse("a", 0)]))


def test_gpu_hours_used_up_refuse_gpus_but_not_a_cpu_server() -> None:
    quota = Quota(gpu_hours_week=Limit(10.0, "the site default"))
    with pytest.raises(QuotaExceeded) as refused:
        check_use("bob", quota, 1, Use([], gpu_hours_week=10.25))
    assert refused.value.limit == "gpu_hours_week"
    assert refused.value.user_message.startswith(
        "You have used 10.2 GPU-hours in the last 7 days and the site default allows 10."
    )
    check_use("bob", quota, 0, Use([], gpu_hours_week=99.0))
    check_use("bob", quota, 1, Use([], gpu_hours_week=9.9))


def test_a_rule_that_allows_no_gpu_model_is_named_as_where_that_comes_from() -> None:
    nothing = frozenset[str]()
    alone = QuotaRule("user", "alice", models=nothing)
    assert effective_quota([SITE, alone], "alice", ()).models == Limit(nothing, "alice's own quota")
    site = QuotaRule("site", models=nothing)
    assert effective_quota([site], "zoe", ()).models == Limit(nothing, "the site default")
    closed = [QuotaRule("cohort", g, models=nothing) for g in ("cs-101", "cs-102")]
    quota = effective_quota(closed, "zoe", {"cs-101", "cs-102"})
    assert quota.models == Limit(nothing, "cohorts cs-101, cs-102")
    # A cohort that gives nothing is not named beside one that gives a model.
    quota = effective_quota([closed[0], COURSE], "zoe", {"cs-101"})
    assert quota.models == Limit(frozenset({"t4"}), "cohort cs-101")
    quota = effective_quota([closed[1], COURSE], "zoe", {"cs-101", "cs-102"})
    assert quota.models == Limit(frozenset({"t4"}), "cohort cs-101")


def test_no_gpu_model_allowed_refuses_any_gpu_naming_the_rule() -> None:
    quota = effective_quota([QuotaRule("cohort", "cs-101", models=frozenset())], "zoe", {"cs-101"})
    with pytest.raises(QuotaExceeded) as refused:
        check_ask("zoe", quota, "t4", 1)
    assert refused.value.user_message.startswith(
        "GPU model t4 is not allowed by cohort cs-101. You may not use GPUs at all."
    )
    check_ask("zoe", quota, None, 0)  # a server without GPUs is not a GPU model's


_SUBJECTS = st.sampled_from(["alice", "bob", "cs-101", "vision-lab"])
_COUNTS = st.none() | st.integers(0, 10_000)
_PLACES = st.just(("site", "")) | st.tuples(st.sampled_from(["cohort", "user"]), _SUBJECTS)
_RULES = _PLACES.flatmap(
    lambda place: st.builds(
        QuotaRule,
        level=st.just(place[0]),
        subject=st.just(place[1]),
        gpus_held=_COUNTS,
        gpus_per_server=_COUNTS,
        models=st.none() | st.frozensets(st.sampled_from(["t4", "a100", "rtx6000"])),
        gpu_hours_week=st.none() | st.floats(0, 1_000_000),
        servers=_COUNTS,
    )
)


@given(
    rules=st.lists(_RULES, max_size=8),
    user=_SUBJECTS,
    groups=st.frozensets(_SUBJECTS),
)
def test_any_rules_that_can_be_stored_give_an_effective_quota(
    rules: list[QuotaRule], user: str, groups: frozenset[str]
) -> None:
    quota = effective_quota(rules, user, groups)
    applying = {rule.source for rule in rules if rule.applies_to(user, groups)}
    for name, limit in quota.limits():
        setting = [r for r in rules if r.applies_to(user, groups) and getattr(r, name) is not None]
        assert (limit.value is None) == (not setting), name
        sources = limit.source.removeprefix("cohorts ").split(", ")
        assert limit.source == "no rule" or all(
            s in applying or f"cohort {s}" in applying for s in sources
        ), (name, limit.source)
    assert quota.as_dict()  # what the portal answers with


SHARED = [
    QuotaRule("site", cores_held=8, memory_gib_held=32),
    QuotaRule("cohort", "cs-101", cores_held=16, memory_gib_held=64),
    QuotaRule("cohort", "vision-lab", cores_held=64),
    QuotaRule("user", "alice", memory_gib_held=512),
]


def test_cores_and_memory_held_come_through_the_same_hierarchy() -> None:
    assert effective_quota(SHARED, "zoe", ()).cores_held == Limit(8, "the site default")
    bob = effective_quota(SHARED, "bob", {"cs-101"})
    assert (bob.cores_held, bob.memory_gib_held) == (
        Limit(16, "cohort cs-101"),
        Limit(64, "cohort cs-101"),
    )
    carol = effective_quota(SHARED, "carol", {"cs-101", "vision-lab"})
    assert carol.cores_held == Limit(64, "cohort vision-lab")  # the most generous cohort
    assert carol.memory_gib_held == Limit(64, "cohort cs-101")  # the only cohort setting it
    alice = effective_quota(SHARED, "alice", {"cs-101"})
    assert alice.memory_gib_held == Limit(512, "alice's own quota")
    assert alice.as_dict()["cores_held"] == {"value": 16, "source": "cohort cs-101"}


def test_cores_held_at_once_refuses_a_size_past_the_limit_saying_what_to_change() -> None:
    quota = effective_quota(SHARED, "bob", {"cs-101"})
    use = Use([ServerUse("a", 0, 8, 32), ServerUse("b", 1, 4, 8)])
    with pytest.raises(QuotaExceeded) as refused:
        check_use("bob", quota, 0, use, cores=8, memory_gib=16)
    assert (refused.value.limit, refused.value.source) == ("cores_held", "cohort cs-101")
    assert refused.value.user_message == (
        "You hold 12 cores of 16 that cohort cs-101 allows; the 8 cores, 16 GiB size needs 8:"
        " choose a smaller size or stop a server."
    )
    check_use("bob", quota, 0, use, cores=4, memory_gib=16)  # exactly at both limits


def test_memory_held_at_once_is_checked_like_cores() -> None:
    quota = effective_quota(SHARED, "bob", {"cs-101"})
    use = Use([ServerUse("a", 0, 2, 48)])
    with pytest.raises(QuotaExceeded) as refused:
        check_use("bob", quota, 1, use, cores=4, memory_gib=32)
    assert refused.value.limit == "memory_gib_held"
    assert refused.value.user_message == (
        "You hold 48 GiB of 64 GiB that cohort cs-101 allows; the 4 cores, 32 GiB size needs"
        " 32 GiB: choose a smaller size or stop a server."
    )


def test_a_size_bigger_than_the_whole_limit_says_to_choose_a_smaller_one() -> None:
    quota = effective_quota(SHARED, "zoe", ())
    with pytest.raises(QuotaExceeded) as refused:
        check_use("zoe", quota, 0, Use(), cores=16, memory_gib=128)
    assert refused.value.user_message == (
        "The 16 cores, 128 GiB size needs 16 cores but the site default allows 8 at once."
        " Choose a smaller size."
    )
    none = Quota(cores_held=Limit(0, "zoe's own quota"))
    with pytest.raises(QuotaExceeded) as refused:
        check_use("zoe", none, 0, Use(), cores=2, memory_gib=8)
    assert refused.value.user_message.endswith("allows 0 at once. Ask an admin for more.")


def test_asking_no_share_passes_the_share_limits() -> None:
    # A grow (its server holds its share already) or a machine holding a whole unshared host.
    quota = Quota(cores_held=Limit(4, "the site default"), memory_gib_held=Limit(8, "x"))
    check_use("bob", quota, 1, Use([ServerUse("a", 1, 16, 64)]))
