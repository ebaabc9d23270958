"""SeedSearchCV and compare on the exact preference world, checked against hand computation."""

import joblib
import numpy as np
import pytest
from _tiny import small_policy
from scipy import stats
from sklearn.base import clone
from sklearn.model_selection import KFold

import prefopt
from prefopt import PPOPolicy, RAFTPolicy, ReinforcePolicy, RLOOPolicy
from prefopt.metrics import make_kl_scorer, make_reward_scorer
from prefopt.model_selection import SeedSearchCV, compare, t_interval
from prefopt.model_selection._search import _rank
from prefopt.model_selection._stats import _check_seeds
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)


def small_rloo(**params):
    est = small_policy(WORLD, RLOOPolicy, beta=0.3, learning_rate=2.0, n_steps=3, batch_size=16)
    return est.set_params(**params)


# ----- the statistics ---------------------------------------------------------------


def test_t_interval_by_hand():
    mean, std, low, high = t_interval([1.0, 2.0, 4.0])
    # mean 7/3; sample variance ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3; t_{0.975, 2} = 4.302653
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx(np.sqrt(7 / 3))
    half = 4.302652729911275 * np.sqrt(7 / 3) / np.sqrt(3)
    assert (low, high) == pytest.approx((7 / 3 - half, 7 / 3 + half))
    # 90%: t_{0.95, 2} = 2.919986; along an axis, one row per candidate.
    mean, std, low, high = t_interval([[1.0, 2.0, 4.0], [0.0, 0.0, 3.0]], confidence=0.9, axis=1)
    np.testing.assert_allclose(mean, [7 / 3, 1.0])
    np.testing.assert_allclose(high - mean, 2.919985580355516 * std / np.sqrt(3))
    # One seed: no spread, no interval.
    mean, std, low, high = t_interval([[2.0]], axis=1)
    assert mean[0] == 2.0 and np.isnan(std[0]) and np.isnan(low[0]) and np.isnan(high[0])


def test_seeds_and_ranks():
    assert _check_seeds(3) == [0, 1, 2]
    assert _check_seeds([7, np.int64(2)]) == [7, 2]
    for bad in (0, [], [1, 1]):
        with pytest.raises(ValueError):
            _check_seeds(bad)
    with pytest.raises(TypeError):
        _check_seeds(1.5)
    # By the mean, ties share the better rank, a NaN (failed) candidate ranks last.
    assert _rank(np.array([1.0, np.nan, 3.0, 3.0])).tolist() == [3, 4, 1, 1]
    assert _rank(np.array([np.nan, np.nan])).tolist() == [1, 1]


# ----- SeedSearchCV --------------------------------------------------------------------


