"""Scorers against hand computation on a stub policy, and against the exact preference world."""

import numpy as np
import pytest
from _tiny import small_policy

import prefopt
from prefopt import RLOOPolicy
from prefopt.metrics import (
    DEFAULT_LENGTH_BINS,
    gold_reward_scorer,
    length_binned_win_rate,
    make_kl_scorer,
    make_length_binned_win_rate,
    make_objective_scorer,
    make_reward_scorer,
    make_win_rate_scorer,
)
from prefopt.worlds import PreferenceWorld


class StubPolicy:
    """Samples cycle through a fixed list per prompt; log-probs come from tables."""

    def __init__(self, completions, logp=None, ref_logp=None, reward_model=None, beta=0.5):
        self.completions = completions
        self.logp = logp or {}
        self.ref_logp = ref_logp or {}
        self.reward_model_ = reward_model
        self.beta = beta
        self.seeds = []

    def sample(self, X, n=1, *, random_state=None):
        self.seeds.append(random_state)
        return [[self.completions[p][i % len(self.completions[p])] for i in range(n)] for p in X]

    def log_prob(self, prompts, completions, *, reference=False):
        table = self.ref_logp if reference else self.logp
        return np.array([table[c] for c in completions])


def length_reward(prompts, completions):
    return np.array([len(c) for c in completions], dtype=float)


def diff_judge(prompt, completion, reference):
    return len(completion) - len(reference)


@pytest.fixture
def stub():
    # With n_samples=2: "a" -> x, yy; "b" -> zzz, zzz.
    return StubPolicy(
        {"a": ["x", "yy"], "b": ["zzz"]},
        logp={"x": -0.5, "yy": -1.0, "zzz": -2.0},
        ref_logp={"x": -1.0, "yy": -1.0, "zzz": -1.0},
        reward_model=length_reward,
        beta=0.5,
    )


# ----- hand computation on a stub ------------------------------------------------------


def test_reward_scorer_by_hand(stub):
    # rewards 1, 2, 3, 3
    assert make_reward_scorer(n_samples=2)(stub, ["a", "b"]) == 2.25  # reward_model_
    twice = lambda p, c: 2 * length_reward(p, c)
    assert make_reward_scorer(twice, n_samples=2)(stub, ["a", "b"]) == 4.5
    assert make_reward_scorer(n_samples=1)(stub, ["a", "b"]) == 2.0  # x and zzz
    # The sampling seed is fixed: 0 by default, or the one given.
    make_reward_scorer(n_samples=1, random_state=7)(stub, ["a"])
    assert stub.seeds == [0, 0, 0, 7]
    assert gold_reward_scorer(twice, n_samples=2)(stub, ["a", "b"]) == 4.5


def test_kl_scorer_is_the_negated_mean_log_ratio(stub):
    # log pi - log pi_ref: 0.5, 0.0, -1.0, -1.0 -> mean -0.375, so the scorer gives +0.375
    assert make_kl_scorer(n_samples=2)(stub, ["a", "b"]) == pytest.approx(0.375)
    assert make_kl_scorer(n_samples=2)(stub, ["a"]) == pytest.approx(-0.25)


def test_objective_scorer_by_hand(stub):
    # E[r] - beta * KL = 2.25 - beta * (-0.375)
    assert make_objective_scorer(n_samples=2)(stub, ["a", "b"]) == pytest.approx(2.4375)
    assert make_objective_scorer(beta=2.0, n_samples=2)(stub, ["a", "b"]) == pytest.approx(3.0)
    assert make_objective_scorer(length_reward, beta=0.0, n_samples=2)(stub, ["a"]) == 1.5


def test_win_rate_counts_ties_half_and_skips_prompts_without_reference(stub):
    refs = [("a", "xx"), ("b", "zzz"), ("c", "q")]
    # a: x loses (-1), yy ties; b: zzz ties twice -> (0 + 0.5 + 0.5 + 0.5) / 4
    assert make_win_rate_scorer(diff_judge, refs, n_samples=2)(stub, ["a", "b"]) == 0.375
    # One sample: x loses, zzz ties -> 0.25; only prompt "b" -> 0.5.
    assert make_win_rate_scorer(diff_judge, refs)(stub, ["a", "b"]) == 0.25
    assert make_win_rate_scorer(diff_judge, refs)(stub, ["b"]) == 0.5
    # Several references for one prompt: each row counts.
    two = [("a", "w"), ("a", "yyy")]  # x vs w ties, x vs yyy loses
    assert make_win_rate_scorer(diff_judge, two)(stub, ["a"]) == 0.25
    # A table with prompt and completion columns works as well.
    import pandas as pd

    table = pd.DataFrame({"prompt": ["a", "b"], "completion": ["xx", "zz"]})
    assert make_win_rate_scorer(diff_judge, table)(stub, ["a", "b"]) == 0.5  # loss, win


