"""Fair comparisons: tuning on seeds kept apart, budgets, health, verdicts, the starting row."""

import matplotlib

matplotlib.use("Agg")

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from _tiny import small_policy
from scipy import stats
from sklearn.base import BaseEstimator

import prefopt
from prefopt import RewardModel, RLOOPolicy
from prefopt.metrics import make_win_rate_scorer
from prefopt.model_selection import (
    SeedSearchCV,
    compare,
    minimum_detectable_difference,
    verdict,
)
from prefopt.model_selection._stats import split_seeds
from prefopt.plotting import plot_comparison, plot_search
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(random_state=0)
prefopt.set_config(show_progress_bar=False)


@pytest.fixture(scope="module")
def rm():
    return RewardModel().fit(WORLD.comparisons(500, random_state=0))


def small_rloo(**params):
    return small_policy(
        WORLD, RLOOPolicy, beta=0.3, learning_rate=2.0, n_steps=3, batch_size=16
    ).set_params(**params)


class Stub(BaseEstimator):
    """Scores ``level + offset[seed]``; its run is unhealthy on ``unhealthy_seeds``.

    It sets ``health_`` as a policy's health detectors do, and a ``budget_`` of
    ``16 * n_steps`` episodes and ``n_epochs * n_steps`` gradient steps.
    """

    def __init__(self, *, level=1.0, unhealthy_seeds=(), n_steps=1, n_epochs=1, random_state=None):
        self.level = level
        self.unhealthy_seeds = unhealthy_seeds
        self.n_steps = n_steps
        self.n_epochs = n_epochs
        self.random_state = random_state

    def fit(self, X, y=None):
        self.health_ = {"healthy": self.random_state not in self.unhealthy_seeds, "detectors": {}}
        self.budget_ = {
            "episodes": 16 * self.n_steps,
            "tokens": 40 * self.n_steps,
            "gradient_steps": self.n_epochs * self.n_steps,
            "seconds": 0.0,
        }
        return self

    def score(self, X, y=None):
        return self.level + OFFSETS[self.random_state]

    def sample(self, X, n=1, *, random_state=None):
        return [["word " * int(self.level)] * n for _ in X]


OFFSETS = {0: 0.0, 1: 0.3, 2: -0.1, 3: 0.2, 4: 0.1, 5: 0.0, 6: 0.05, 7: -0.05}
PROMPTS = ["a", "b", "c"]


# ----- seeds and grids ------------------------------------------------------------------


def test_tuning_and_evaluation_seeds_are_disjoint_or_refused():
    assert split_seeds(3, 2) == ([0, 1, 2], [3, 4])
    assert split_seeds([5, 7], 3) == ([5, 7], [0, 1, 2])
    assert split_seeds(3, [0, 2]) == ([1, 3, 4], [0, 2])
    assert split_seeds([1, 2], [3]) == ([1, 2], [3])
    with pytest.raises(ValueError, match=r"share \[2\]"):
        split_seeds([1, 2], [2, 3])
    stub = {"A": Stub()}
    with pytest.raises(ValueError, match=r"share \[1\]"):
        compare(stub, PROMPTS, reward_model=None, seeds=[0, 1], tune={"A": {"level": [1.0]}},
                tuning_seeds=[1, 2])  # fmt: skip


def test_a_tuning_grid_naming_an_unknown_parameter_or_algorithm_is_refused():
    stub = {"A": Stub()}
    with pytest.raises(ValueError, match=r"tune\['A'\] names \['learning_rat'\], which Stub"):
        compare(stub, PROMPTS, reward_model=None, tune={"A": {"learning_rat": [0.1]}})
    with pytest.raises(ValueError, match="tune names 'B'"):
        compare(stub, PROMPTS, reward_model=None, tune={"B": {"level": [0.1]}})
    with pytest.raises(ValueError, match="sets 'random_state'"):
        compare(stub, PROMPTS, reward_model=None, tune={"A": {"random_state": [0]}})
    with pytest.raises(ValueError, match="tuning_metric='gold'"):
        compare(stub, PROMPTS, reward_model=None, tune={"A": {"level": [1.0]}},
                scoring={"s": lambda e, X: e.score(X)}, tuning_metric="gold")  # fmt: skip


# ----- health in the selection and in the results -----------------------------------------