@pytest.mark.slow  # about 4 s: 6 candidates x 3 seeds of 30 RLOO steps
def test_seed_search_rloo_beta_and_k(rm):
    """A search over beta x k with 3 seeds and n_jobs=2, checked by hand."""
    template = RLOOPolicy(
        model=WORLD.policy_model(), learning_rate=2.0, optimizer="sgd", n_steps=30
    )
    scoring = {"true_quality": WORLD.scorer("true_quality"), "objective": WORLD.scorer("objective")}
    search = SeedSearchCV(
        template,
        {"beta": [0.1, 0.3, 1.0], "k": [2, 4]},
        seeds=3,
        n_jobs=2,
        scoring=scoring,
        refit="true_quality",
    )
    # Threads: loky's worker processes would each spend ~10 s importing torch on this box
    # (checked by hand: loky gives the same numbers).
    with joblib.parallel_backend("threading", n_jobs=2):
        search.fit(WORLD.prompts, reward_model=rm)
    res = search.cv_results_
    assert search.seeds_ == [0, 1, 2] and search.n_splits_ == 1
    assert res["params"] == [{"beta": b, "k": k} for b in (0.1, 0.3, 1.0) for k in (2, 4)]
    assert res["param_beta"].tolist() == [0.1, 0.1, 0.3, 0.3, 1.0, 1.0]
    assert not any(k.startswith("split") for k in res)  # cv=None: one split, not reported
    t = stats.t.ppf(0.975, 2)
    for metric in scoring:
        per_seed = np.column_stack([res[f"seed{j}_test_{metric}"] for j in range(3)])
        mean, std = per_seed.mean(1), per_seed.std(1, ddof=1)
        np.testing.assert_allclose(res[f"mean_test_{metric}"], mean, rtol=1e-12)
        np.testing.assert_allclose(res[f"std_test_{metric}"], std, rtol=1e-12)
        np.testing.assert_allclose(res[f"ci_low_test_{metric}"], mean - t * std / np.sqrt(3))
        np.testing.assert_allclose(res[f"ci_high_test_{metric}"], mean + t * std / np.sqrt(3))
        np.testing.assert_array_equal(
            res[f"rank_test_{metric}"], stats.rankdata(-mean, method="min")
        )
    quality = res["mean_test_true_quality"]
    print(
        "\n"
        + "\n".join(
            f"beta={p['beta']} k={p['k']}: true quality {m:.4f} +- {s:.4f} "
            f"[{lo:.4f}, {hi:.4f}], objective {o:.4f}"
            for p, m, s, lo, hi, o in zip(
                res["params"],
                quality,
                res["std_test_true_quality"],
                res["ci_low_test_true_quality"],
                res["ci_high_test_true_quality"],
                res["mean_test_objective"],
            )
        )
    )
    # Measured true quality (k=2 / k=4): 1.498 / 1.502 at beta=0.1, 1.701 / 1.699 at 0.3,
    # 1.655 / 1.649 at 1.0; the optimum's 1.489, 1.715, 1.642: the moderate beta wins.
    assert search.best_params_ == {"beta": 0.3, "k": 2}
    assert search.best_index_ == 2 and search.best_score_ == quality.max()
    assert quality[2:4].min() > quality[[0, 1, 4, 5]].max() + 0.03
    # After 30 steps each candidate's objective is within 0.011 of its own optimum (measured
    # gaps 0.010 at beta=0.1, 0.005 at 0.3, 0.001 at 1.0; optima 1.663, 1.475, 1.149).
    for i, p in enumerate(res["params"]):
        optimum = WORLD.optimum(rm, p["beta"])["objective"]
        assert abs(res["mean_test_objective"][i] - optimum) < 0.015
    # The refit is the best candidate under the first seed; with cv=None it repeats that fit.
    best = search.best_estimator_
    assert best.random_state == 0 and best.beta == 0.3 and best.k == 2
    assert (
        WORLD.scorer("true_quality")(best, WORLD.prompts)
        == res["seed0_test_true_quality"][search.best_index_]
    )
    assert search.score(WORLD.prompts) == res["seed0_test_true_quality"][search.best_index_]
    assert len(search.sample(WORLD.prompts[:2], n=3)[0]) == 3
    # Any cell is an ordinary fit with that seed.
    one = clone(template).set_params(beta=1.0, k=4, random_state=2).fit(WORLD.prompts, rm)
    assert WORLD.scorer("objective")(one, WORLD.prompts) == res["seed2_test_objective"][5]
    assert template.random_state is None  # the template is untouched


