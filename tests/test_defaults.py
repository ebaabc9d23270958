"""The usage line as users write it, and defaults that learn on every world.

Shares are (J(pi) - J(pi_ref)) / (J(pi*) - J(pi_ref)), exact. Measured at the
defaults (seeds 0 and 1): preference world, Adam 0.1 (the log-linear default),
100 steps: at beta 0.1 PPO 0.999 / 1.000, RLOO 0.993 / 0.994, REINFORCE 0.994 /
0.994; at beta 0.3 PPO 1.000 / 1.000, RLOO 0.994 / 0.996, REINFORCE 0.995 / 0.996;
RAFT 0.992 / 0.994 of the way to the reward-maximising policy. TinyLMWorld
(seed 0) at 1e-3, the rate for a tiny model trained from scratch: PPO 0.989 /
0.991, RLOO 0.914 / 0.962, REINFORCE 0.936 / 0.969. The thresholds are the
issue's 0.9. At the defaults (the adaptive rate, from the tiny-model rates of
LR_SWEEP.md's rule 2) TinyLMWorld gets 0.89-1.00 of it; the review-world tests below
check the defaults on a fine-tuned start.
"""

import numpy as np
import pytest

import prefopt
from prefopt import GRPOPolicy, PPOPolicy, RAFTPolicy, ReinforcePolicy, RewardModel, RLOOPolicy
from prefopt.worlds import PreferenceWorld, TinyLMWorld


@pytest.fixture(scope="module")
def pref():
    prefopt.set_config(show_progress_bar=False)
    world = PreferenceWorld(random_state=0)
    return world, RewardModel().fit(world.comparisons(1000, random_state=0))


def test_the_usage_line_runs_as_written(pref):
    world, reward_model = pref
    prompts = world.prompts
    policy = RLOOPolicy(beta=0.1).fit(prompts, reward_model)  # no model=, no learning rate
    assert world.objective_share(policy, reward_model, 0.1) >= 0.9


def test_a_plain_reward_without_a_model_says_what_to_pass(pref):
    world, _ = pref
    with pytest.raises(ValueError, match=r"no starting policy: pass model="):
        RLOOPolicy(beta=0.1).fit(world.prompts, world.true_quality)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [PPOPolicy, RLOOPolicy, ReinforcePolicy])
@pytest.mark.parametrize("beta", [0.1, 0.3])
def test_defaults_learn_on_the_preference_world(pref, cls, beta):
    world, rm = pref
    policy = cls(model=world.policy_model(), beta=beta, random_state=0).fit(world.prompts, rm)
    assert world.objective_share(policy, rm, beta) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("on", ["preference", "tiny_lm"])
def test_raft_defaults_go_most_of_the_way_to_the_reward_maximiser(pref, on):
    # Measured, seeds 0-2, ranked by the KL-shaped reward (the default): preference world
    # 0.992-0.994 (the log-linear default, 0.1); TinyLMWorld 0.958-0.966 at 1e-3, the rate
    # for a tiny model trained from scratch (4 epochs, the default; 1 epoch reached 0.73).
    # Ranked by score: 0.994-0.995 and 0.958-0.965.
    rate = None
    if on == "preference":
        world, reward = pref
    else:
        world, rate = TinyLMWorld(random_state=0), 1e-3
        reward = world.reward
    policy = RAFTPolicy(model=world.policy_model(), learning_rate=rate, random_state=0)
    policy.fit(world.prompts, reward)
    r, ref = world.rewards(reward), world.reference_probs()
    start, best = (ref * r).sum(1).mean(), r.max(1).mean()
    reached = (world.policy_probs(policy) * r).sum(1).mean()
    assert (reached - start) / (best - start) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("cls", [PPOPolicy, RLOOPolicy, ReinforcePolicy])
