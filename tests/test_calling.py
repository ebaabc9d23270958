"""Rewards are called by the names they declare (TRL's way); what cannot be supplied fails early.

The class of failure: a call whose shape is guessed. A reward written for TRL,
``def r(completions, answer)``, called positionally receives the prompts as its
completions and scores 0 everywhere, with no warning.
"""

import numpy as np
import pandas as pd
import pytest
from _tiny import small_policy

import prefopt
from prefopt import NoisyReward, RLOOPolicy, WeightedRewards
from prefopt.rewards import call_with_columns, check_reward_columns
from prefopt.worlds import PreferenceWorld

WORLD = PreferenceWorld(random_state=0)
PROMPTS = list(WORLD.prompts)


@pytest.fixture(autouse=True)
def quiet():
    prefopt.set_config(show_progress_bar=False)


def fit(reward, X=None, **params):
    est = small_policy(
        WORLD, RLOOPolicy, k=2, batch_size=4, n_steps=1, learning_rate=0.1, random_state=0
    )
    return est.set_params(**params).fit(PROMPTS if X is None else X, reward)


def frame():
    return pd.DataFrame({"prompt": PROMPTS, "answer": [f"a{i}" for i in range(len(PROMPTS))]})


def test_a_trl_style_reward_gets_the_completions_not_the_prompts():
    seen = []

    def trl(completions, answer):  # TRL's signature: no prompts, a column
        seen.append((list(completions), list(answer)))
        return [float(len(c)) for c in completions]

    fit(trl, frame())
    completions, answers = seen[0]
    assert not set(completions) & set(PROMPTS)  # sampled responses, not the prompts
    assert set(answers) <= set(frame().answer)
    # The same reward's values are the lengths of the completions it was given.
    values = call_with_columns(trl, ["q1", "q2"], ["abc", "de"], {"answer": ["x", "y"]})
    assert values == [3.0, 2.0]


@pytest.mark.parametrize(
    "reward",
    [
        lambda completions, **kw: [float(len(kw["prompts"][i])) for i in range(len(completions))],
        lambda *, completions, prompts: [float(len(p)) for p in prompts],  # ours: keyword-only
        lambda p, c, /: [float(len(x)) for x in p],  # ours: positional-only, unambiguous
        lambda *args: [float(len(x)) for x in args[0]],  # ours: *args
    ],
    ids=["kwargs", "keyword-only", "positional-only", "varargs"],
)
def test_every_unambiguous_signature_gets_prompts_and_completions(reward):
    assert call_with_columns(reward, ["abcd", "ef"], ["x", "y"]) == [4.0, 2.0]
    fit(reward)  # not only at the end of the first step: the whole fit runs


def test_a_declared_name_that_cannot_be_supplied_fails_before_training():
    calls = []

    def needs(prompts, completions, solution):
        calls.append(1)
        return np.zeros(len(completions))

    with pytest.raises(ValueError, match=r"takes the argument 'solution', which is not a column"):
        fit(needs, frame())
    # Ours: the singular names TRL's users sometimes write, in the swapped order.
    with pytest.raises(TypeError, match=r"names an argument 'completion'.*did you mean"):
        fit(lambda completion, prompt: [0.0] * len(completion))
    # Ours: a column's name where the texts are passed.
    with pytest.raises(TypeError, match=r"argument 'answer' is a column of the prompts but sits"):
        fit(lambda p, answer: [0.0] * len(p), frame())
    # Ours: one place for two texts; prompts without completions.
    with pytest.raises(TypeError, match=r"takes 1 positional argument;"):
        fit(lambda texts: [0.0] * len(texts))
    with pytest.raises(TypeError, match=r"takes 'prompts' but no 'completions'"):
        fit(lambda x, prompts: [0.0] * len(prompts))
    assert not calls


def test_wrappers_call_their_parts_by_the_same_rules():
    def trl(completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    def length(prompts, completions):
        return [float(len(c)) for c in completions]

    both = WeightedRewards([trl, length], weights=[10.0, 1.0])
    values = both(["q", "q"], ["a0", "zzz"], answer=["a0", "a1"])
    assert values.tolist() == [12.0, 3.0]
    # Ours: a TRL-style reward inside NoisyReward (std 0: exactly the reward).
    noisy = NoisyReward(trl, std=0.0, random_state=0)
    assert noisy(["q", "q"], ["a0", "b"], answer=["a0", "a1"]).tolist() == [1.0, 0.0]
    # The early check sees through both wrappers.
    for wrapped in (WeightedRewards([length, trl]), NoisyReward(trl)):
        with pytest.raises(ValueError, match="'answer', which is not a column"):
            check_reward_columns(wrapped, ["solution"])


def test_a_per_token_reward_in_a_list_keeps_its_per_token_path():
    import torch

    from prefopt.worlds import TinyLMWorld

    tiny = TinyLMWorld(random_state=0)

    def keep(self, batch):
        self.seen_batch_ = batch
        return RLOOPolicy.compute_advantages(self, batch)

    spy = type("KeepRLOO", (RLOOPolicy,), {"compute_advantages": keep})

    def batch(reward, weights=None):
        policy = spy(
            model=tiny.policy_model(), n_steps=1, batch_size=8, random_state=0,
            reward_weights=weights,
        )  # fmt: skip
        return policy.fit(tiny.prompts, reward).seen_batch_

    alone = batch(tiny.token_reward())
    listed = batch([tiny.token_reward()])
    torch.testing.assert_close(listed.rewards, alone.rewards)
    before_last = alone.rewards * alone.response_mask
    before_last[torch.arange(len(alone)), alone.last_index] = 0.0
    assert before_last.abs().sum() > 0  # paid along the response, not only at its end

    # Ours: with a plain reward beside it, the plain one pays at the last token only.
    def bonus(prompts, completions):
        return [3.0] * len(completions)

    mixed = batch([tiny.token_reward(), bonus], weights=[1.0, 0.5])
    extra = mixed.rewards - alone.rewards
    want = torch.zeros_like(extra)
    want[torch.arange(len(alone)), alone.last_index] = 1.5
    ended = alone.ended  # a response with no EOS gets missing_eos_reward as its total instead
    assert ended.any() and (~ended).any()
    torch.testing.assert_close((extra * alone.response_mask)[ended], want[ended])
    torch.testing.assert_close(mixed.scores[~ended], alone.scores[~ended])
