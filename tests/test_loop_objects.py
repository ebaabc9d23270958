"""The policy loop's shape: no ambient state, no reach into an algorithm's private or own names.

What a step needs of the policy is gathered once per fit (``StepView``); the rollout and
the update are objects given their inputs, and the sampling engine is an object too.
These tests read the source with ``ast``, so a regression fails here before a review.
"""

import ast
import inspect
import re
from pathlib import Path

import pytest

from prefopt import (
    GRPOPolicy,
    PPOPolicy,
    RAFTPolicy,
    ReinforcePlusPlusPolicy,
    ReinforcePolicy,
    RLOOPolicy,
)
from prefopt.policies import Algorithm, BasePolicy

PACKAGE = Path(__file__).resolve().parents[1] / "prefopt"
LOOP = sorted((PACKAGE / "policies" / "loop").glob("*.py"))
# The torch layer (sampling engines, vLLM's among them, forward passes, the data-parallel
# engines and the reductions) and every module of the step: no module-level state (the
# distributed means say across_ranks at their call sites; a DDP wrapper is held by the fit
# that made it; a vLLM engine is a VLLMEngine object, held by a fit or by its user).
# The supervised loop's modules too (its shared constraint table is a constant elsewhere).
SUPERVISED = [PACKAGE / "lm" / "supervised" / name for name in ("_loop.py", "_step.py")]
STATELESS = sorted((PACKAGE / "backend").glob("*.py")) + LOOP + SUPERVISED
HEALTH_AND_PERSISTENCE = [
    PACKAGE / "lm" / name
    for name in ("_health.py", "_persist.py", "_loadable.py", "_checkpoint.py", "_identity.py")
]
MUTABLE_CALLS = {"dict", "list", "set", "local", "WeakKeyDictionary", "WeakSet", "defaultdict"}


def _module_state(path: Path) -> list[str]:
    """Module-level names bound to a mutable container, and ``global`` statements."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp))
            if isinstance(value, ast.Call):
                func = value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                mutable = name in MUTABLE_CALLS
            if mutable and names != ["__all__"]:
                found += names
    found += [f"global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    found += [
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef)
        and any(getattr(b, "attr", getattr(b, "id", "")) == "local" for b in n.bases)
    ]
    return found


@pytest.mark.parametrize("path", STATELESS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_engine_and_step_modules_hold_no_module_level_mutable_state(path):
    assert _module_state(path) == []


def test_the_state_finder_finds_state(tmp_path):
    source = "import threading\nA = {}\nB: list = []\nC = frozenset()\nD = dict()\n"
    source += "class S(threading.local):\n    x = 0\ndef f():\n    global A\n"
    path = tmp_path / "state_probe.py"
    path.write_text(source)
    assert _module_state(path) == ["A", "B", "D", "global A", "S"]


def test_the_sampling_engine_carries_no_result_through_module_state():
    from prefopt.backend import vllm_engine

    assert not hasattr(vllm_engine, "_LAST") and not hasattr(vllm_engine, "last_logprobs")
    # Nor the engine itself, its options or a global optimiser hook counting steps.
    for name in ("_ENGINE", "engine_options", "_STEPS", "_HOOK", "_AT_EXIT"):
        assert not hasattr(vllm_engine, name)


def test_the_vllm_modules_are_scanned():
    names = {p.name for p in STATELESS}
    assert {"vllm_engine.py", "_vllm_llm.py", "samplers.py"} <= names


def test_the_loop_reads_no_private_member_of_the_policy():
    # What the step needs is gathered once per fit (Algorithm._step_view); the loop's
    # modules never reach into the estimator's private members.
    hits = [
        f"{p.name}:{i}: {line.strip()}"
        for p in LOOP
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"policy\._", line)
    ]
    assert hits == []


def _algorithm_specific_names() -> set:
    """Each built-in's own parameters (not the common ones) and the contract's declarations."""
    common = set(BasePolicy._common_parameters)
    names = set()
    for cls in (GRPOPolicy, PPOPolicy, RAFTPolicy, ReinforcePlusPlusPolicy, ReinforcePolicy,
                RLOOPolicy):  # fmt: skip
        names |= set(inspect.signature(cls.__init__).parameters) - common - {"self"}
    declared = [n for n, v in vars(Algorithm).items() if not n.startswith("_") and not callable(v)]
    return names | set(declared) | {"recomputes_old_logprobs"}


def test_the_name_list_covers_the_hooks():
    names = _algorithm_specific_names()
    hooks = {"needs_reference", "dynamic_sampling", "max_resamples", "value_model", "k"}
    assert hooks <= names and "beta" not in names


@pytest.mark.parametrize(
    "path", LOOP + HEALTH_AND_PERSISTENCE, ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_getattr_or_hasattr_on_an_algorithm_specific_name(path):
    names = _algorithm_specific_names()
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
        ):
            hits.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    assert hits == []


REDUCTIONS = {"masked_mean", "masked_whiten", "mean", "std", "gather", "global_count"}


def _reduction_calls_without_the_flag(path: Path, root: Path = PACKAGE) -> list[str]:
    """Calls of a reduction that do not say ``across_ranks`` (nor pass ``**kwargs``)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):  # distributed.mean(...), never x.mean()
            base = func.value
            if not (isinstance(base, ast.Name) and base.id == "distributed"):
                continue
            name = func.attr
        elif isinstance(func, ast.Name) and func.id in ("masked_mean", "masked_whiten"):
            name = func.id
        else:
            continue
        said = any(k.arg in ("across_ranks", None) for k in node.keywords)
        if name in REDUCTIONS and not said:
            hits.append(f"{path.relative_to(root)}:{node.lineno}: {name}(...)")
    return hits


def test_every_reduction_says_whether_it_spans_the_ranks():
    # No ambient state decides what a mean means: each call says across_ranks=...
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in
            _reduction_calls_without_the_flag(path)]  # fmt: skip
    assert hits == []


def test_the_reduction_finder_finds_a_silent_call(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "distributed.mean(x)\ndistributed.mean(x, across_ranks=True)\nx.mean()\n"
        "masked_mean(x, m)\nmasked_mean(x, m, **ranks)\n"
    )
    assert _reduction_calls_without_the_flag(probe, tmp_path) == [
        "probe.py:1: mean(...)",
        "probe.py:4: masked_mean(...)",
    ]
