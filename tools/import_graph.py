"""The import graph of a package's modules, built with ``ast``, and its cycles.

Usage::

    python tools/import_graph.py            # prefopt/ next to this folder
    python tools/import_graph.py --edges    # also print every edge
    python tools/import_graph.py --private  # also private names imported across packages

Every ``import`` and ``from ... import`` counts, at module level or inside a
function, relative or absolute. ``from pkg import name`` is an edge to the
module ``pkg.name`` when there is one, else to ``pkg`` (its ``__init__``), as
import-linter counts it; importing ``a.b.c`` is not counted as importing ``a``
and ``a.b``, whose ``__init__`` files re-export their submodules by design.
A cycle is a strongly connected component of more than one module (or a module
importing itself). The script prints each, and each place where a module writes
another module's globals, and exits 1 when there is either.
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


def _imports(name: str, modules: dict[str, Path]):
    """``(origin, name or None, bound as, line)`` for each import in module ``name``.

    ``import a.b`` gives ``("a.b", None, "a", line)``; ``from .x import y as z``
    gives ``("<package>.x", "y", "z", line)``.
    """
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, alias.asname or alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                yield origin, alias.name, alias.asname or alias.name, node.lineno


def imports_of(name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports (anywhere in its body)."""
    found = set()
    for origin, imported, _, _ in _imports(name, modules):
        full = f"{origin}.{imported}"
        found.add(full if imported and full in modules else _target(origin, modules))
    found.discard(None)
    return found


def _part(name: str) -> str:
    """The top-level package or module of the package that ``name`` lies in."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else ""


def private_imports(root: Path) -> list[tuple[str, str, str, int]]:
    """``(module, _name, origin, line)`` where a private ``_name`` crosses a package.

    A private name (a leading underscore: a function, a class, a private module)
    imported from another of the package's top-level packages or modules.
    """
    modules = module_names(root)
    found = []
    for name in modules:
        for origin, imported, _, line in _imports(name, modules):
            target = _target(origin, modules)
            if imported is None or target is None or not imported.startswith("_"):
                continue
            if _part(target) != _part(name):
                found.append((name, imported, origin, line))
    return sorted(found)


_MUTATORS = {"add", "append", "clear", "discard", "extend", "pop", "remove", "setdefault", "update"}


def foreign_writes(root: Path) -> list[tuple[str, int, str]]:
    """``(module, line, what)`` where a module writes another module's globals.

    An assignment to an attribute (or an item of one) of a module of the package
    that it imported, or a mutating call (``add``, ``update``, ...) on such an
    attribute: ``from . import other; other.X = 1`` or ``other._CACHE.add(x)``.
    """
    modules = module_names(root)
    found = []
    for name in modules:
        bound = {}  # a local name -> the module of the package it names
        for origin, imported, local, _ in _imports(name, modules):
            full = f"{origin}.{imported}" if imported else origin
            if full in modules and (imported or local == full):
                bound[local] = full
        tree = ast.parse(modules[name].read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MUTATORS
            ):
                targets = [node.func.value]
            else:
                continue
            for target in targets:
                base = target
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in bound and base is not target:
                    if bound[base.id] != name:
                        found.append((name, node.lineno, ast.unparse(target)))
    return sorted(found)


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
    parser.add_argument(
        "--private", action="store_true", help="also list private names imported across packages"
    )
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
    writes = foreign_writes(args.package)
    print(f"{len(writes)} writes to another module's globals")
    for name, line, target in writes:
        print(f"  {name} (line {line}) writes {target}")
    if args.private:
        private = private_imports(args.package)
        print(f"{len(private)} private names imported across packages")
        for name, imported, origin, line in private:
            print(f"  {name} (line {line}) imports {imported} from {origin}")
    return 1 if found or writes else 0


if __name__ == "__main__":
    sys.exit(main())
