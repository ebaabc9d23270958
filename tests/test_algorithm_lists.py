"""Every list of prefopt's algorithms names every estimator that ``prefopt.__all__`` exports.

The estimators are the exported subclasses of ``prefopt.lm.LanguageModelEstimator`` (the
policies, SFT, DPO and the reward model). Each must appear by class name in the README's
"Algorithms" table, by its file in the module map (``docs/guide/modules.rst``), and by its
algorithm's name in the README's opening paragraph, ``docs/index.rst``, ``pyproject.toml``'s
description and ``CITATION.cff``'s abstract. A new estimator that is exported but not
listed fails here, as does one missing from ``NAMES`` below.
"""

import inspect
import re
from pathlib import Path

import pytest

import prefopt
from prefopt.lm import LanguageModelEstimator

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# The name each estimator goes by in prose (a new estimator needs an entry).
NAMES = {
    "DPOPolicy": "DPO",
    "GRPOPolicy": "GRPO",
    "PPOPolicy": "PPO",
    "RAFTPolicy": "RAFT",
    "RLOOPolicy": "RLOO",
    "ReinforcePlusPlusPolicy": "REINFORCE++",
    "ReinforcePolicy": "REINFORCE",
    "RewardModel": "reward model",
    "SFTPolicy": "SFT",
}


def _estimators() -> dict:
    found = {}
    for name in prefopt.__all__:
        obj = getattr(prefopt, name)
        if inspect.isclass(obj) and issubclass(obj, LanguageModelEstimator):
            found[name] = obj
    return found


ESTIMATORS = _estimators()


def _section(text: str, heading: str) -> str:
    """The README section under ``heading``, up to the next heading of its level or above."""
    lines, body, level, fenced = text.splitlines(), None, 0, False
    for line in lines:
        fenced ^= line.startswith("```")
        match = None if fenced else re.match(r"(#+) (.*)", line)
        if body is None:
            if match and match.group(2) == heading:
                body, level = [], len(match.group(1))
        elif match and len(match.group(1)) <= level:
            break
        else:
            body.append(line)
    assert body is not None, f"README.md has no section {heading!r}"
    return "\n".join(body)


def _has_word(text: str, word: str) -> bool:
    """``word`` in ``text``, not as part of a longer name (REINFORCE is not in REINFORCE++)."""
    return re.search(rf"(?<![\w+]){re.escape(word)}s?(?![\w+])", text, re.I) is not None


def _prose_lists() -> dict:
    pyproject = (ROOT / "pyproject.toml").read_text()
    description = re.search(r'^description = "(.*)"$', pyproject, re.M)
    assert description, "pyproject.toml has no one-line description"
    citation = (ROOT / "CITATION.cff").read_text()
    abstract = citation.split("abstract:", 1)[1].split("\ntype:", 1)[0]
    return {
        "README.md's opening paragraph": README.split("\n## ", 1)[0],
        "docs/index.rst": (ROOT / "docs" / "index.rst").read_text(),
        "pyproject.toml's description": description.group(1),
        "CITATION.cff's abstract": " ".join(abstract.split()),
    }


def test_the_estimators_are_found_and_named():
    # The selection itself: the policies, SFT, DPO and the reward model, nothing else.
    assert {"PPOPolicy", "SFTPolicy", "DPOPolicy", "RewardModel"} <= set(ESTIMATORS)
    assert "AdaptiveKLController" not in ESTIMATORS and "SeedSearchCV" not in ESTIMATORS
    unnamed = sorted(set(ESTIMATORS) - set(NAMES))
    assert not unnamed, f"add {unnamed} to NAMES in this file, and to every list it checks"
    assert not set(NAMES) - set(ESTIMATORS), "NAMES lists an estimator prefopt no longer exports"


def test_readme_algorithm_table_lists_every_estimator():
    table = _section(README, "Algorithms")
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", table, re.M)}
    missing = sorted(set(ESTIMATORS) - rows)
    assert not missing, f"README.md's Algorithms table has no row for {missing}"


def test_the_module_map_names_every_estimators_file():
    layout = (ROOT / "docs" / "guide" / "modules.rst").read_text()
    for name, cls in ESTIMATORS.items():
        filename = cls.__module__.rsplit(".", 1)[1] + ".py"
        assert re.search(rf"(?<![\w.]){re.escape(filename)}", layout), (
            f"docs/guide/modules.rst (the module map) does not name {filename} ({name})"
        )


@pytest.mark.parametrize("where", list(_prose_lists()))
def test_every_algorithm_named_in(where):
    text = _prose_lists()[where]
    missing = [NAMES[name] for name in ESTIMATORS if not _has_word(text, NAMES[name])]
    assert not missing, f"{where} does not name {missing}"


def test_a_missing_name_is_caught():
    # The check reads whole names: REINFORCE++ alone does not count as REINFORCE.
    assert not _has_word("PPO, RLOO and REINFORCE++", "REINFORCE")
    assert _has_word("PPO, REINFORCE and REINFORCE++", "REINFORCE")
    assert not _has_word("GRPOPolicy", "GRPO") and _has_word("GRPO (Shao)", "GRPO")