def test_a_candidate_with_an_unhealthy_tuning_run_loses_to_a_healthy_one():
    grid = {"level": [1.0, 3.0], "unhealthy_seeds": [(), (1,)]}
    search = SeedSearchCV(Stub(), grid, seeds=3, refit=False).fit(PROMPTS)
    res = search.cv_results_
    # Candidates: (1, ()), (1, (1,)), (3, ()), (3, (1,)); the level-3 one that broke on seed 1
    # has the best mean of all but ranks after both healthy ones.
    assert res["n_unhealthy"].tolist() == [0, 1, 0, 1]
    assert res["seed1_healthy"].tolist() == [True, False, True, False]
    assert res["seed0_healthy"].all()
    assert res["rank_test_score"].tolist() == [2, 4, 1, 3]
    assert search.best_params_ == {"level": 3.0, "unhealthy_seeds": ()}
    ax = plot_search(search, param="level", group="unhealthy_seeds")
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(crosses) == 1 and crosses[0].get_xdata().tolist() == [1.0, 3.0]
    np.testing.assert_allclose(crosses[0].get_ydata(), [1.3, 3.3])  # seed 1 of (1,)
    assert "unhealthy run" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close("all")

    # In compare the same rule picks the tuned setting; the tuning table says why.
    est = {"A": Stub(level=9.0, unhealthy_seeds=(3,))}
    grid = [{"level": [2.0], "unhealthy_seeds": [()]}, {"level": [9.0]}]  # 9 breaks on seed 3
    out = compare(est, PROMPTS, reward_model=None, seeds=2, tuning_seeds=2, tune={"A": grid})
    assert out.tuning_seeds == [2, 3] and out.seeds == [0, 1]
    assert out.tuned_params == {"A": {"level": 2.0, "unhealthy_seeds": ()}}
    table = out.tuning.set_index("param_level")
    assert table["n_unhealthy"].to_dict() == {2.0: 0, 9.0: 1}
    assert table["selected"].to_dict() == {2.0: True, 9.0: False}
    assert table.loc[9.0, "mean"] == pytest.approx(9.0 + (-0.1 + 0.2) / 2)
    # Evaluated at level 2 on seeds 0 and 1, where the setting is healthy.
    assert out.results["value"].tolist() == [2.0, 2.3]
    assert out.runs["healthy"].tolist() == [True, True]


def test_health_per_run_and_n_unhealthy_per_algorithm_and_the_plot_marks_them():
    est = {"A": Stub(level=1.0), "B": Stub(level=2.0, unhealthy_seeds=(1, 2))}
    out = compare(est, PROMPTS, reward_model=None, seeds=3)
    assert out.runs[["algorithm", "seed", "healthy"]].values.tolist() == [
        ["A", 0, True],
        ["A", 1, True],
        ["A", 2, True],
        ["B", 0, True],
        ["B", 1, False],
        ["B", 2, False],
    ]
    assert out.summary.set_index("algorithm")["n_unhealthy"].to_dict() == {"A": 0, "B": 2}
    ax = plot_comparison(out)
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    assert len(crosses) == 1
    np.testing.assert_allclose(crosses[0].get_ydata(), [2.3, 1.9])  # B's seeds 1 and 2
    np.testing.assert_allclose(crosses[0].get_xdata(), [1.12, 1.12])
    assert "unhealthy run" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close("all")


def test_seed_search_evaluates_the_selected_candidate_on_fresh_seeds():
    grid = {"level": [1.0, 3.0], "unhealthy_seeds": [(), (5,)]}
    search = SeedSearchCV(Stub(), grid, seeds=[0, 1], evaluation_seeds=3).fit(PROMPTS)
    assert search.best_params_ == {"level": 3.0, "unhealthy_seeds": ()}
    assert search.evaluation_seeds_ == [2, 3, 4]
    table = search.evaluation_results_
    assert table["seed"].tolist() == [2, 3, 4] and table["healthy"].tolist() == [True] * 3
    np.testing.assert_allclose(table["test_score"], [2.9, 3.2, 3.1])
    assert search.evaluation_score_ == pytest.approx(3.0 + 0.2 / 3)
    assert search.best_score_ == pytest.approx(3.15)  # the selecting seeds' mean is higher
    assert search.best_estimator_.random_state == 2  # the refit: the first evaluation seed
    with pytest.raises(ValueError, match=r"share \[1\]"):
        SeedSearchCV(Stub(), grid, seeds=[0, 1], evaluation_seeds=[1, 2]).fit(PROMPTS)
    stub_grid = {"level": [1.0]}
    search = SeedSearchCV(Stub(), stub_grid, seeds=1, evaluation_seeds=[7]).fit(PROMPTS)
    assert list(search.cv_results_)[-2:] == ["seed0_healthy", "n_unhealthy"]


