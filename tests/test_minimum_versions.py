"""pyproject.toml's lower bounds are the versions ``./dev test-min`` tests (issue 28, point 5)."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict:
    pins = {}
    for line in (ROOT / ".ci" / "minimum-versions.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _requirements() -> list:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        found += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return found


def _lower_bound(req: Requirement):
    bounds = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    return bounds[0] if len(bounds) == 1 else None


def test_every_core_dependency_is_pinned_at_its_lower_bound():
    pins = _pins()
    core = [req for where, req in _requirements() if where == "dependencies"]
    assert core
    for req in core:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} has no pin in .ci/minimum-versions.txt"
        assert _lower_bound(req) == pins[name], (
            f"pyproject.toml says {req}, but ./dev test-min tests {req.name}=={pins[name]}"
        )


def test_every_pinned_package_is_declared_at_its_pin_and_nowhere_below_it():
    """An extra may ask for more (vLLM's CPU build needs a newer transformers), never less."""
    pins, requirements = _pins(), _requirements()
    for name, version in pins.items():
        places = [
            (where, req) for where, req in requirements if canonicalize_name(req.name) == name
        ]
        assert places, f"{name} is pinned in .ci/minimum-versions.txt but required nowhere"
        bounds = {where: _lower_bound(req) for where, req in places}
        assert version in bounds.values(), f"no requirement of {name} says >={version}: {bounds}"
        for where, req in places:
            assert _lower_bound(req) is not None and _lower_bound(req) >= version, (
                f"{where}: {req} admits versions below the tested {name}=={version}"
            )