def test_length_binned_win_rate_by_hand():
    policy = StubPolicy(
        {"p1": ["one two three four"], "p2": ["one"], "p3": ["a b c d e f"], "p4": ["a b"]}
    )
    refs = [
        ("p1", "one two"),  # ratio 2.0  -> bin [2, inf)
        ("p2", "one two three"),  # ratio 1/3  -> bin [0, 0.5)
        ("p3", "a b c d e"),  # ratio 1.2  -> bin [0.8, 1.25)
        ("p4", "x y"),
    ]  # ratio 1.0  -> bin [0.8, 1.25)
    verdict = {"p1": 1.0, "p2": -1.0, "p3": 0.0, "p4": 2.0}
    judge = lambda prompt, completion, reference: verdict[prompt]
    table = length_binned_win_rate(policy, ["p1", "p2", "p3", "p4"], judge, refs)
    assert table["bin"].tolist() == [
        "[0, 0.5)",
        "[0.5, 0.8)",
        "[0.8, 1.25)",
        "[1.25, 2)",
        "[2, inf)",
    ]
    assert table["n"].tolist() == [1, 0, 2, 0, 1]
    assert table["wins"].tolist() == [0, 0, 1, 0, 1]
    assert table["ties"].tolist() == [0, 0, 1, 0, 0]
    np.testing.assert_array_equal(table["win_rate"], [0.0, np.nan, 0.75, np.nan, 1.0])
    np.testing.assert_array_equal(table["low"], DEFAULT_LENGTH_BINS[:-1])
    # The scorers: one bin, an empty bin (NaN) and every pair (the plain win rate).
    assert make_length_binned_win_rate(judge, refs, bin=2)(policy, list(verdict)) == 0.75
    assert np.isnan(make_length_binned_win_rate(judge, refs, bin=1)(policy, list(verdict)))
    overall = make_length_binned_win_rate(judge, refs)(policy, list(verdict))
    assert overall == 2.5 / 4 == make_win_rate_scorer(judge, refs)(policy, list(verdict))
    # A custom length (characters) and custom bins; pairs outside every bin are left out.
    chars = length_binned_win_rate(policy, ["p1", "p2"], judge, refs, bins=[1.0, 3.0], length=len)
    assert chars["n"].tolist() == [1]  # p1: 18 / 7 chars; p2: 3 / 13 is below 1.0
    assert np.isnan(make_length_binned_win_rate(judge, refs, bins=[5.0, 6.0])(policy, ["p1"]))


def test_scorer_errors(stub):
    refs = [("a", "xx")]
    with pytest.raises(ValueError, match="n_samples"):
        make_reward_scorer(n_samples=0)
    with pytest.raises(ValueError, match="bins"):
        make_length_binned_win_rate(diff_judge, refs, bins=[1.0, 0.5])
    with pytest.raises(ValueError, match="bin must be"):
        make_length_binned_win_rate(diff_judge, refs, bin=5)
    with pytest.raises(ValueError, match="None of the prompts"):
        make_win_rate_scorer(diff_judge, refs)(stub, ["b"])
    with pytest.raises(ValueError, match="finite"):
        make_win_rate_scorer(lambda p, c, r: float("nan"), refs)(stub, ["a"])
    with pytest.raises(TypeError, match="judge"):
        make_win_rate_scorer("not callable", refs)(stub, ["a"])
    with pytest.raises(ValueError, match="reward_model_"):
        make_reward_scorer()(StubPolicy({"a": ["x"]}), ["a"])
    with pytest.raises(TypeError, match="neither sample"):
        make_reward_scorer(length_reward)(object(), ["a"])
    with pytest.raises(TypeError, match="log_prob"):
        make_kl_scorer()(type("P", (), {"predict": lambda self, X: ["x"] * len(X)})(), ["a"])
    assert "n_samples=2" in repr(make_kl_scorer(n_samples=2))


