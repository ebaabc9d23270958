"""The import graph of a package's modules, built with ``ast``, and its cycles.

Usage::

    python tools/import_graph.py            # prefopt/ next to this folder
    python tools/import_graph.py --edges    # also print every edge

Every ``import`` and ``from ... import`` counts, at module level or inside a
function, relative or absolute. ``from pkg import name`` is an edge to the
module ``pkg.name`` when there is one, else to ``pkg`` (its ``__init__``), as
import-linter counts it; importing ``a.b.c`` is not counted as importing ``a``
and ``a.b``, whose ``__init__`` files re-export their submodules by design.
A cycle is a strongly connected component of more than one module (or a module
importing itself); the script prints each and exits 1 when there are any.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def module_names(root: Path) -> dict[str, Path]:
    """Every module under the package folder ``root``, by dotted name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` names or lies inside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports (anywhere in its body)."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_target(alias.name, modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                found.add(full if full in modules else _target(origin, modules))
    found.discard(None)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: modules it imports}`` for every module of the package at ``root``."""
    modules = module_names(root)
    return {name: imports_of(name, modules) for name in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan 1972), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "prefopt"
    parser.add_argument("package", nargs="?", type=Path, default=default)
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args(argv)
    graph = import_graph(args.package)
    if args.edges:
        for name in sorted(graph):
            for target in sorted(graph[name]):
                print(f"{name} -> {target}")
    found = cycles(graph)
    n_edges = sum(len(t) for t in graph.values())
    print(f"{len(graph)} modules, {n_edges} imports, {len(found)} cycles")
    for component in found:
        print("cycle: " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
