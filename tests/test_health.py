"""Run health: each detector fires on a constructed failure and stays silent on a healthy run."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _tiny import tiny_lm

from prefopt import GRPOPolicy, RLOOPolicy, RunHealthError, RunHealthWarning, SFTPolicy
from prefopt.lm._health import count_non_finite, loss_blowup, smoothed
from prefopt.policies.loop._health import (
    KL_BLOWUP,
    KL_CAP,
    KL_LOSING,
    REWARD_COLLAPSE,
    dead_groups,
    health_statistics,
    kl_blowup,
    kl_per_token,
    reward_baseline,
    reward_collapse,
    reward_falls,
)

PROMPTS = ["the movie was", "the plot was", "the movie", "the plot"]
POLICY_DETECTORS = {
    "reward_collapse",
    "empty_responses",
    "repetitive_responses",
    "kl_blowup",
    "dead_groups",
    "non_finite",
    "no_learning",
}


def lm_policy(cls=RLOOPolicy, **kw):
    params = dict(
        model=tiny_lm(),
        k=4,
        batch_size=16,
        n_steps=12,
        max_new_tokens=6,
        missing_eos_reward=None,
        random_state=0,
    )
    params.update(kw)
    return cls(**params)


def says_good(prompts, completions):
    return np.array([float("good" in c.split()) for c in completions])


def empty_is_best(prompts, completions):
    return np.array([-float(len(c.split())) for c in completions])


def all_zero(prompts, completions):
    return np.zeros(len(completions))


def fired(estimator):
    return {name for name, d in estimator.health_["detectors"].items() if d["fired"]}


def health_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RunHealthWarning)]


# ----- healthy runs are silent ------------------------------------------------------------


def test_a_healthy_run_warns_nothing_and_reports_every_detector():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunHealthWarning)
        policy = lm_policy(learning_rate=3e-3).fit(PROMPTS, says_good)
    health = policy.health_
    assert health["healthy"] is True and set(health["detectors"]) == POLICY_DETECTORS
    for name, d in health["detectors"].items():
        assert set(d) == {"fired", "first_step", "value", "threshold"}
        assert d["fired"] is False and d["first_step"] is None
        assert isinstance(d["value"], float) and isinstance(d["threshold"], float)
        # one column per detector in every row, the last row's value in health_
        assert [f"health/{name}" in row for row in policy.history_] == [True] * 12
        if name != "no_learning":  # judged at the end on the run's largest shift
            assert d["value"] == policy.history_[-1][f"health/{name}"]
    assert health["detectors"]["no_learning"]["value"] == max(
        row["policy/logprob_shift"] for row in policy.history_
    )
    # step 1 samples the start: the sampling pass and the reference agree to float rounding
    assert policy.history_[0]["policy/logprob_shift"] < 1e-6


def test_one_sample_a_prompt_has_no_dead_groups_detector():
    policy = lm_policy(GRPOPolicy, k=2, learning_rate=3e-3, n_steps=2).fit(PROMPTS, says_good)
    assert "dead_groups" in policy.health_["detectors"]
    from prefopt import ReinforcePolicy

    single = ReinforcePolicy(
        model=tiny_lm(), batch_size=8, n_steps=2, max_new_tokens=6, random_state=0
    ).fit(PROMPTS, says_good)
    assert set(single.health_["detectors"]) == POLICY_DETECTORS - {"dead_groups"}
    assert "objective/dead_group_share" not in single.history_[0]


# ----- each detector fires on its failure -------------------------------------------------


def test_a_reward_that_makes_the_empty_answer_best_fires_empty_responses():
    with pytest.warns(RunHealthWarning, match="'empty_responses' fired") as record:
        policy = lm_policy(learning_rate=1e-2, n_steps=20).fit(PROMPTS, empty_is_best)
    # the empty answer was rare under the start: over 2.1 nats a token is a KL blow-up
    # even while the reward rises
    assert fired(policy) == {"empty_responses", "kl_blowup"}
    messages = health_warnings(record)  # once per detector per fit
    assert sorted(m.split("'")[1] for m in messages) == ["empty_responses", "kl_blowup"]
    history = policy.history_
    step = policy.health_["detectors"]["kl_blowup"]["first_step"]
    assert history[step - 1]["objective/reward"] > history[0]["objective/reward"]  # gaining
    assert kl_per_token(history[:step]) > KL_CAP * KL_BLOWUP >= kl_per_token(history[: step - 1])
    step = policy.health_["detectors"]["empty_responses"]["first_step"]
    shares = [row["response/empty_share"] for row in policy.history_]
    assert smoothed(shares[:step]) > 0.8 >= smoothed(shares[: step - 1])
    assert policy.history_[-1]["response/empty_share"] == 1.0


def test_rafts_kl_advice_names_what_moves_raft():
    # beta holds RAFT only through its ranking (its loss has no KL term): its warnings of a
    # policy far from the reference (kl_blowup, and max_kl) say so; the others' name beta.
    from prefopt import RAFTPolicy

    with pytest.warns(RuntimeWarning, match="beyond max_kl.*rank_by='shaped'"):
        lm_policy(RAFTPolicy, learning_rate=1e-2, n_steps=2, max_kl=1e-9).fit(PROMPTS, says_good)

    with pytest.warns(RunHealthWarning, match="'kl_blowup' fired") as record:
        policy = lm_policy(RAFTPolicy, learning_rate=1e-2, n_steps=20).fit(PROMPTS, empty_is_best)
    assert "kl_blowup" in fired(policy)
    (message,) = [m for m in health_warnings(record) if "'kl_blowup'" in m]
    assert "rank_by='shaped'" in message and "adaptive KL controller" not in message
    rloo = lm_policy(learning_rate=1e-2, n_steps=20)
    with pytest.warns(RunHealthWarning, match="adaptive KL controller"):
        rloo.fit(PROMPTS, empty_is_best)


def count_good(prompts, completions):
    return np.array([float(c.split().count("good")) for c in completions])


def test_a_learning_rate_of_0_05_collapses_the_reward():
    # RLOO at 0.05 on a reward in {0, 1}: the reward rises to 1 by step 3, then every
    # response turns empty and scores 0 (issue 25's case). The fall is judged from step 5
    # (the baseline's last) and must hold 8 steps: the 12th step is the first it can fire.
    with pytest.warns(RunHealthWarning, match="'reward_collapse' fired at step 12"):
        policy = lm_policy(learning_rate=0.05, batch_size=32).fit(PROMPTS, says_good)
    assert fired(policy) == {"reward_collapse", "empty_responses", "dead_groups", "kl_blowup"}
    history = policy.history_
    falls = reward_falls(history)
    assert len(falls) == 8 and min(falls) > REWARD_COLLAPSE
    assert history[-1]["health/reward_collapse"] == pytest.approx(min(falls))
    assert [row["objective/reward"] for row in history[3:]] == [0.0] * 9
    assert history[-1]["response/empty_share"] > 0.9


def test_a_learning_rate_of_0_05_degenerates_into_repetition():
    # GRPO at 0.05 on a reward counting "good": "good good good ..." (a degenerate loop)
    with pytest.warns(RunHealthWarning, match="'repetitive_responses' fired"):
        policy = lm_policy(GRPOPolicy, learning_rate=0.05).fit(PROMPTS, count_good)
    assert "repetitive_responses" in fired(policy) and not policy.health_["healthy"]
    assert policy.history_[-1]["response/repeated_ngrams"] > 0.5


# GRPO's advantages are exactly 0 and nothing moves; RLOO's KL-shaped reward differs by
# float rounding between samples, which Adam's normalised step turns into a random walk.
@pytest.mark.parametrize(
    "cls, expected",
    [(RLOOPolicy, {"dead_groups"}), (GRPOPolicy, {"dead_groups", "no_learning"})],
)
def test_an_all_zero_reward_in_a_group_method_fires_dead_groups(cls, expected):
    with pytest.warns(RunHealthWarning, match="'dead_groups' fired at step 1"):
        policy = lm_policy(cls, learning_rate=3e-3).fit(PROMPTS, all_zero)
    assert fired(policy) == expected
    assert [row["objective/dead_group_share"] for row in policy.history_] == [1.0] * 12
    assert policy.health_["detectors"]["dead_groups"]["first_step"] == 1


def test_a_frozen_run_fires_no_learning_at_its_end():
    with pytest.warns(RunHealthWarning, match="'no_learning' fired at step 12"):
        policy = lm_policy(learning_rate=1e-12).fit(PROMPTS, says_good)
    assert fired(policy) == {"no_learning"}
    d = policy.health_["detectors"]["no_learning"]
    assert d["first_step"] == 12 and d["value"] < 1e-4 and d["threshold"] == 1e-4


# ----- what a firing does -----------------------------------------------------------------


def test_on_unhealthy_raise_stop_and_ignore():
    with pytest.raises(RunHealthError, match="'dead_groups' fired at step 1"):
        lm_policy(on_unhealthy="raise").fit(PROMPTS, all_zero)
    with pytest.warns(RunHealthWarning, match="dead_groups"):
        stopped = lm_policy(on_unhealthy="stop").fit(PROMPTS, all_zero)
    assert stopped.n_iter_ == 1 and len(stopped.history_) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunHealthWarning)
        quiet = lm_policy(on_unhealthy="ignore").fit(PROMPTS, all_zero)
    assert fired(quiet) == {"dead_groups"} and not quiet.health_["healthy"]
    with pytest.raises(ValueError, match="on_unhealthy"):
        lm_policy(on_unhealthy="loud").fit(PROMPTS, all_zero)


# ----- the detectors' numbers by hand -----------------------------------------------------


def rows(rewards, stds, dead=None):
    out = [{"objective/reward": r, "objective/reward_std": s} for r, s in zip(rewards, stds)]
    for row, d in zip(out, dead or [0.0] * len(out)):
        row["objective/dead_group_share"] = d
    return out


def test_reward_collapse_by_hand():
    # baseline: the first 5 steps' mean reward (2 + 0 + 1 + 1 + 1) / 5 = 1 and mean
    # spread (0.2 + 0.6 + 0.4 + 0.4 + 0.4) / 5 = 0.4
    first = rows([2, 0, 1, 1, 1], [0.2, 0.6, 0.4, 0.4, 0.4])
    assert reward_baseline(first) == pytest.approx((1.0, 0.4))
    steady = rows([1] * 5, [0.4] * 5)
    assert reward_falls(steady[:4]) == [] and reward_collapse(steady[:4]) == 0.0
    # the reward drops to 0 from step 6: the EMA (weight 0.3) goes 1, 0.7, 0.49, ...
    collapsed = steady + rows([0] * 8, [0.0] * 8)
    falls = reward_falls(collapsed)
    assert falls[:4] == pytest.approx([0.0, 0.75, 1.275, 1.6425])
    # with 12 rows the last 8 falls include step 5's 0: not yet persistent
    assert reward_collapse(collapsed[:12]) == 0.0
    assert reward_collapse(collapsed) == pytest.approx(0.75)  # steps 6-13, all > 0.28
    # a 3-step dip to 0 that recovers: over 0.28 for 7 steps only, so it never fires
    dip = steady + rows([0] * 3 + [1] * 5, [0.4] * 8)
    assert reward_collapse(dip) == pytest.approx((1 - (0.3 + 0.7 * 0.8422543)) / 0.4)
    assert reward_collapse(dip) < REWARD_COLLAPSE < reward_collapse(collapsed)


def test_kl_blowup_by_hand_its_allowance_depends_on_the_reward():
    def kl_rows(objectives, kls, length=2.0):
        return [
            {
                "objective/reward": o,
                "objective/reward_std": 0.5,
                "objective/kl": k,
                "response/length": length,
            }
            for o, k in zip(objectives, kls)
        ]

    # KL 6 nats over 2 tokens at step 6: 3 a token, smoothed 0.7 * 0 + 0.3 * 3 = 0.9; the
    # reward's start is the first 5 steps' mean 1, its smoothed value 0.7 * 1 + 0.3 * -4 =
    # -0.5: below, so the allowance is 1.2 nats a token
    kls = [0.0] * 5 + [6.0]
    losing = kl_rows([1.0] * 5 + [-4.0], kls)
    assert kl_per_token(losing) == pytest.approx(0.9)
    assert kl_blowup(losing) == pytest.approx(0.9 / KL_LOSING)
    # the same KL with the reward above its start (smoothed 1.6): 2.1 nats
    assert kl_blowup(kl_rows([1.0] * 5 + [3.0], kls)) == pytest.approx(0.9 / KL_CAP)
    # 10 nats a token at step 6 (smoothed 3) of a gaining run: over even the larger allowance
    far = kl_rows([0.0] * 5 + [5.0], [0.0] * 5 + [20.0])
    assert kl_blowup(far) == pytest.approx(3.0 / KL_CAP) and kl_blowup(far) > KL_BLOWUP
    assert KL_LOSING < KL_CAP


def test_dead_groups_count_only_while_the_reward_has_not_risen():
    assert dead_groups(rows([0, 0], [0, 0], dead=[1.0, 1.0])) == 1.0
    # risen by 0.3 (smoothed) over a start spread of 0.4: more than a quarter, converged
    assert dead_groups(rows([1, 2], [0.4, 0.0], dead=[0, 1.0])) == 0.0
    assert dead_groups(rows([1, 1], [0.4, 0.4], dead=[0, 1.0])) == pytest.approx(0.3)


def test_loss_blowup_by_hand():
    history = [{"loss/sft": v} for v in (2.0, 12.0)]
    assert loss_blowup(history) == pytest.approx((0.7 * 2.0 + 0.3 * 12.0) / 2.0)
    assert loss_blowup(history[:1]) == 0.0


def test_non_finite_counts_the_rows_numbers_but_not_its_health_columns():
    row = {"step": 3, "objective/kl": float("nan"), "loss/policy": float("inf"), "x": 1.0}
    assert count_non_finite([{**row, "health/kl_blowup": float("nan")}]) == 2.0
    assert count_non_finite([{"step": 1, "objective/kl": 0.5}]) == 0.0


def test_health_statistics_by_hand():
    eos = 2
    batch = SimpleNamespace(
        # "a a a a a" (trigram "a a a" thrice: 2 of 3 repeat), empty, "b c" then EOS
        response_ids=torch.tensor([[5, 5, 5, 5, 5], [eos, 0, 0, 0, 0], [6, 7, eos, 0, 0]]),
        response_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]),
        old_logprobs=torch.tensor([[-1.0] * 5, [-2.0, 0, 0, 0, 0], [-1.0, -1.0, -1.0, 0, 0]]),
        ref_logprobs=torch.tensor([[-1.5] * 5, [-1.0, 0, 0, 0, 0], [-1.0, -1.0, -1.0, 0, 0]]),
        scores=torch.tensor([1.0, 0.0, 2.0]),
    )
    view = SimpleNamespace(stop_ids=(eos,), k=1, needs_reference=True)
    stats = health_statistics(view, batch)
    assert stats["response/empty_share"] == pytest.approx(1 / 3)
    assert stats["response/distinct_tokens"] == pytest.approx((1 / 5 + 1) / 2)
    assert stats["response/repeated_ngrams"] == pytest.approx((2 / 3 + 0) / 2)
    assert stats["policy/logprob_shift"] == pytest.approx((5 * 0.5 + 1.0) / 9)
    assert stats["objective/reward_std"] == pytest.approx(float(np.std([1.0, 0.0, 2.0])))
    assert "objective/dead_group_share" not in stats


# ----- the supervised loop ----------------------------------------------------------------


def sft(**kw):
    params = dict(model=tiny_lm(), n_epochs=2, batch_size=2, random_state=0)
    params.update(kw)
    return SFTPolicy(**params)


DEMOS = [("the movie was", "good ."), ("the plot was", "bad .")]


def test_sft_health_silent_when_learning_and_no_learning_when_frozen():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunHealthWarning)
        healthy = sft(learning_rate=1e-3).fit(DEMOS)
    assert healthy.health_["healthy"] and set(healthy.health_["detectors"]) == {
        "non_finite",
        "loss_blowup",
        "no_learning",
    }
    assert all("health/loss_blowup" in row for row in healthy.history_)
    with pytest.warns(RunHealthWarning, match="'no_learning' fired at step 2"):
        frozen = sft(learning_rate=1e-12).fit(DEMOS)
    assert fired(frozen) == {"no_learning"}
    with pytest.raises(RunHealthError, match="SFTPolicy: run health detector 'no_learning'"):
        sft(learning_rate=1e-12, on_unhealthy="raise").fit(DEMOS)
    assert frozen.history_[-1]["model/weight_change"] < 1e-6


def test_the_supervised_estimators_take_on_unhealthy():
    from prefopt import DPOPolicy, RewardModel

    for cls in (SFTPolicy, DPOPolicy, RewardModel):
        assert cls().get_params()["on_unhealthy"] == "warn"


def test_grpo_at_beta_0_judges_no_learning_by_the_weights_not_a_skipped_reference():
    # No reference pass at beta 0 (TRL's default): no log-prob shift is measured, so the
    # detector reads the weights; a learning run stays silent, a frozen one still fires.
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        policy = lm_policy(GRPOPolicy, beta=0.0, learning_rate=3e-3).fit(PROMPTS, says_good)
    assert "no_learning" not in fired(policy), health_warnings(record)
    assert all("policy/logprob_shift" not in row for row in policy.history_)
    d = policy.health_["detectors"]["no_learning"]
    assert d["threshold"] == 1e-6
    assert d["value"] == max(row["model/weight_change"] for row in policy.history_) > 1e-6
    with pytest.warns(RunHealthWarning, match="'no_learning' fired at step 12"):
        frozen = lm_policy(GRPOPolicy, beta=0.0, learning_rate=1e-12).fit(PROMPTS, says_good)
    assert "no_learning" in fired(frozen)
    assert frozen.health_["detectors"]["no_learning"]["value"] < 1e-6
