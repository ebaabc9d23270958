"""Every public docstring renders whole: no placeholder left, no doubled brace."""

import importlib
import inspect
import re

import pytest

import prefopt

MODULES = ["prefopt.policies", "prefopt.rewards", "prefopt.worlds", "prefopt.metrics"]
MODULES += ["prefopt.environments"]
MODULES += ["prefopt.model_selection", "prefopt.kl", "prefopt.validation"]
# A placeholder of str.format or of the shared fragments: {name}; not a set literal, nor
# LaTeX's arguments and subscripts (\mathrm{clip}, KL_{target}).
PLACEHOLDER = re.compile(r"(?<![\w\\^_])\{[A-Za-z_]\w*\}")


def _public(module, names):
    for name in names:
        obj = getattr(module, name)
        yield f"{module.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                member = getattr(member, "fget", member)  # a property's getter
                member = getattr(member, "__func__", member)  # class and static methods
                if callable(member) or inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member


def _docstrings():
    seen = {}
    for path, obj in _public(prefopt, prefopt.__all__):
        seen[path] = obj
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for path, obj in _public(module, module.__all__):
            seen[path] = obj
    return {path: obj.__doc__ for path, obj in seen.items() if obj.__doc__}


DOCSTRINGS = _docstrings()


def test_the_walk_covers_the_estimators_and_their_methods():
    assert "prefopt.PPOPolicy" in DOCSTRINGS and "prefopt.policies.BasePolicy.fit" in DOCSTRINGS
    assert "prefopt.policies.Algorithm.compute_loss" in DOCSTRINGS
    assert len(DOCSTRINGS) > 100


@pytest.mark.parametrize("path", sorted(DOCSTRINGS))
def test_docstring_has_no_placeholder_or_doubled_brace(path):
    doc = DOCSTRINGS[path]
    # Examples may close nested dicts ("}}", in code and its output); nothing opens with "{{".
    prose = re.split(r"\n\s*Examples\n\s*-{8}", doc)[0]
    assert "{{" not in doc and "}}" not in prose, f"{path}: a doubled brace renders as typed"
    assert not PLACEHOLDER.search(doc), f"{path}: placeholder {PLACEHOLDER.search(doc)[0]}"


def test_the_check_catches_what_it_is_for():
    assert PLACEHOLDER.search("see {common_parameters}") and PLACEHOLDER.search("{beta}")
    assert not PLACEHOLDER.search('{"a", "b"} \\mathrm{clip} KL_{target} x^{2}')
