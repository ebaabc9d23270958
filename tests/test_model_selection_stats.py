"""The decision rule, Holm's correction, the aggregates of Agarwal et al. (2021), the
health screen's power and the environment record (prefopt/model_selection/_stats.py,
_aggregates.py, _tuning.py, _environment.py), against hand-computed values."""

import inspect
import itertools
import json

import numpy as np
import pytest
from scipy import stats

from prefopt.model_selection import (
    claim_status,
    environment,
    holm,
    iqm,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap_ci,
    verdict,
)
from prefopt.model_selection._stats import decision_p_value
from prefopt.model_selection._tuning import catchable_failure_rate, seeds_to_catch

M = 0.02  # the margin of the example
ORDER = {"worse": 0, "equivalent": 1, "better": 2}


# ----- the decision table -----------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (-0.05, -0.03, "worse"),  # high <= -margin
        (-0.05, -0.02, "worse"),  # touching -margin from below: still worse
        (-0.05, 0.01, "inconclusive"),  # low <= -margin < high < margin
        (-0.05, 0.05, "inconclusive"),  # reaches all three regions
        (-0.01, 0.01, "equivalent"),  # inside (-margin, margin)
        (0.001, 0.019, "equivalent"),  # the example: statistically > 0, within margin
        (0.001, 0.021, "inconclusive"),  # ... the noisier one: no longer "better"
        (0.02, 0.05, "better"),  # low >= margin
        (0.03, 0.05, "better"),
        (np.nan, 0.05, "inconclusive"),
    ],
)
def test_the_decision_table_with_a_margin(low, high, expected):
    assert verdict(low, high, margin=M) == expected


def test_the_decision_table_without_a_margin():
    assert verdict(0.001, 0.002) == "better" and verdict(-0.3, -0.1) == "worse"
    assert verdict(0.0, 0.3) == "inconclusive" and verdict(-0.1, 0.1) == "inconclusive"
    assert verdict(0.0, 0.0) == "inconclusive"  # no equivalence without a margin


def _walk(lows, highs):
    return [verdict(lo, hi, M) for lo, hi in zip(lows, highs)]


def test_widening_an_interval_never_changes_one_decisive_verdict_into_another():
    # Every pair of nested intervals on a grid across the margins: the inner one either has
    # the outer one's verdict or the outer one is inconclusive (a noisier run cannot decide
    # more), which the old rule broke ([0.001, 0.019] equivalent, [0.001, 0.021] better).
    grid = np.round(np.arange(-0.05, 0.0501, 0.0025), 4)
    intervals = [(a, b) for a, b in itertools.combinations_with_replacement(grid, 2)]
    checked = 0
    for (a, b), (c, d) in itertools.product(intervals, repeat=2):
        if a <= c and d <= b:  # [c, d] inside [a, b]
            outer, inner = verdict(a, b, M), verdict(c, d, M)
            assert outer == "inconclusive" or inner == outer, ((a, b), (c, d))
            checked += 1
    assert checked > 10_000


@pytest.mark.parametrize("width", [0.0, 0.005, 0.019, 0.03, 0.05])
def test_moving_an_interval_up_never_moves_the_verdict_back(width):
    # Shift an interval of fixed width from -0.1 to 0.1: the decisive verdicts it passes
    # through are worse, equivalent, better in that order, never back.
    lows = np.linspace(-0.1, 0.1, 801)
    said = [v for v in _walk(lows, lows + width) if v != "inconclusive"]
    ranks = [ORDER[v] for v in said]
    assert ranks == sorted(ranks) and said[0] == "worse" and said[-1] == "better"
    assert ("equivalent" in said) == (width < 2 * M)  # an interval wider than 2m never fits


def test_moving_one_bound_never_makes_a_held_claim_refuted_or_back():
    # The upper bound walks from 0.005 to 0.05 with the lower at 0.001: the status of
    # "A beats B" goes refuted -> undecided and stays; the lower walks from -0.05 to 0.04
    # with the upper at 0.05: undecided -> held, never refuted after held.
    highs = np.linspace(0.005, 0.05, 91)
    status = [claim_status(0.001, h, M, "better") for h in highs]
    assert status[0] == "refuted" and status[-1] == "undecided"
    assert status == sorted(status, key=["refuted", "undecided"].index)
    lows = np.linspace(-0.05, 0.04, 91)
    status = [claim_status(lo, 0.05, M, "better") for lo in lows]
    assert status[0] == "undecided" and status[-1] == "held"
    assert status == sorted(status, key=["undecided", "held"].index)


def test_claim_status_of_a_union_of_verdicts():
    not_worse = ("better", "equivalent")
    assert claim_status(-0.01, 0.05, M, not_worse) == "held"  # verdict: inconclusive
    assert verdict(-0.01, 0.05, M) == "inconclusive"
    assert claim_status(-0.03, 0.05, M, not_worse) == "undecided"
    assert claim_status(-0.05, -0.03, M, not_worse) == "refuted"
    assert claim_status(0.1, 0.3, None, "better") == "held"
    assert claim_status(-0.1, 0.3, None, "better") == "undecided"
    assert claim_status(np.nan, 0.3, M, "better") == "undecided"
    with pytest.raises(ValueError, match="holds must name verdicts"):
        claim_status(0.0, 0.1, M, ("superior",))