# ----- budgets ----------------------------------------------------------------------------


def test_a_fit_records_its_budget_cumulatively_and_a_warm_start_keeps_counting(rm):
    policy = small_rloo(n_epochs=2, n_minibatches=2).fit(WORLD.prompts, reward_model=rm)
    history = pd.DataFrame(policy.history_)
    assert history["budget/episodes"].tolist() == [16, 32, 48]
    assert history["budget/gradient_steps"].tolist() == [4, 8, 12]  # 2 epochs x 2 minibatches
    # The world's responses are one token each.
    tokens = np.cumsum(history["response/length"] * 16)
    assert history["budget/tokens"].tolist() == tokens.astype(int).tolist() == [16, 32, 48]
    seconds = history["time/elapsed"].to_numpy()
    assert np.all(np.diff(seconds) > 0)
    assert policy.budget_ == {
        "episodes": 48,
        "tokens": 48,
        "gradient_steps": 12,
        "seconds": seconds[-1],
    }
    policy.set_params(warm_start=True, n_steps=2).fit(WORLD.prompts, reward_model=rm)
    assert policy.budget_["episodes"] == 80 and policy.budget_["gradient_steps"] == 20
    start = small_rloo(n_steps=0).fit(WORLD.prompts, reward_model=rm)
    assert start.history_ == [] and start.budget_["episodes"] == 0


def test_compare_warns_when_budgets_differ_unless_the_matched_one_is_declared():
    est = {"A": Stub(n_steps=2, n_epochs=1), "B": Stub(n_steps=2, n_epochs=4)}
    with pytest.warns(UserWarning, match=r"gradient steps differ \(A: 2, B: 8"):
        out = compare(est, PROMPTS, reward_model=None, seeds=2)
    assert out.budgets.set_index("algorithm")["gradient_steps"].to_dict() == {"A": 2, "B": 8}
    assert out.budgets.set_index("algorithm")["episodes"].to_dict() == {"A": 32, "B": 32}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(est, PROMPTS, reward_model=None, seeds=2, matched_budget="episodes")
    est["B"].set_params(n_steps=1)
    with pytest.warns(UserWarning, match="matched_budget='episodes' is declared but not"):
        compare(est, PROMPTS, reward_model=None, seeds=2, matched_budget="episodes")
    with pytest.raises(ValueError, match="matched_budget='steps'"):
        compare(est, PROMPTS, reward_model=None, matched_budget="steps")


# ----- verdicts ---------------------------------------------------------------------------


def test_verdicts_and_the_minimum_detectable_difference_by_hand():
    assert verdict(0.1, 0.3) == "better" and verdict(-0.3, -0.1) == "worse"
    assert verdict(-0.1, 0.3) == "inconclusive" and verdict(np.nan, np.nan) == "inconclusive"
    assert verdict(-0.02, 0.03, margin=0.05) == "equivalent"
    # Reaches both the equivalence region and the better one: undecided (issue 36: the old
    # reading, "better" because it excludes 0, let a noisier interval decide more).
    assert verdict(0.01, 0.03, margin=0.02) == "inconclusive"
    assert verdict(0.02, 0.03, margin=0.02) == "better"  # better by at least the margin
    d = np.array([0.1, -0.1, 0.3, 0.1, 0.1])
    by_hand = (stats.t.ppf(0.975, 4) + stats.t.ppf(0.8, 4)) * d.std(ddof=1) / np.sqrt(5)
    assert minimum_detectable_difference(d) == pytest.approx(by_hand, rel=1e-12)
    assert np.isnan(minimum_detectable_difference([0.2]))

    # Same seeds for both, so each difference is exact: B - A = 1 on every seed.
    est = {"A": Stub(level=1.0), "B": Stub(level=2.0), "C": Stub(level=1.0)}
    out = compare(est, PROMPTS, reward_model=None, seeds=4, baseline="A", margin=0.5)
    table = out.summary.set_index("algorithm")
    assert table.loc["B", "verdict"] == "better" and table.loc["C", "verdict"] == "equivalent"
    assert pd.isna(table.loc["A", "verdict"]) and pd.isna(table.loc["A", "mdd"])
    pairs = out.verdicts.set_index(["algorithm", "other"])
    assert pairs.loc[("A", "B"), "verdict"] == "worse"
    assert pairs.loc[("A", "B"), "diff_mean"] == pytest.approx(-1.0)
    assert pairs.loc[("B", "C"), "margin"] == 0.5 and len(pairs) == 6
    wide = out.wide()
    assert wide.index.tolist() == ["A", "B", "C"]
    assert wide.loc["B", "score"] == pytest.approx(2.0 + np.mean([0.0, 0.3, -0.1, 0.2]))
    assert wide.loc["B", "score_verdict"] == "better" and wide.loc["B", "n_unhealthy"] == 0
    assert wide.loc["B", "episodes"] == 16


