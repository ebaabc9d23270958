"""No forward pass is done twice: forward calls per step, counted for every algorithm.

Per step with T new tokens, E epochs and M minibatches: the policy runs at most T times
to sample (the prompt, then one cached call per further token, stopping once every
response has ended), once more for the old
log-probs when the loss uses the ratio (PPO), E*M times in the update, and once (in M
chunks) to measure the update's change for the default adaptive rate; the reference sees
every row once (in M chunks of the minibatch size); PPO's value model once at rollout and E*M
times in the update; a language-model reward model once.

A pass over rows that share prompts (the k samples of a prompt, or a prompt drawn twice)
is two calls: the distinct prompts, once each, then every row's response on the cached
prompt. So the count below is of *fresh* calls, those given no KV cache (a sampling
prefill, a full pass, the prompt part of a shared pass); the calls given a cache are
sampling's decode steps and the response parts, at most one per pass.
"""

from collections import Counter

import numpy as np
import pytest
from _tiny import tiny_lm

from prefopt import PPOPolicy, RAFTPolicy, ReinforcePolicy, RewardModel, RLOOPolicy, SFTPolicy

PROMPTS = ["the movie was", "the plot was"]
T = 4


def _count(model):
    calls = Counter()

    def hook(module, args, kwargs, output):
        cached = kwargs.get("cache", kwargs.get("past_key_values")) is not None
        key = (id(module), "cached" if cached else "fresh")
        calls[key] += 1
        calls[key + ("rows",)] += kwargs["input_ids"].shape[0]

    handle = model.register_forward_hook(hook, with_kwargs=True)
    return calls, handle


TRUNK_CALLS = Counter()


def trunk_hook(module, args, kwargs, output):
    cached = kwargs.get("cache", kwargs.get("past_key_values")) is not None
    TRUNK_CALLS[(id(module), "cached" if cached else "fresh")] += 1


@pytest.mark.parametrize(
    "cls, kwargs, epochs, minibatches",
    [
        (PPOPolicy, {}, 4, 1),
        (PPOPolicy, {"n_epochs": 2, "n_minibatches": 2}, 2, 2),
        (RLOOPolicy, {"k": 2}, 1, 2),
        (ReinforcePolicy, {}, 1, 2),
        (RAFTPolicy, {"k": 2}, 4, 1),
    ],
)
def test_forward_calls_per_step(cls, kwargs, epochs, minibatches):
    model = tiny_lm()
    calls, handle = _count(model)  # deepcopies of the model keep the hook
    # PPO's value model copies the policy's transformer trunk: hook the trunk too.
    model.transformer.register_forward_hook(trunk_hook, with_kwargs=True)
    reward = lambda p, c: np.array([x.count("good") for x in c], dtype=float)  # noqa: E731

    def count_second_step_only(policy, row):
        # The first step of a model also checks, once, that it reads a ready 4D decode
        # mask (one extra one-token call in its lifetime); count a step after it.
        if row["step"] == 1:
            calls.clear()
            TRUNK_CALLS.clear()

    policy = cls(
        model=model, max_new_tokens=T, batch_size=8, n_steps=2, random_state=0, **kwargs
    ).fit(PROMPTS, reward, callback=count_second_step_only)
    handle.remove()
    # PPO (ratio) recomputes old log-probs in a training-identical pass; the others read
    # them from the sampling pass.
    old_pass = 1 if cls is PPOPolicy else 0
    # The default (adaptive) learning rate measures the update's change in one more pass
    # without gradients, in chunks of the minibatch size.
    measure = minibatches
    passes = 1 + old_pass + epochs * minibatches + measure  # sampling, old, update, change
    policy_id, ref_id = id(policy.model_), id(policy.ref_model_)
    assert calls[(policy_id, "fresh")] == passes
    # Sampling's decode calls (at most T - 1: it stops once every response has ended),
    # and at most one response call per pass over shared prompts.
    assert calls[(policy_id, "cached")] <= T - 1 + old_pass + epochs * minibatches + measure
    # The reference runs once over the batch, in chunks of the minibatch size; each
    # chunk's prompts once each (2 distinct prompts) and every response once, or every
    # row in one call.
    assert calls[(ref_id, "fresh")] == policy.n_minibatches
    if calls[(ref_id, "cached")]:
        assert calls[(ref_id, "fresh", "rows")] <= len(PROMPTS) * policy.n_minibatches
        assert calls[(ref_id, "cached", "rows")] == policy.batch_size
    else:
        assert calls[(ref_id, "fresh", "rows")] == policy.batch_size
    if cls is PPOPolicy:
        trunk = id(policy.value_model_.backbone)
        assert TRUNK_CALLS[(trunk, "fresh")] == 1 + epochs * minibatches
        assert TRUNK_CALLS[(trunk, "cached")] <= 1 + epochs * minibatches


def test_language_model_reward_scores_a_batch_in_one_forward():
    demos = [("the movie was", "good ."), ("the plot was", "bad .")] * 4
    sft = SFTPolicy(model=tiny_lm(), learning_rate=1e-2, n_epochs=2, random_state=0).fit(demos)
    rm = RewardModel(model=sft, normalize_samples=8, random_state=0).fit(
        [("the movie was", "good .", "bad .")] * 8
    )
    calls, handle = _count(rm.model_)
    RLOOPolicy(model=sft, k=2, batch_size=8, n_steps=1, random_state=0).fit(PROMPTS, rm)
    handle.remove()
    assert calls[(id(rm.model_), "fresh")] == 1 and calls[(id(rm.model_), "cached")] == 0