def test_the_decision_p_value_agrees_with_the_interval():
    # An interval of coverage c is inside a region exactly when that region's one-sided
    # test rejects at (1 - c) / 2: checked on 200 random samples of 6 seeds.
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = rng.normal(rng.uniform(-0.05, 0.05), rng.uniform(0.001, 0.03), size=6)
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
        region, p = decision_p_value(d.mean(), d.std(ddof=1) / np.sqrt(6), 5, M)
        said = verdict(ci.low, ci.high, M)
        assert (said != "inconclusive") == (p < 0.025)
        if said != "inconclusive":
            assert region == said


def test_holm_by_hand():
    # Sorted 0.01, 0.03, 0.04 times 3, 2, 1: 0.03, 0.06, 0.04 -> made non-decreasing 0.06.
    assert holm([0.01, 0.04, 0.03]).tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]).tolist() == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.004]).tolist() == [0.004]


# ----- aggregates ---------------------------------------------------------------------------


def test_iqm_by_hand():
    # 8 runs: the 2 lowest and 2 highest go, the mean of 3, 4, 5, 6 is 4.5 (100 is ignored).
    assert iqm([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0]) == 4.5
    # Two tasks of 4 runs pool to 8 runs: 1, 2, 3, 4, 10, 20, 30, 40 -> mean of 3, 4, 10, 20.
    assert iqm({"a": [1.0, 2.0, 3.0, 4.0], "b": [10.0, 20.0, 30.0, 40.0]}) == 9.25
    assert iqm(np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])) == 9.25
    with pytest.raises(ValueError, match="intention to treat"):
        iqm([1.0, np.nan, 2.0])


def test_the_stratified_bootstrap_resamples_within_tasks():
    # Task a's runs are all 0 and task b's all 1: a resample that drew across tasks could
    # give a pooled mean of anything from 0 to 1; one within tasks gives exactly 0.5.
    runs = {"a": [0.0, 0.0, 0.0, 0.0], "b": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}

    def pooled_task_mean(*tasks, axis=-1):
        return np.mean([t.mean(axis=axis) for t in tasks], axis=0)

    value, low, high = stratified_bootstrap_ci(runs, pooled_task_mean, n_resamples=200)
    assert (value, low, high) == (0.5, 0.5, 0.5)
    # One task: the percentile interval of the bootstrap means of [1, 2, 3, 4], by hand
    # from scipy.stats.bootstrap with the same generator.
    data = np.array([1.0, 2.0, 3.0, 4.0])
    seed = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    by_hand = stats.bootstrap(
        (data,), np.mean, n_resamples=500, method="percentile", **{seed: np.random.default_rng(3)}
    ).confidence_interval
    got = stratified_bootstrap_ci(
        data,
        lambda x, axis=-1: x.mean(axis=axis),
        n_resamples=500,
        random_state=3,
    )
    assert got == (2.5, by_hand.low, by_hand.high)
    assert np.isnan(stratified_bootstrap_ci([1.0])[1])  # one run: nothing to resample


def test_probability_of_improvement_by_hand():
    # Pairs of [3, 4, 5] against [1, 2, 4]: 7 higher, 1 tied (4 vs 4), 1 lower -> 7.5 / 9.
    p, low, high = probability_of_improvement([3.0, 4.0, 5.0], [1.0, 2.0, 4.0])
    assert p == pytest.approx(7.5 / 9) and low <= p <= high
    # Two tasks: 1 and 0 -> their mean, 0.5.
    p, _, _ = probability_of_improvement({"a": [2.0, 3.0], "b": [0.0, 0.0]},
                                         {"a": [0.0, 1.0], "b": [5.0, 6.0]})  # fmt: skip
    assert p == 0.5
    with pytest.raises(ValueError, match="same tasks"):
        probability_of_improvement({"a": [1.0, 2.0]}, {"a": [1.0], "b": [2.0]})


def test_performance_profile_by_hand():
    # Task a: 1 of 2 runs above 0.4; task b: 2 of 2 -> (0.5 + 1) / 2 = 0.75.
    profile = performance_profile({"a": [0.1, 0.5], "b": [0.6, 0.9]}, [0.0, 0.4, 0.55, 1.0])
    assert profile.tolist() == [1.0, 0.75, 0.5, 0.0]


# ----- the health screen's power --------------------------------------------------------------


def test_how_many_tuning_seeds_catch_one_failure_in_four():
    # 1 - (3/4)^n >= 0.9 first holds at n = 9 (0.925; n = 8 gives 0.8999).
    assert seeds_to_catch(0.25, 0.9) == 9
    assert 1 - 0.75**9 >= 0.9 > 1 - 0.75**8
    assert catchable_failure_rate(9) < 0.25 < catchable_failure_rate(8)
    assert catchable_failure_rate(2) == pytest.approx(1 - np.sqrt(0.1))  # 0.684


# ----- the environment record -------------------------------------------------------------------


def test_the_environment_record_names_versions_hardware_threads_and_commit():
    import platform

    import numpy
    import sklearn
    import torch

    record = environment()
    assert json.loads(json.dumps(record)) == record  # JSON-ready
    assert record["python"] == platform.python_version()
    versions = record["versions"]
    assert versions["torch"] == torch.__version__ and versions["numpy"] == numpy.__version__
    assert versions["scikit-learn"] == sklearn.__version__
    assert set(versions) >= {"transformers", "tokenizers", "scipy", "prefopt"}
    assert record["torch_threads"] == torch.get_num_threads()
    assert record["gpus"] == [
        torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
    ]
    assert record["cpu_count"] >= 1 and record["machine"] == platform.machine()
    assert environment(commit="abc1234")["commit"] == "abc1234"
