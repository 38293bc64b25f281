"""The shape docs/architecture.md draws, checked: who imports whom, no cycles, sizes.

Read from the source with :mod:`ast`, so a rule broken in a branch that never runs here
(an import inside a function, under ``TYPE_CHECKING``) is caught as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from harness.paths import ROOT

pytestmark = pytest.mark.timeout(60)

TOP_LEVEL = ("composespawner", "fabricsim", "harness", "tests", "benchmarks")

# What each part may import of ours, as docs/architecture.md's table says.
BELOW_SERVICES = {"domain", "ledger", "fabric", "launchers", "client", "activity"}
MAY_IMPORT: dict[str, set[str]] = {
    "composespawner.client": set(),
    "composespawner.domain": set(),
    "composespawner.ledger": {"domain"},
    "composespawner.fabric": {"domain"},
    # Bare hosts' activity comes through their agents, over the SSH launcher's links.
    "composespawner.activity": {"domain", "launchers"},
    "composespawner.launchers": {"domain", "ledger", "client"},
    # The compute host's agent: a launcher's far end, built from the launchers' parts.
    "composespawner.hostagent": {"domain", "launchers", "client", "activity"},
    "composespawner.services": BELOW_SERVICES,
    "composespawner.spawners": BELOW_SERVICES | {"services"},
    "composespawner.auth": BELOW_SERVICES,
    "composespawner.portal": BELOW_SERVICES | {"services"},
    "composespawner.commands": BELOW_SERVICES | {"services", "spawners", "auth", "portal"},
}
# Whole top-level packages that must not import others.
MUST_NOT_IMPORT = {
    "fabricsim": {"composespawner", "harness", "tests", "benchmarks"},
    "composespawner": {"fabricsim", "harness", "tests", "benchmarks"},
    "harness": {"tests", "benchmarks"},
    "benchmarks": {"tests"},
}
# The one crossing: the command starts the simulator beside the demo's hub (it imports
# nothing of it but its entry point).
CROSSINGS = {("composespawner.commands.cli", "fabricsim.__main__")}

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
# Long by nature: the database's history, and the simulator's Redfish resource tables.
SIZE_EXEMPT = ("composespawner/ledger/migrations/", "fabricsim/resources.py")
SIZED = ("composespawner", "fabricsim", "harness", "benchmarks")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module


@cache
def modules() -> dict[str, Module]:
    found = {}
    for top in TOP_LEVEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return found


def _resolved(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join([*package, *([node.module] if node.module else [])])


def _ours(name: str) -> str | None:
    """The module of ours ``name`` is, or is in (``a.b.c`` for ``a.b.c.function``)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def imports(module: Module) -> Iterator[str]:
    """Every module of ours that ``module`` imports, anywhere in its body."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolved(module, node)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            ours = _ours(name)
            if ours is not None and ours != module.name:
                yield ours


def _part(name: str) -> str:
    """``composespawner.services.composer`` -> ``composespawner.services``."""
    return ".".join(name.split(".")[:2]) if name.startswith("composespawner.") else name


def test_each_part_of_composespawner_imports_only_what_the_map_allows() -> None:
    broken = []
    for module in modules().values():
        part = _part(module.name)
        if part not in MAY_IMPORT:
            continue
        for target in imports(module):
            other = _part(target)
            if other == part or not other.startswith("composespawner."):
                continue
            if other.removeprefix("composespawner.") not in MAY_IMPORT[part]:
                broken.append(f"{module.name} imports {target}")
    assert broken == []


def test_no_package_imports_a_package_it_must_not() -> None:
    broken = [
        f"{module.name} imports {target}"
        for module in modules().values()
        for target in imports(module)
        if target.split(".")[0] in MUST_NOT_IMPORT.get(module.name.split(".")[0], ())
        and (module.name, target) not in CROSSINGS
    ]
    assert broken == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules_or_between_packages() -> None:
    by_module = {name: set(imports(module)) for name, module in modules().items()}
    by_package: dict[str, set[str]] = {}
    for name, targets in by_module.items():
        others = by_package.setdefault(_group(name), set())
        others.update(_group(target) for target in targets)
        others.discard(_group(name))
    assert cycles(by_module) == []
    assert cycles(by_package) == []


def _group(name: str) -> str:
    """The package a module counts in: a part of composespawner, or a top-level package."""
    return _part(name) if name.startswith("composespawner.") else name.split(".")[0]


def _sized() -> Iterator[Module]:
    for module in modules().values():
        relative = module.path.relative_to(ROOT).as_posix()
        if relative.startswith(SIZED) and not relative.startswith(SIZE_EXEMPT):
            yield module


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        module.name: lines
        for module in _sized()
        if (lines := len(module.path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_class_is_longer_than_the_limit() -> None:
    long = {
        f"{module.name}.{node.name}": lines
        for module in _sized()
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ClassDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    }
    assert long == {}