def test_the_verdict_reads_a_noisy_difference_and_its_mdd():
    class Noisy(Stub):
        def score(self, X, y=None):
            return self.level + [0.0, 0.3, -0.2, 0.1][self.random_state] * (self.level - 1)

    out = compare({"A": Noisy(level=1.0), "B": Noisy(level=1.2)}, PROMPTS, reward_model=None,
                  seeds=4, baseline="A")  # fmt: skip
    row = out.summary.set_index("algorithm").loc["B"]
    d = 0.2 + np.array([0.0, 0.3, -0.2, 0.1]) * 0.2
    assert row["diff_mean"] == pytest.approx(d.mean())
    assert row["mdd"] == pytest.approx(minimum_detectable_difference(d))
    assert row["verdict"] == "better"  # [0.12, 0.28] lies above 0


# ----- the starting row, held-out prompts, positive KL, the win-rate floor ----------------


def test_start_row_held_out_prompts_and_positive_kl(rm):
    held_out, train = WORLD.prompts[:2], WORLD.prompts[2:]
    seen = []

    def n_prompts(estimator, X, y=None):
        seen.append(len(X))
        return float(len(X))

    scoring = {"kl": WORLD.scorer("kl"), "quality": WORLD.scorer("true_quality"), "n": n_prompts}
    out = compare({"RLOO": small_rloo()}, train, reward_model=rm, seeds=2, scoring=scoring,
                  eval_prompts=held_out, include_start=True, baseline="start",
                  positive_kl="kl", return_estimators=True)  # fmt: skip
    assert set(seen) == {2}  # scored on the held-out prompts only
    table = out.summary.set_index(["algorithm", "metric"])
    assert table.loc[("start", "kl"), "mean"] == pytest.approx(0.0, abs=1e-6)
    rloo = out.estimators["RLOO"][0]
    assert table.loc[("RLOO", "kl"), "mean"] > 0
    assert out.results.query("algorithm == 'RLOO' and metric == 'kl' and seed == 0")[
        "value"
    ].item() == pytest.approx(-WORLD.scorer("kl")(rloo, held_out))
    start = out.estimators["start"][0]
    assert start.n_iter_ == 0 and start.history_ == []
    assert out.runs.set_index("algorithm").loc["start", "healthy"].tolist() == [None, None]
    # KL is lower-is-better: RLOO's larger KL is "worse" than the start's.
    assert table.loc[("RLOO", "kl"), "verdict"] == "worse"
    with pytest.raises(ValueError, match="positive_kl names"):
        compare({"RLOO": small_rloo()}, train, reward_model=rm, scoring=scoring,
                positive_kl="neg_kl")  # fmt: skip
    with pytest.raises(ValueError, match="needs include_start"):
        compare({"RLOO": small_rloo()}, train, reward_model=rm, baseline="start")


def test_the_win_rate_counts_ties_half_and_reports_the_empty_answer_floor():
    def judge(prompt, completion, reference):  # more "word"s win; as many tie
        return completion.count("word") - reference.count("word")

    refs = [("a", "none"), ("b", "word"), ("c", "word word word")]
    scorer = make_win_rate_scorer(judge, refs)
    assert scorer.floor(PROMPTS) == pytest.approx((0.5 + 0 + 0) / 3)  # one tie, two losses
    assert scorer.floor(PROMPTS, answer="word ") == pytest.approx((1 + 0.5 + 0) / 3)
    out = compare({"A": Stub(level=1.0), "B": Stub(level=3.0)}, PROMPTS, reward_model=None,
                  seeds=2, scoring={"win": scorer})  # fmt: skip
    table = out.summary.set_index("algorithm")
    assert table["mean"].to_dict() == pytest.approx({"A": 0.5, "B": (1 + 1 + 0.5) / 3})
    assert table["empty_floor"].tolist() == pytest.approx([1 / 6, 1 / 6])


# ----- acceptance: tuning on the preference world -------------------------------------------


