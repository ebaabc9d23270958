"""SeedSearchCV on scikit-learn's public API: exact results on a toy estimator, failures, refit.

A toy estimator whose score is its seed's standard normal draw plus ``shift`` makes every
cell of ``cv_results_`` computable by hand, in milliseconds.
"""

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.base import BaseEstimator
from sklearn.model_selection import GroupKFold
from sklearn.utils import get_tags

import prefopt
from prefopt import RLOOPolicy
from prefopt.model_selection import SeedSearchCV
from prefopt.worlds import PreferenceWorld


class Toy(BaseEstimator):
    """Scores ``shift`` plus one normal draw from ``random_state``; fails when ``shift < 0``."""

    def __init__(self, *, shift=0.0, random_state=None):
        self.shift = shift
        self.random_state = random_state

    def fit(self, X, y=None, reward_model=None):
        if self.shift < 0:
            raise FloatingPointError("diverged")
        self.value_ = self.shift + np.random.default_rng(self.random_state).normal()
        self.n_rows_, self.reward_model_ = len(X), reward_model
        return self

    def score(self, X, y=None):
        return self.value_

    def predict(self, X):
        return [self.value_] * len(X)


def draw(seed):
    return np.random.default_rng(seed).normal()


PROMPTS = [f"p{i}" for i in range(6)]


def test_every_cell_is_the_seeds_fit_and_the_best_mean_wins():
    search = SeedSearchCV(Toy(), {"shift": [0.0, 1.0]}, seeds=[4, 9])
    search.fit(PROMPTS, reward_model="r")
    res = search.cv_results_
    assert list(res) == [
        "mean_fit_time", "std_fit_time", "mean_score_time", "std_score_time",
        "param_shift", "params", "seed0_test_score", "seed1_test_score", "mean_test_score",
        "std_test_score", "ci_low_test_score", "ci_high_test_score", "rank_test_score",
        "tied_with_best_test_score",
    ]  # fmt: skip
    per_seed = np.array([[s + draw(4), s + draw(9)] for s in (0.0, 1.0)])
    np.testing.assert_array_equal(res["seed0_test_score"], per_seed[:, 0])
    np.testing.assert_array_equal(res["mean_test_score"], per_seed.mean(1))
    np.testing.assert_allclose(res["std_test_score"], per_seed.std(1, ddof=1))
    half = stats.t.ppf(0.975, 1) * per_seed.std(1, ddof=1) / np.sqrt(2)
    np.testing.assert_allclose(res["ci_high_test_score"], per_seed.mean(1) + half)
    assert res["rank_test_score"].tolist() == [2, 1]
    assert res["param_shift"].tolist() == [0.0, 1.0] and res["params"][1] == {"shift": 1.0}
    assert search.best_index_ == 1 and search.best_params_ == {"shift": 1.0}
    assert search.best_score_ == per_seed[1].mean() and not search.multimetric_
    # The refit: the best candidate under the first seed, on every prompt, the plain estimator.
    best = search.best_estimator_
    assert type(best) is Toy and best.random_state == 4 and best.n_rows_ == 6
    assert best.reward_model_ == "r" and search.score(PROMPTS) == 1.0 + draw(4)
    assert search.n_splits_ == 1 and search.refit_time_ >= 0
    assert search.predict(PROMPTS[:2]) == [1.0 + draw(4)] * 2


def test_the_search_takes_the_inputs_its_estimator_takes():
    assert get_tags(SeedSearchCV(RLOOPolicy(), {"beta": [0.1]})).input_tags.string
    assert not get_tags(SeedSearchCV(Toy(), {"shift": [0.0]})).input_tags.string


def test_folds_split_the_prompts_and_groups_go_to_the_splitter():
    held_out = []

    def rows(estimator, X, y=None):
        held_out.append(tuple(X))
        return float(estimator.n_rows_)

    search = SeedSearchCV(Toy(), {"shift": [0.0]}, seeds=2, cv=GroupKFold(3), scoring=rows)
    search.fit(PROMPTS, groups=[0, 1, 2, 0, 1, 2])
    res = search.cv_results_
    # 2 seeds x 3 folds, each holding out one group's prompts.
    assert search.n_splits_ == 3 and len(held_out) == 6
    assert set(held_out) == {("p0", "p3"), ("p1", "p4"), ("p2", "p5")}
    for j in range(2):
        assert [res[f"split{i}_seed{j}_test_score"][0] for i in range(3)] == [4.0] * 3


