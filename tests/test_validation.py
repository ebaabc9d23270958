"""prefopt.validation: the constraint module every estimator validates its parameters with.

The messages are scikit-learn's word for word (written out here by hand, as scikit-learn
1.9 words them), prefopt imports nothing private of scikit-learn, and the installed
scikit-learn lies inside pyproject.toml's range.
"""

import os
import re
import tomllib
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import pytest
import sklearn
from packaging.requirements import Requirement
from packaging.version import Version

import prefopt
from prefopt import AdaptiveKLController, RLOOPolicy
from prefopt.kl import KLController
from prefopt.policies import BasePolicy, store_params
from prefopt.validation import (
    Constraint,
    Interval,
    InvalidParameterError,
    Options,
    StrOptions,
    validate_parameter_constraints,
    validate_params,
)
from prefopt.worlds import PreferenceWorld

ROOT = Path(__file__).resolve().parents[1]


def _message(constraints, value):
    with pytest.raises(InvalidParameterError) as caught:
        validate_parameter_constraints({"p": constraints}, {"p": value}, caller_name="Est")
    return str(caught.value)


@pytest.mark.parametrize(
    "constraints, value, expected",
    [
        ([Interval(Real, 0, None, closed="left")], -1, "a float in the range [0.0, inf)"),
        ([Interval(Integral, 2, None, closed="left")], 1, "an int in the range [2, inf)"),
        ([Interval(Integral, 2, None, closed="left")], 2.0, "an int in the range [2, inf)"),
        ([Interval(Real, 0, 1, closed="both")], 1.5, "a float in the range [0.0, 1.0]"),
        (
            [Interval(Real, 0, None, closed="neither"), None],
            0.0,
            "a float in the range (0.0, inf) or None",
        ),
        ([StrOptions({"adam"})], "sgd", "a str among {'adam'}"),
        ([Options(int, {3})], 4, "a int among {3}"),
        (["boolean"], 1, "an instance of 'bool' or an instance of 'numpy.bool'"),
        (
            ["verbose"],
            -1,
            "an int in the range [0, inf), an instance of 'bool' or an instance of 'numpy.bool'",
        ),
        (
            ["random_state"],
            -1,
            "an int in the range [0, 4294967295], an instance of "
            "'numpy.random.mtrand.RandomState' or None",
        ),
        (["array-like", None], "abc", "an array-like or None"),
        ([str, os.PathLike, None], 3, "an instance of 'str', an instance of 'os.PathLike' or None"),
        ([callable, None], 3, "a callable or None"),
        ([KLController, None], 3, "an instance of 'prefopt.kl.KLController' or None"),
    ],
)
def test_messages_are_scikit_learns(constraints, value, expected):
    assert _message(constraints, value) == (
        f"The 'p' parameter of Est must be {expected}. Got {value!r} instead."
    )


@pytest.mark.parametrize(
    "constraint, good, bad",
    [
        (
            Interval(Real, 0, 1, closed="neither"),
            [0.5, 1e-9, np.float32(0.3)],
            [0, 1, float("nan")],
        ),
        (Interval(Real, 0, 1, closed="right"), [1, 0.25], [0, -0.1, "0.5"]),
        (Interval(Integral, 1, 3, closed="both"), [1, 3, np.int64(2)], [0, 4, 2.0]),
        (Interval(Integral, None, 0, closed="right"), [-(10**9), 0], [1]),
        ("boolean", [True, np.bool_(False)], [0, "yes", None]),
        ("verbose", [0, 2, True], [-1, 1.0]),
        ("random_state", [0, 2**32 - 1, np.random.RandomState(0), None], [-1, 2**32, 1.5]),
        ("array-like", [[1, 2], (3,), np.zeros(2)], ["abc", 3, None]),
        (StrOptions({"a", "b"}), ["a", "b"], ["c", None, 1]),
    ],
)
def test_constraints_accept_and_refuse(constraint, good, bad):
    for value in good:
        validate_parameter_constraints({"p": [constraint]}, {"p": value}, caller_name="Est")
    for value in bad:
        with pytest.raises(InvalidParameterError):
            validate_parameter_constraints({"p": [constraint]}, {"p": value}, caller_name="Est")


def test_error_is_both_value_and_type_error_and_unlisted_parameters_pass():
    assert issubclass(InvalidParameterError, ValueError)
    assert issubclass(InvalidParameterError, TypeError)
    constraints = {"a": "no_validation", "b": [None]}
    validate_parameter_constraints(constraints, {"a": object(), "c": -1}, caller_name="Est")


