"""plot_search and plot_comparison: what they draw is the search's and comparison's numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from _tiny import small_policy

from prefopt import RewardModel, RLOOPolicy
from prefopt.model_selection import Comparison, SeedSearchCV, compare
from prefopt.plotting import plot_comparison, plot_search
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def rm():
    return RewardModel().fit(WORLD.comparisons(500, random_state=0))


def small_rloo(**params):
    return small_policy(
        WORLD, RLOOPolicy, beta=0.3, learning_rate=2.0, n_steps=3, batch_size=16
    ).set_params(**params)


def error_bars(ax, i=0):
    """(x, low, high) of the i-th errorbar container's vertical bars."""
    segments = ax.containers[i].lines[2][0].get_segments()
    return (
        np.array([s[0, 0] for s in segments]),
        np.array([s[0, 1] for s in segments]),
        np.array([s[1, 1] for s in segments]),
    )


def test_plot_search_one_line_per_k_with_ci_bars_and_seed_dots(rm):
    search = SeedSearchCV(
        small_rloo(),
        {"beta": [1.0, 0.1], "k": [2, 4]},
        seeds=2,
        scoring=WORLD.scorer("objective"),
        refit=False,
    )
    search.fit(WORLD.prompts, reward_model=rm)
    res = search.cv_results_
    ax = plot_search(search)
    assert len(ax.containers) == 2  # one errorbar line per k
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["k=2", "k=4"]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "beta"
    assert ax.get_ylabel() == "score: mean of 2 seeds, 95% CI"
    for i, k in enumerate((2, 4)):
        rows = [j for j, p in enumerate(res["params"]) if p["k"] == k]
        rows = sorted(rows, key=lambda j: res["params"][j]["beta"])  # x sorted: 0.1, 1.0
        line = ax.containers[i].lines[0]
        np.testing.assert_array_equal(line.get_xdata(), [0.1, 1.0])
        np.testing.assert_allclose(line.get_ydata(), res["mean_test_score"][rows])
        _, low, high = error_bars(ax, i)
        np.testing.assert_allclose(low, res["ci_low_test_score"][rows])
        np.testing.assert_allclose(high, res["ci_high_test_score"][rows])
    # Per group: the errorbar line, then one dot series per seed.
    dots = [line for line in ax.lines if line.get_marker() == "."]
    assert len(dots) == 2 * 2
    np.testing.assert_allclose(dots[1].get_ydata(), res["seed1_test_score"][[2, 0]])


RESULTS = {
    "params": [{"beta": b, "lr": 1.0} for b in (0.5, 0.1, 0.3)],
    "param_beta": np.ma.array([0.5, 0.1, 0.3]),
    "param_lr": np.ma.array([1.0, 1.0, 1.0]),
    "mean_test_a": np.array([1.0, 2.0, 3.0]),
    "ci_low_test_a": np.array([0.5, 1.5, 2.5]),
    "ci_high_test_a": np.array([1.5, 2.5, 3.5]),
    "seed0_test_a": np.array([1.0, 2.0, 3.0]),
    "mean_test_b": np.zeros(3),
    "ci_low_test_b": np.zeros(3),
    "ci_high_test_b": np.zeros(3),
}


def test_plot_search_from_results_one_line_and_metric_choice():
    ax = plot_search(RESULTS, metric="a")  # k was not searched: one line
    assert len(ax.containers) == 1 and ax.get_legend() is None
    np.testing.assert_array_equal(ax.containers[0].lines[0].get_xdata(), [0.1, 0.3, 0.5])
    np.testing.assert_array_equal(ax.containers[0].lines[0].get_ydata(), [2.0, 3.0, 1.0])
    assert ax.get_xscale() == "linear"  # 0.1 to 0.5 spans less than a factor of 10
    with pytest.raises(ValueError, match="several metrics"):
        plot_search(RESULTS)
    with pytest.raises(ValueError, match="'c' is not"):
        plot_search(RESULTS, metric="c")
    with pytest.raises(ValueError, match="no parameter 'gamma'"):
        plot_search(RESULTS, param="gamma", metric="a")
    varied = dict(RESULTS, param_lr=np.ma.array([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"also varies \['lr'\]"):
        plot_search(varied, metric="a", group=None)
    assert len(plot_search(varied, metric="a", group="lr").containers) == 2


def comparison():
    results = pd.DataFrame(
        {
            "algorithm": ["A"] * 3 + ["B"] * 3,
            "seed": [0, 1, 2] * 2,
            "metric": "objective",
            "value": [1.0, 1.2, 1.1, 2.0, 2.4, 2.2],
        }
    )
    summary = pd.DataFrame(
        {
            "algorithm": ["A", "B"],
            "metric": "objective",
            "n_seeds": 3,
            "mean": [1.1, 2.2],
            "std": [0.1, 0.2],
            "ci_low": [0.85, 1.7],
            "ci_high": [1.35, 2.7],
        }
    )
    return Comparison(results=results, summary=summary, seeds=[0, 1, 2], confidence=0.9)


def test_plot_comparison_points_bars_seeds_and_reference():
    ax = plot_comparison(comparison(), reference=2.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["A", "B"]
    np.testing.assert_allclose(ax.containers[0].lines[0].get_ydata(), [1.1, 2.2])
    _, low, high = error_bars(ax)
    np.testing.assert_allclose(low, [0.85, 1.7])
    np.testing.assert_allclose(high, [1.35, 2.7])
    seeds = [line for line in ax.lines if line.get_marker() == "."]
    np.testing.assert_allclose(seeds[1].get_ydata(), [2.0, 2.4, 2.2])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "seeds",
        "closed-form optimum",
        "mean, 90% CI",
    ]
    assert ax.get_ylabel() == "objective"
    with pytest.raises(ValueError, match="'kl' is not"):
        plot_comparison(comparison(), metric="kl")


def test_plot_comparison_of_a_real_compare(rm):
    result = compare(
        {"RLOO": small_rloo(), "RLOO beta=1": small_rloo(beta=1.0)},
        WORLD.prompts,
        reward_model=rm,
        seeds=2,
        scoring={"kl": WORLD.scorer("kl"), "objective": WORLD.scorer("objective")},
    )
    _, axes = plt.subplots(1, 2)
    plot_comparison(result, ax=axes[0])  # the first metric: kl
    plot_comparison(result, "objective", ax=axes[1])
    kl = result.summary.query("metric == 'kl'")["mean"].to_numpy()
    np.testing.assert_allclose(axes[0].containers[0].lines[0].get_ydata(), kl)
    assert axes[1].get_ylabel() == "objective"