@pytest.mark.parametrize("beta", [0.1, 0.3])
def test_a_tiny_lm_trained_from_scratch_learns_at_1e3(cls, beta):
    # TinyLMWorld's policy is trained nearly from scratch: at 1e-3 (the rate to pass there,
    # README) every policy gets 0.9 of the achievable objective in the default 100 steps.
    prefopt.set_config(show_progress_bar=False)
    world = TinyLMWorld(random_state=0)
    policy = cls(model=world.policy_model(), beta=beta, learning_rate=1e-3, random_state=0)
    policy.fit(world.prompts, world.reward)
    share = world.objective_share(policy, world.reward, beta)
    print(f"{cls.__name__} beta={beta}: share {share:.3f}")
    assert share >= 0.9 and np.isfinite(share)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [PPOPolicy, RLOOPolicy, GRPOPolicy, ReinforcePolicy])
def test_the_new_defaults_still_learn_on_the_tiny_lm_world(cls):
    # The adaptive default starts at the tiny-model rates of LR_SWEEP.md's rule 2 (PPO and
    # REINFORCE 3e-4, RLOO and GRPO 1e-4), chosen where 1e-3 collapses fine-tuned models; on
    # TinyLMWorld, trained nearly from scratch, it climbs. Measured (seed 0, beta 0.1, 100
    # steps): share PPO 0.997, RLOO 0.979, GRPO 0.890, REINFORCE 0.952; expected gold -0.316
    # -> 0.991, 0.952, 0.822, 0.921 (at the fixed rates it replaced: shares 0.905, 0.331,
    # 0.272, 0.526).
    prefopt.set_config(show_progress_bar=False)
    world = TinyLMWorld(random_state=0)
    policy = cls(model=world.policy_model(), beta=0.1, random_state=0)
    policy.fit(world.prompts, world.reward)
    assert policy.learning_rate_ == cls.tiny_model_learning_rate
    share = world.objective_share(policy, world.reward, 0.1)
    start = world.evaluate(world.reference_probs(), world.reward, 0.1)["reward"]
    end = world.evaluate(policy, world.reward, 0.1)["reward"]
    print(f"{cls.__name__}: share {share:.3f}, gold {start:.3f} -> {end:.3f}")
    assert share > 0.5 and end > start
    assert not any(v["fired"] for v in policy.health_["detectors"].values())


@pytest.fixture(scope="module")
def review():
    from prefopt import SFTPolicy
    from prefopt.worlds import ReviewWorld

    prefopt.set_config(show_progress_bar=False)
    world = ReviewWorld(random_state=0)
    sft = SFTPolicy(model=world.model_config(), random_state=0).fit(world.demonstrations)
    rm = RewardModel(model=sft, random_state=0).fit(world.comparisons(sft, 2000, random_state=0))
    return world, sft, rm


def _gold_and_distinct(world, policy, prompts):
    completions = [c for group in policy.sample(prompts, n=4, random_state=1) for c in group]
    repeated = [p for p in prompts for _ in range(4)]
    distinct = np.mean([len(set(c.split())) / max(len(c.split()), 1) for c in completions])
    return float(np.mean(world.gold_reward(repeated, completions))), float(distinct)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*ended with EOS")
@pytest.mark.parametrize("cls", [RLOOPolicy, PPOPolicy])
def test_the_usage_line_on_the_review_world(review, cls):
    # Measured (seed 0) at the defaults (the adaptive rate; RLOO at 256 episodes a step):
    # SFT gold 0.097, distinct-word share 0.89; RLOO reaches gold 0.878 (distinct 0.69), PPO
    # 0.916 (distinct 0.72). At the fixed tiny-model rates before issue 35, RLOO (1e-4)
    # reached 0.265 and PPO (3e-4) 0.909; the bar is a gain of 0.4.
    world, sft, reward_model = review
    prompts = world.prompts
    policy = cls(beta=0.05, random_state=0).fit(prompts, reward_model)  # starts from sft
    held = prompts[:64]
    gold_sft, distinct_sft = _gold_and_distinct(world, sft, held)
    gold, distinct = _gold_and_distinct(world, policy, held)
    print(
        f"{cls.__name__}: gold {gold_sft:.3f} -> {gold:.3f}, distinct {distinct_sft:.2f} -> "
        f"{distinct:.2f}"
    )
    assert gold >= gold_sft + 0.4
    assert distinct >= 0.5 * distinct_sft