def test_seed_search_with_folds_and_explicit_seeds(rm):
    search = SeedSearchCV(
        small_rloo(),
        {"beta": [0.1, 1.0]},
        seeds=[3, 5],
        cv=KFold(2),
        scoring=make_reward_scorer(n_samples=4),
        return_train_score=True,
    )
    search.fit(WORLD.prompts, reward_model=rm)
    res = search.cv_results_
    assert search.seeds_ == [3, 5] and search.n_splits_ == 2
    for which in ("test", "train"):
        for j in range(2):
            folds = np.column_stack([res[f"split{i}_seed{j}_{which}_score"] for i in range(2)])
            # A seed's score is its mean over folds; the spread is over seeds.
            np.testing.assert_allclose(res[f"seed{j}_{which}_score"], folds.mean(1))
        per_seed = np.column_stack([res[f"seed{j}_{which}_score"] for j in range(2)])
        np.testing.assert_allclose(res[f"mean_{which}_score"], per_seed.mean(1))
        np.testing.assert_allclose(res[f"std_{which}_score"], per_seed.std(1, ddof=1))
    assert "rank_train_score" not in res
    assert search.best_estimator_.random_state == 3
    # The cell (beta=1.0, seed 5, fold 1) by hand: fit on fold 1's training prompts.
    train, test = list(KFold(2).split(WORLD.prompts))[1]
    prompts = np.asarray(WORLD.prompts)
    cell = small_rloo(beta=1.0, random_state=5).fit(prompts[train].tolist(), rm)
    assert (
        make_reward_scorer(n_samples=4)(cell, prompts[test].tolist())
        == res["split1_seed1_test_score"][1]
    )


def test_seed_search_default_scoring_refit_false_and_errors(rm):
    search = SeedSearchCV(small_rloo(), {"beta": [0.3]}, seeds=2, refit=False)
    search.fit(WORLD.prompts, reward_model=rm)
    res = search.cv_results_
    assert not hasattr(search, "best_estimator_") and res["rank_test_score"].tolist() == [1]
    # scoring=None is the policy's own score: the mean reward of one sample per prompt.
    policy = small_rloo(random_state=1).fit(WORLD.prompts, rm)
    assert res["seed1_test_score"][0] == policy.score(WORLD.prompts)
    with pytest.raises(ValueError, match="seeds=\\[...\\]"):
        SeedSearchCV(small_rloo(), {"random_state": [0, 1]}).fit(WORLD.prompts, reward_model=rm)
    with pytest.raises(ValueError, match="no parameter 'seed'"):
        SeedSearchCV(small_rloo(), {"beta": [0.3]}, seed_param="seed").fit(
            WORLD.prompts, reward_model=rm
        )
    with pytest.raises(ValueError, match="seeds"):
        SeedSearchCV(small_rloo(), {"beta": [0.3]}, seeds=0).fit(WORLD.prompts, reward_model=rm)
    with pytest.raises(ValueError, match="confidence"):
        SeedSearchCV(small_rloo(), {"beta": [0.3]}, confidence=95).fit(
            WORLD.prompts, reward_model=rm
        )

    # A failed seed makes its candidate's mean NaN and ranks it last.
    def fragile(estimator, X, y=None):
        if estimator.beta == 0.1 and estimator.random_state == 1:
            raise RuntimeError("diverged")
        return 1.0

    search = SeedSearchCV(small_rloo(), {"beta": [0.1, 0.3]}, seeds=2, scoring=fragile)
    with pytest.warns(UserWarning):
        search.fit(WORLD.prompts, reward_model=rm)
    assert np.isnan(search.cv_results_["mean_test_score"][0])
    assert search.cv_results_["rank_test_score"].tolist() == [2, 1]
    assert search.best_params_ == {"beta": 0.3}


def test_seed_search_clones_and_takes_the_reward_as_y(rm):
    search = SeedSearchCV(small_rloo(), {"beta": [0.3]}, seeds=[1], confidence=0.9)
    copy = clone(search)
    assert copy.get_params(deep=False).keys() == search.get_params(deep=False).keys()
    assert copy.seeds == [1] and copy.confidence == 0.9 and copy.seed_param == "random_state"
    assert repr(search).startswith("SeedSearchCV(confidence=0.9,") and "seeds=[1]" in repr(search)
    # fit(prompts, reward) as for a policy; one seed gives a mean but no spread.
    search.fit(WORLD.prompts, rm)
    res = search.cv_results_
    assert res["mean_test_score"][0] == res["seed0_test_score"][0]
    assert np.isnan(res["std_test_score"][0]) and np.isnan(res["ci_low_test_score"][0])
    assert search.best_estimator_.reward_model_ is rm
    with pytest.raises(ValueError, match="once"):
        clone(search).fit(WORLD.prompts, rm, reward_model=rm)