def test_tuned_compare_on_the_preference_world_ranks_a_bad_default_by_its_tuned_setting(rm):
    fits = []

    def objective(estimator, X, y=None):
        fits.append((estimator.random_state, estimator.learning_rate))
        return WORLD.scorer("objective")(estimator, X)

    # RLOO's given rate (1e-3) leaves the policy where it started; 2.0 reaches the optimum.
    algorithms = {"RLOO": small_rloo(learning_rate=1e-3, n_steps=8),
                  "REINFORCE": prefopt.ReinforcePolicy(
                      model=WORLD.policy_model(), beta=0.3, learning_rate=0.5,
                      optimizer="sgd", n_steps=8, batch_size=16)}  # fmt: skip
    out = compare(algorithms, WORLD.prompts, reward_model=rm, seeds=3, tuning_seeds=2,
                  tune={"RLOO": {"learning_rate": [1e-3, 2.0]}}, scoring={"objective": objective},
                  baseline="REINFORCE", return_estimators=True)  # fmt: skip
    tuning_fits, eval_fits = fits[:4], fits[4:]
    assert {seed for seed, _ in tuning_fits} == set(out.tuning_seeds) == {3, 4}
    assert {seed for seed, _ in eval_fits} == set(out.seeds) == {0, 1, 2}
    assert not set(out.tuning_seeds) & set(out.seeds)
    assert out.tuned_params == {"RLOO": {"learning_rate": 2.0}}
    assert [e.learning_rate for e in out.estimators["RLOO"]] == [2.0, 2.0, 2.0]
    # The evaluation is exactly RLOO at its tuned rate on fresh seeds.
    scoring = {"objective": WORLD.scorer("objective")}
    direct = compare({"RLOO": small_rloo(learning_rate=2.0, n_steps=8)}, WORLD.prompts,
                     reward_model=rm, seeds=3, scoring=scoring)  # fmt: skip
    tuned_mean = out.summary.set_index("algorithm").loc["RLOO", "mean"]
    assert tuned_mean == pytest.approx(direct.summary["mean"].item(), rel=1e-12)
    table = out.tuning.set_index("param_learning_rate")
    assert table.loc[2.0, "mean"] > table.loc[1e-3, "mean"] + 0.1
    assert table.loc[2.0, "rank"] == 1
    row = out.summary.set_index("algorithm").loc["RLOO"]
    assert np.isfinite(row["mdd"]) and row["verdict"] in {"better", "inconclusive"}


def test_compare_reads_the_health_of_real_fits(rm):
    # Exact once policies set health_ (run health detectors); until then their health is
    # unknown (None) and counts as healthy.
    algorithms = {"RLOO": small_rloo(), "fast": small_rloo(learning_rate=50.0)}
    out = compare(algorithms, WORLD.prompts, reward_model=rm, seeds=2, return_estimators=True)
    fitted = [e for name in algorithms for e in out.estimators[name]]
    expected = [
        None if getattr(e, "health_", None) is None else e.health_["healthy"] for e in fitted
    ]
    assert out.runs["healthy"].tolist() == expected
    n_bad = {name: sum(ok is False for ok, e in zip(expected, fitted) if e in out.estimators[name])
             for name in algorithms}  # fmt: skip
    assert out.summary.set_index("algorithm")["n_unhealthy"].to_dict() == n_bad


class Fails(Stub):
    """Fails to fit at ``level=0`` (a setting of the tuning grid that breaks)."""

    def fit(self, X, y=None):
        if self.level == 0:
            raise RuntimeError("level 0 breaks")
        return super().fit(X, y)


def test_a_failed_tuning_fit_tells_what_compare_users_can_do():
    # compare takes no error_score: its warning must not suggest one (it did).
    with pytest.warns(UserWarning, match=r"level 0 breaks") as caught:
        compare({"A": Fails()}, PROMPTS, reward_model=None, seeds=[2, 3], tuning_seeds=[0, 1],
                tune={"A": {"level": [0.0, 1.0]}})  # fmt: skip
    texts = [str(w.message) for w in caught if "level 0 breaks" in str(w.message)]
    assert texts and all("error_score='raise'" not in t for t in texts)
    assert all("fit estimators['A'] with these parameters alone" in t for t in texts)
    # SeedSearchCV itself takes error_score, and says so.
    with pytest.warns(UserWarning, match=r"Set error_score='raise' to stop at the error"):
        SeedSearchCV(Fails(), {"level": [0.0, 1.0]}, seeds=[0], refit=False).fit(PROMPTS)
