"""No import cycle between the modules of a package (grimp, which import-linter ships with).

A cycle is counted whatever form its imports take: at module level, inside a function (lazy)
or under ``TYPE_CHECKING``; each of them ties the modules together just the same. A package
listed in ``PACKAGES`` must have none among the modules under it (its ``__init__`` included).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from functools import cache

import grimp
import pytest

# Packages whose modules must not import one another in a circle.
PACKAGES = [
    "embeddb.cli",
    "embeddb.client",
    "embeddb.common",
    "embeddb.config",
    "embeddb.engine",
    "embeddb.features",
    "embeddb.server",
    "embeddb.serving",
    "embeddb.trainer",
    "embeddb.transport",
]


@cache
def _graph() -> grimp.ImportGraph:
    # cache_dir=None: nothing written into the checkout.
    return grimp.build_graph("embeddb", cache_dir=None)


def import_cycles(
    modules: Collection[str], imports_of: Callable[[str], Iterable[str]]
) -> list[list[str]]:
    """The import cycles among ``modules``: each strongly connected component of more than one
    module (or a module importing itself), as a sorted list of names; the list sorted too.

    Args:
        modules: the modules to look at; imports of anything else are ignored.
        imports_of: a module -> the modules it imports directly.
    """
    edges: Mapping[str, list[str]] = {
        m: sorted({t for t in imports_of(m) if t in modules}) for m in sorted(modules)
    }
    # Tarjan's algorithm, iterative (no recursion limit on a large package).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if child < len(targets):
                work.append((node, child + 1))
                target = targets[child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    cycles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(cycles)


def package_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The import cycles among the modules under ``package`` (see :func:`import_cycles`)."""
    modules = {package, *graph.find_descendants(package)}
    return import_cycles(modules, graph.find_modules_directly_imported_by)


def _chain(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    """Where the imports of a cycle are: ``a:12 -> b`` lines, for the failure message."""
    lines = []
    for importer in cycle:
        for imported in cycle:
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']} -> {imported}")
    return "\n".join(lines)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside(package: str) -> None:
    graph = _graph()
    assert graph.find_descendants(package), f"{package} has no modules (renamed?)"
    cycles = package_cycles(graph, package)
    assert not cycles, "import cycles:\n" + "\n".join(_chain(graph, c) for c in cycles)


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": ["b"], "b": ["c"], "c": []}, []),
        ({"a": ["b"], "b": ["a"], "c": ["a"]}, [["a", "b"]]),
        ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["d"]}, [["a", "b", "c"], ["d"]]),
        ({"a": ["b", "x"], "b": ["a"], "c": ["d"], "d": ["c"]}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_import_cycles_finds_each_circle(
    edges: dict[str, list[str]], expected: list[list[str]]
) -> None:
    assert import_cycles(edges.keys(), lambda m: edges[m]) == expected