@pytest.mark.slow  # about 40 s on 2 busy cores: Ray's workers each import torch
def test_seed_search_under_ray_equals_the_local_run(rm):
    ray = pytest.importorskip("ray")
    from ray.util.joblib import register_ray

    def search():
        return SeedSearchCV(
            small_rloo(),
            {"beta": [0.1, 1.0]},
            seeds=2,
            n_jobs=2,
            refit=False,
            scoring={"objective": WORLD.scorer("objective"), "kl": make_kl_scorer(n_samples=8)},
        )

    local = search().fit(WORLD.prompts, reward_model=rm)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        register_ray()
        with joblib.parallel_backend("ray"):
            remote = search().fit(WORLD.prompts, reward_model=rm)
    finally:
        ray.shutdown()
    for key, value in local.cv_results_.items():
        if "score" in key and "time" not in key:
            np.testing.assert_array_equal(remote.cv_results_[key], value, err_msg=key)


# ----- compare -------------------------------------------------------------------------


@pytest.mark.slow  # about 11 s: 4 algorithms x 5 seeds x 60 steps
def test_compare_on_policy_algorithms_reach_the_optimum_and_raft_does_not(rm):
    def model():
        return WORLD.policy_model()

    common = {"beta": 0.3, "optimizer": "sgd", "n_steps": 60}
    algorithms = {
        "RLOO": RLOOPolicy(model=model(), learning_rate=2.0, **common),
        "PPO": PPOPolicy(model=model(), learning_rate=0.3, **common),
        "REINFORCE": ReinforcePolicy(model=model(), learning_rate=2.0, **common),
        # the score ranking (Dong et al.'s), in which beta plays no part
        "RAFT": RAFTPolicy(model=model(), rank_by="score", learning_rate=0.3, **common),
    }
    scoring = {
        "objective": WORLD.scorer("objective"),
        "kl": WORLD.scorer("kl"),
        "true_quality": WORLD.scorer("true_quality"),
    }
    with joblib.parallel_backend("threading", n_jobs=2):
        result = compare(
            algorithms,
            WORLD.prompts,
            reward_model=rm,
            seeds=5,
            scoring=scoring,
            baseline="RLOO",
            n_jobs=2,
        )
    results, summary = result.results, result.summary
    assert results.columns.tolist() == ["algorithm", "seed", "metric", "value"]
    assert len(results) == 4 * 5 * 3 and result.seeds == [0, 1, 2, 3, 4]
    assert result.fit_times.shape == (20, 3) and result.estimators is None
    print("\n" + summary.round(4).to_string())
    table = summary.set_index(["algorithm", "metric"])
    t = stats.t.ppf(0.975, 4)

    def seed_values(name, metric):
        rows = results[(results["algorithm"] == name) & (results["metric"] == metric)]
        return rows.sort_values("seed")["value"].to_numpy()

    # The summary is the hand computation over seeds; the paired test is ttest_rel.
    for (name, metric), row in table.iterrows():
        v = seed_values(name, metric)
        assert row["mean"] == pytest.approx(v.mean(), rel=1e-12)
        assert row["std"] == pytest.approx(v.std(ddof=1), rel=1e-12)
        assert row["ci_high"] - row["mean"] == pytest.approx(t * v.std(ddof=1) / np.sqrt(5))
        if name == "RLOO":
            assert np.isnan(row["diff_mean"]) and np.isnan(row["p_value"])
            continue
        base = seed_values("RLOO", metric)
        d = v - base
        assert row["diff_mean"] == pytest.approx(d.mean())
        assert row["diff_ci_high"] - row["diff_mean"] == pytest.approx(
            t * d.std(ddof=1) / np.sqrt(5)
        )
        assert row["p_value"] == pytest.approx(stats.ttest_rel(v, base).pvalue)

    best = WORLD.optimum(rm, 0.3)
    for name in ("PPO", "RLOO", "REINFORCE"):
        row = table.loc[(name, "objective")]
        half = row["ci_high"] - row["mean"]
        # Measured objective 1.4734 (PPO), 1.4732 (RLOO), 1.4730 (REINFORCE) against the
        # optimum's 1.4753: the gap (0.002) is systematic and larger than the 5-seed CI
        # half-widths (0.0006, 0.0003, 0.0002) but tiny; the objective is flat at its maximum.
        assert abs(row["mean"] - best["objective"]) <= max(half, 0.01)
        assert abs(-table.loc[(name, "kl"), "mean"] - best["kl"]) < 0.05
        assert abs(table.loc[(name, "true_quality"), "mean"] - best["true_quality"]) < 0.02
    # RAFT ignores beta: KL 1.39 against the optimum's 0.70, far outside its interval.
    raft_kl = table.loc[("RAFT", "kl")]
    assert -raft_kl["ci_low"] > best["kl"] + 0.5
    assert table.loc[("RAFT", "objective"), "mean"] < best["objective"] - 0.2
    # ... and the paired test against RLOO says so for every seed.
    assert table.loc[("RAFT", "objective"), "diff_ci_high"] < -0.2
    assert table.loc[("RAFT", "objective"), "p_value"] < 1e-4


