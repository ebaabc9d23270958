"""The shape of prefopt/: no import cycles, nothing imports upward, no module over 500 lines.

The import graph is built with ``ast`` by tools/import_graph.py (every import, relative or
absolute, at module level or inside a function), so a cycle hidden in a function body counts.
"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "prefopt"

_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

# The layers of shared/DESIGN.md as the code has them, lowest first: a module may import its
# own package and the layers before its own, never a later layer or a peer of the same one.
# lm (the shared base of every estimator holding a language model) sits under rewards, which
# builds RewardModel on it; tracking (loggers the loops open) under lm. environments (other
# libraries' environments as the policies' environment=) sits under the worlds, which may
# build on it.
LAYERS = [
    ("_config",),
    ("backend",),
    ("data",),
    ("kl",),
    ("tracking",),
    ("lm",),
    ("rewards",),
    ("policies",),
    ("environments",),
    ("worlds",),
    ("model_selection", "metrics", "plotting"),
    ("__init__",),  # prefopt itself
    ("conftest",),  # the doctests' configuration
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}

# Known cycles, each to be removed by the change that breaks it.
ALLOWED_CYCLES: list[list[str]] = []  # none: every cycle is a failure
# Top-level modules besides the packages.
TOP_LEVEL = {"__init__", "_config", "kl", "learning_rate", "conftest", "exceptions", "validation"}
# The layer a top-level module belongs to, where not its name; exceptions.py (the public
# warning and error classes) and validation.py (the parameter constraints) import nothing
# of prefopt, so they sit in the lowest layer; learning_rate.py (the step-size controller)
# sits with the KL controllers it mirrors.
PART = {"exceptions": "_config", "validation": "_config", "learning_rate": "kl"}
MAX_LINES = 500
# Private names still imported across packages, in files other changes own; an entry goes
# when its import does (a stale entry is harmless: the test checks no new one appears).
KNOWN_PRIVATE: set[tuple[str, str]] = set()


def part(module: str) -> str:
    """The top-level piece of prefopt a dotted module name belongs to."""
    pieces = module.split(".")
    name = pieces[1] if len(pieces) > 1 else "__init__"
    return PART.get(name, name)


@pytest.fixture(scope="module")
def graph():
    return import_graph.import_graph(PACKAGE)


def test_the_graph_sees_relative_absolute_and_function_level_imports(graph):
    # backend/_torch.py imports distributed inside a function only; prefopt/__init__.py
    # imports backend.progress first; policies import lm's modules relatively.
    assert "prefopt.backend.distributed" in graph["prefopt.backend._torch"]
    assert "prefopt.backend.progress" in graph["prefopt"]
    assert "prefopt.lm" in graph["prefopt.policies._base"]
    assert len(graph) > 60 and all(name.startswith("prefopt") for name in graph)


def test_no_import_cycles(graph):
    cycles = import_graph.cycles(graph)
    assert [c for c in cycles if c not in ALLOWED_CYCLES] == []


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_graph.cycles(graph) == [["a", "b", "c"], ["e"]]
    assert import_graph.cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_writes_another_modules_globals():
    assert import_graph.foreign_writes(PACKAGE) == []


def test_a_write_to_another_modules_global_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "state.py").write_text("CACHE = set()\nLIMIT = 1\n")
    (package / "user.py").write_text(
        "from . import state as group\n\n\ndef f(x):\n"
        "    group.CACHE.add(x)\n    group.LIMIT = 2\n    local = {}\n    local['a'] = 1\n"
    )
    assert import_graph.foreign_writes(package) == [
        ("pkg.user", 5, "group.CACHE"),
        ("pkg.user", 6, "group.LIMIT"),
    ]
    assert import_graph.cycles(import_graph.import_graph(package)) == []


def test_every_part_of_prefopt_has_a_layer(graph):
    parts = {part(name) for name in graph}
    assert parts - set(RANK) == set(), "place the new package in LAYERS"
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"{sorted(top - TOP_LEVEL)}: put a new module inside a package"


def test_nothing_imports_upward_or_sideways(graph):
    wrong = sorted(
        f"{name} ({part(name)}) imports {target} ({part(target)})"
        for name, targets in graph.items()
        for target in targets
        if part(name) != part(target) and RANK[part(target)] >= RANK[part(name)]
    )
    assert wrong == []


def test_no_new_private_name_imported_across_packages():
    found = {(name, imported) for name, imported, _, _ in import_graph.private_imports(PACKAGE)}
    assert found - KNOWN_PRIVATE == set(), "make the name public in a small internal module"


def test_no_module_over_500_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_base_policy_names_no_single_algorithm():
    """PPO's value model, GAE and shared trunk live with PPO or behind the contract's hooks."""
    import re

    text = (ROOT / "prefopt" / "policies" / "_base.py").read_text()
    found = re.findall(r"value_model|shared|gae|ppo|vf_", text, flags=re.IGNORECASE)
    assert not found, f"policies/_base.py names one algorithm's parts: {sorted(set(found))}"