def test_predict_is_used_without_sample():
    class Predictor:
        def predict(self, X):
            return ["yy" for _ in X]

    assert make_reward_scorer(length_reward, n_samples=5)(Predictor(), ["a", "b"]) == 2.0


# ----- the exact preference world -------------------------------------------------------

WORLD = PreferenceWorld(rater_bias=1.0, random_state=0)


@pytest.fixture(scope="module")
def policy(rm):
    return small_policy(
        WORLD, RLOOPolicy, beta=0.3, learning_rate=2.0, n_steps=20, random_state=0
    ).fit(WORLD.prompts, rm)


def test_sampled_scorers_approach_the_exact_values(policy, rm):
    exact = WORLD.evaluate(policy, rm, beta=0.3)
    n = 2000  # per prompt: 8000 samples
    with prefopt.config_context(eval_batch_size=8000):  # one forward pass per call
        reward = make_reward_scorer(n_samples=n)(policy, WORLD.prompts)
        kl = make_kl_scorer(n_samples=n)(policy, WORLD.prompts)
        objective = make_objective_scorer(n_samples=n)(policy, WORLD.prompts)
        gold = gold_reward_scorer(WORLD.true_quality, n_samples=n)(policy, WORLD.prompts)
    print(
        f"\nexact reward {exact['reward']:.4f} / sampled {reward:.4f}; KL {exact['kl']:.4f} / "
        f"{-kl:.4f}; objective {exact['objective']:.4f} / {objective:.4f}; true quality "
        f"{exact['true_quality']:.4f} / {gold:.4f}"
    )
    # Standard errors of the 8000 samples (2000 per prompt), from the exact probabilities:
    # 0.0032 (reward), 0.0079 (log ratio), 0.0043 (true quality). Measured gaps: 0.0022
    # (reward), 0.0065 (KL), 0.0001 (objective), 0.0007 (true quality). Bounds at ~3 s.e.
    assert reward == pytest.approx(exact["reward"], abs=0.01)
    assert -kl == pytest.approx(exact["kl"], abs=0.025)
    assert objective == pytest.approx(exact["objective"], abs=0.025)
    assert gold == pytest.approx(exact["true_quality"], abs=0.013)
    # Deterministic: the same call gives the same number; another seed another one.
    assert make_reward_scorer(n_samples=8)(policy, WORLD.prompts) == make_reward_scorer(
        n_samples=8
    )(policy, WORLD.prompts)
    assert make_reward_scorer(n_samples=8)(policy, WORLD.prompts) != make_reward_scorer(
        n_samples=8, random_state=1
    )(policy, WORLD.prompts)


def test_win_rate_against_a_reference_response_approaches_the_exact_share(policy):
    hedged = WORLD.responses[2]  # "I think the answer might be X...": true quality 1.2
    refs = [(p, hedged) for p in WORLD.prompts]
    q = dict(zip(WORLD.responses, WORLD.quality_))
    judge = lambda prompt, completion, reference: q[completion] - q[reference]
    probs = WORLD.policy_probs(policy)
    # Wins: the two correct types of higher quality; a tie: the hedged answer itself.
    exact = float((probs[:, WORLD.quality_ > 1.2].sum(1) + 0.5 * probs[:, 2]).mean())
    sampled = make_win_rate_scorer(judge, refs, n_samples=2000)(policy, WORLD.prompts)
    print(f"\nexact win rate {exact:.4f}, sampled {sampled:.4f}")
    assert sampled == pytest.approx(exact, abs=0.02)
    table = length_binned_win_rate(policy, WORLD.prompts, judge, refs, n_samples=500)
    assert table["n"].sum() == 2000
    overall = (table["win_rate"].fillna(0) * table["n"]).sum() / 2000
    assert overall == pytest.approx(
        make_win_rate_scorer(judge, refs, n_samples=500)(policy, WORLD.prompts), abs=1e-12
    )
    # Against the 12-word reference: the 4-word answers (ratio 0.33), the 10-word hedge and
    # the reference type itself (0.83, 1.0), the 22-word flattering answers (1.83).
    assert table.loc[table["n"] > 0, "bin"].tolist() == ["[0, 0.5)", "[0.8, 1.25)", "[1.25, 2)"]
    flattering = table.set_index("bin").loc["[1.25, 2)"]
    # Both flattering types: correct (1.4 > 1.2) wins, wrong (-1.6) loses.
    p = probs[:, [1, 5]].mean(0)
    assert flattering["win_rate"] == pytest.approx(p[0] / p.sum(), abs=0.05)