def test_compare_default_scoring_and_kept_estimators(rm):
    algorithms = {"beta=0.1": small_rloo(beta=0.1), "beta=1": small_rloo(beta=1.0)}
    result = compare(
        algorithms,
        WORLD.prompts,
        reward_model=rm,
        seeds=[4, 9],
        return_estimators=True,
        confidence=0.9,
    )
    assert result.results["metric"].unique().tolist() == ["score"]
    assert "diff_mean" not in result.summary
    kept = result.estimators["beta=1"]
    assert [e.random_state for e in kept] == [4, 9] and kept[1].beta == 1.0
    values = result.results.query("algorithm == 'beta=1'")["value"].tolist()
    assert values == [e.score(WORLD.prompts) for e in kept]
    with pytest.raises(ValueError, match="baseline"):
        compare(algorithms, WORLD.prompts, reward_model=rm, baseline="PPO")
    with pytest.raises(TypeError, match="dict"):
        compare([small_rloo()], WORLD.prompts, reward_model=rm)


def _config_probe(key):
    """A scorer whose score is a prefopt setting as the worker that scores sees it."""

    def probe(estimator, X, y=None):
        return float(prefopt.get_config()[key])

    return probe


def test_seed_search_hands_the_callers_config_to_every_candidate(rm):
    # config_context is the caller's thread's alone; joblib's worker threads start from
    # the process-wide settings (64), so only the setting carried with the task reaches them.
    search = SeedSearchCV(
        small_rloo(), {"beta": [0.3]}, seeds=2, n_jobs=2, scoring=_config_probe("eval_batch_size")
    )
    with prefopt.config_context(eval_batch_size=7), joblib.parallel_backend("threading", 2):
        search.fit(WORLD.prompts, reward_model=rm)
    assert search.cv_results_["mean_test_score"].tolist() == [7.0]
    assert type(search.best_estimator_) is RLOOPolicy  # the refit is the plain estimator
    assert repr(search.best_estimator_).startswith("RLOOPolicy(")


@pytest.mark.slow  # about 20 s: two loky worker processes import torch
def test_seed_search_config_reaches_loky_worker_processes(rm):
    search = SeedSearchCV(
        small_rloo(), {"beta": [0.3]}, seeds=2, n_jobs=2, scoring=_config_probe("eval_batch_size")
    )
    prefopt.set_config(eval_batch_size=5)
    try:
        with joblib.parallel_backend("loky", n_jobs=2):
            search.fit(WORLD.prompts, reward_model=rm)
    finally:
        prefopt.set_config(eval_batch_size=64)
    assert search.cv_results_["mean_test_score"].tolist() == [5.0]