def test_a_bad_declaration_is_refused_by_name():
    with pytest.raises(ValueError, match="Unknown constraint 'integer'"):
        validate_parameter_constraints({"p": ["integer"]}, {"p": 1}, caller_name="Est")
    with pytest.raises(ValueError, match="closed must be"):
        Interval(Real, 0, 1, closed="open")
    with pytest.raises(ValueError, match="right must be above left"):
        Interval(Real, 1, 0, closed="both")
    with pytest.raises(TypeError, match="left=0.5 must be None or int"):
        Interval(Integral, 0.5, None, closed="left")


def test_estimators_keep_their_messages():
    with pytest.raises(
        InvalidParameterError,
        match=re.escape(
            "The 'k' parameter of RLOOPolicy must be an int in the range [2, inf). Got 1 instead."
        ),
    ):
        validate_params(RLOOPolicy(k=1))
    with pytest.raises(
        InvalidParameterError,
        match=re.escape(
            "The 'target' parameter of AdaptiveKLController must be a float in the range "
            "(0.0, inf). Got 0.0 instead."
        ),
    ):
        AdaptiveKLController(target=0.0).fit()
    with pytest.raises(
        InvalidParameterError,
        match="'k' parameter of GRPOPolicy must be an "
        r"int >= 2 \(a group of one sample has no std",
    ):
        validate_params(prefopt.GRPOPolicy(k=1))
    validate_params(RLOOPolicy())  # every default is valid


class Capped(BasePolicy):
    """A user algorithm whose own parameter is validated with public names only."""

    _parameter_constraints = {
        **BasePolicy._parameter_constraints,
        "cap": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, *, model=None, cap=1.0, n_steps=1, random_state=None):
        store_params(self, locals())

    def compute_advantages(self, batch):
        return batch.sequence_rewards.clamp(max=self.cap)

    def compute_loss(self, batch, minibatch):
        loss = -(minibatch.advantages * (minibatch.logprobs * minibatch.mask).sum(1)).mean()
        return loss, {"loss/policy": loss.item()}


def test_a_user_algorithm_validates_its_own_parameter_before_training():
    prefopt.set_config(show_progress_bar=False)
    world = PreferenceWorld(random_state=0)
    with pytest.raises(
        InvalidParameterError,
        match=re.escape(
            "The 'cap' parameter of Capped must be a float in the range (0.0, inf). Got 0 instead."
        ),
    ):
        Capped(model=world.policy_model(), cap=0).fit(world.prompts, world.true_quality)
    fitted = Capped(model=world.policy_model(), cap=0.5, random_state=0)
    with pytest.warns(UserWarning, match="does not take"):  # the hidden common parameters
        assert fitted.fit(world.prompts, world.true_quality).n_iter_ == 1


class Custom(Constraint):
    def is_satisfied_by(self, value):
        return value == "ok"

    def __str__(self):
        return "the string 'ok'"


def test_a_custom_constraint_words_the_message():
    validate_parameter_constraints({"p": [Custom()]}, {"p": "ok"}, caller_name="Est")
    assert _message([Custom(), None], "no") == (
        "The 'p' parameter of Est must be the string 'ok' or None. Got 'no' instead."
    )
    with pytest.raises(NotImplementedError, match="Constraint must define is_satisfied_by"):
        Constraint().is_satisfied_by(1)


def test_prefopt_imports_nothing_private_of_scikit_learn():
    """``grep -rn "sklearn\\.[a-z_.]*\\._" prefopt/`` finds nothing."""
    pattern = re.compile(r"sklearn\.[a-z_.]*\._")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "prefopt").rglob("*"))
        if path.is_file() and path.suffix in {".py", ".pyi", ".txt", ".md", ".rst"}
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
    assert pattern.search("from sklearn.utils._param_validation import Interval")


def test_no_call_to_scikit_learns_private_estimator_methods():
    private = re.compile(r"\._(validate_params|get_param_names|validate_data|fit_context)\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "prefopt").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert found == []


def test_installed_scikit_learn_is_inside_pyprojects_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = [
        Requirement(r) for r in project["dependencies"] if Requirement(r).name == "scikit-learn"
    ]
    upper = [s for s in requirement.specifier if s.operator == "<"]
    assert upper, f"{requirement}: scikit-learn needs an upper bound (its next minor release)"
    assert Version(sklearn.__version__) in requirement.specifier, (
        f"scikit-learn {sklearn.__version__} is installed, outside pyproject's {requirement}"
    )
