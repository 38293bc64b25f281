"""``$expand=.($levels=N)`` as the simulator serves it (pure).

Redfish's ``.`` expands *subordinate* resources only: references inside
``Links``, ``Actions`` and ``Oem`` point elsewhere in the tree and stay
references. Each level of expansion replaces a subordinate reference by the
resource it names, whose own subordinate references count one level deeper.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Properties whose references are not subordinate: $expand=. leaves them alone.
NOT_SUBORDINATE = frozenset({"Links", "Actions", "Oem"})

Resolver = Callable[[str], dict[str, Any] | None]


def expand_subordinates(
    resource: Mapping[str, Any], resolve: Resolver, levels: int
) -> dict[str, Any]:
    """``resource`` with subordinate references resolved ``levels`` deep.

    A reference ``resolve`` does not know stays a reference, as a service
    that cannot read a member leaves its link in place.
    """
    expanded: dict[str, Any] = {}
    for name, value in resource.items():
        keep = name in NOT_SUBORDINATE or name.startswith("@")
        expanded[name] = value if keep else _expand_value(value, resolve, levels)
    return expanded


def _expand_value(value: Any, resolve: Resolver, levels: int) -> Any:
    if isinstance(value, list):
        return [_expand_value(item, resolve, levels) for item in value]
    if not isinstance(value, Mapping):
        return value
    if set(value) != {"@odata.id"}:  # an embedded object: its references are still subordinate
        return expand_subordinates(value, resolve, levels)
    target = resolve(value["@odata.id"])
    if target is None:
        return value
    return expand_subordinates(target, resolve, levels - 1) if levels > 1 else target