def test_a_failed_fit_scores_nan_warns_and_ranks_last():
    search = SeedSearchCV(Toy(), {"shift": [-1.0, 0.5]}, seeds=2)
    with pytest.warns(UserWarning, match=r"\{'shift': -1.0\} with random_state=\d .*diverged"):
        search.fit(PROMPTS)
    res = search.cv_results_
    assert np.isnan(res["seed0_test_score"][0]) and np.isnan(res["mean_test_score"][0])
    assert res["rank_test_score"].tolist() == [2, 1] and search.best_params_ == {"shift": 0.5}
    with pytest.raises(FloatingPointError, match="diverged"):
        SeedSearchCV(Toy(), {"shift": [-1.0]}, seeds=2, error_score="raise").fit(PROMPTS)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="All the 2 fits"):
        SeedSearchCV(Toy(), {"shift": [-1.0]}, seeds=2).fit(PROMPTS)
    search = SeedSearchCV(Toy(), {"shift": [-1.0, 0.5]}, seeds=1, error_score=-5.0)
    with pytest.warns(UserWarning):
        search.fit(PROMPTS)
    assert search.cv_results_["mean_test_score"][0] == -5.0


def test_multimetric_refit_rules():
    scoring = {"value": lambda est, X, y=None: est.value_, "rows": lambda est, X, y=None: 1.0}
    with pytest.raises(ValueError, match=r"several metrics \['value', 'rows'\]: refit must"):
        SeedSearchCV(Toy(), {"shift": [0.0]}, seeds=2, scoring=scoring).fit(PROMPTS)
    search = SeedSearchCV(Toy(), {"shift": [0.0, 2.0]}, seeds=2, scoring=scoring, refit="value")
    search.fit(PROMPTS)
    assert search.multimetric_ and search.best_params_ == {"shift": 2.0}
    assert search.score(PROMPTS) == 2.0 + draw(0)
    search = SeedSearchCV(Toy(), {"shift": [0.0, 2.0]}, seeds=2, scoring=scoring, refit=False)
    search.fit(PROMPTS)
    assert not hasattr(search, "best_index_") and not hasattr(search, "best_estimator_")
    # A callable refit picks the index itself; best_score_ is then not defined.
    search = SeedSearchCV(Toy(), {"shift": [0.0, 2.0]}, seeds=2, refit=lambda res: 0)
    search.fit(PROMPTS)
    assert search.best_index_ == 0 and search.best_estimator_.shift == 0.0
    assert not hasattr(search, "best_score_")
    with pytest.raises(ValueError, match=r"refit returned 5; .* \[0, 2\)"):
        SeedSearchCV(Toy(), {"shift": [0.0, 2.0]}, seeds=2, refit=lambda res: 5).fit(PROMPTS)


@pytest.mark.parametrize(
    "param, value, message",
    [
        ("confidence", 1.0, "confidence=1.0 must be a number strictly between 0 and 1"),
        ("error_score", "nan", "error_score='nan' must be 'raise' or a number"),
        ("refit", 2, "refit=2 must be True, False, a metric's name or a callable"),
        ("n_jobs", 1.5, "n_jobs=1.5 must be an int or None"),
    ],
)
def test_bad_settings_are_named(param, value, message):
    with pytest.raises(ValueError, match=message):
        SeedSearchCV(Toy(), {"shift": [0.0]}, **{param: value}).fit(PROMPTS)


def test_the_scorer_gets_the_plain_fitted_policy(rm):
    world = PreferenceWorld(rater_bias=1.0, random_state=0)
    seen = []

    def probe(estimator, X, y=None):
        seen.append((type(estimator), isinstance(estimator.model_, torch.nn.Module)))
        return float(prefopt.get_config()["eval_batch_size"])

    policy = RLOOPolicy(
        model=world.policy_model(), learning_rate=2.0, optimizer="sgd", n_steps=2, batch_size=16
    )
    search = SeedSearchCV(policy, {"beta": [0.3]}, seeds=2, scoring=probe)
    with prefopt.config_context(eval_batch_size=3):
        search.fit(world.prompts, rm)
    assert seen == [(RLOOPolicy, True)] * 2
    assert search.cv_results_["mean_test_score"].tolist() == [3.0]


def test_model_selection_imports_nothing_private_from_scikit_learn():
    folder = Path(prefopt.__file__).parent / "model_selection"
    private = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sklearn"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("sklearn")]
            else:
                continue
            private += [
                f"{path.name}: {n}" for n in names if any(p.startswith("_") for p in n.split("."))
            ]
    assert private == []
    assert "BaseSearchCV" not in {c.__name__ for c in SeedSearchCV.__mro__}


def test_the_search_keeps_its_own_parameters_during_fit():
    seen = []

    def probe(estimator, X, y=None):
        seen.append(search.get_params(deep=False))  # while the search is fitting
        return estimator.value_

    search = SeedSearchCV(Toy(), {"shift": [0.0]}, seeds=2, scoring=probe)
    before = search.get_params(deep=False)
    search.fit(PROMPTS)
    assert len(seen) == 2 and all(params == before for params in seen)
    assert search.get_params(deep=False) == before and search.estimator.random_state is None
