"""The experiment-only switches: SFT padding with EOS, PPO with dropout left on.

Each does what its docstring says, and the default is unchanged.
"""

import functools

import numpy as np
import pytest
import torch

import prefopt
from prefopt import PPOPolicy, SFTPolicy
from prefopt.worlds import TinyLMWorld

prefopt.set_config(show_progress_bar=False)


@functools.cache
def _sft(pad_token):
    world = TinyLMWorld(random_state=0)
    # Every demonstration is "a" then EOS: a model that learns to stop ends after one word.
    data = [(world.prompts[0], "a")] * 64
    sft = SFTPolicy(
        model=world.policy_model(),
        learning_rate=3e-2,
        n_epochs=4,
        pad_token=pad_token,
        random_state=0,
    ).fit(data)
    a = world.tokenizer.convert_tokens_to_ids("a")
    # log P("a") and log P("a", EOS) at temperature 1: their difference is log P(EOS | "a").
    word, ended = sft.log_prob([world.prompts[0]] * 2, [[a], "a"], temperature=1.0)
    return sft, float(np.exp(word)), float(np.exp(ended - word))


def test_sft_default_pad_is_distinct_and_learns_to_stop():
    assert SFTPolicy().pad_token == "distinct"
    _, p_word, p_stop = _sft("distinct")
    assert p_word > 0.5 and p_stop > 0.5  # measured 0.75 and 0.77


def test_sft_pad_eos_drops_eos_from_the_loss_so_the_model_does_not_learn_to_stop():
    distinct, _, stop_distinct = _sft("distinct")
    eos, p_word, stop_eos = _sft("eos")
    assert p_word > 0.5  # the word itself is learned (measured 0.9999)...
    assert stop_eos < 0.01 < stop_distinct  # ...stopping after it is not (measured 4e-5)
    # Only the completion's word is a target: its EOS is masked as if it were padding.
    assert eos.history_[0]["data/tokens"] * 2 == distinct.history_[0]["data/tokens"]


def _ppo(dropout, seed=0):
    world = TinyLMWorld(random_state=0)
    torch.manual_seed(seed)
    return PPOPolicy(
        model=world.policy_model(),
        beta=0.1,
        n_steps=1,
        batch_size=32,
        n_epochs=1,
        learning_rate=1e-3,
        dropout=dropout,
        random_state=seed,
    ).fit(world.prompts, world.reward)


def test_ppo_default_has_dropout_off_ratio_one_and_zero_kl_at_the_start():
    assert PPOPolicy().dropout is None
    ppo = _ppo(None)
    row = ppo.history_[0]
    assert row["policy/ratio_mean"] == 1.0
    assert row["policy/clipfrac"] == 0.0
    assert abs(row["objective/kl"]) < 1e-6  # the policy is the reference at step 1
    assert not ppo.model_.training


def test_ppo_dropout_on_moves_the_first_ratio_and_the_kl_estimate():
    ppo = _ppo(0.3)
    row = ppo.history_[0]
    assert ppo.model_.training
    rates = {m.p for m in ppo.model_.modules() if isinstance(m, torch.nn.Dropout)}
    assert rates == {0.3}
    assert row["policy/approxkl"] > 1e-4  # ratio != 1 before any update
    assert abs(row["objective/kl"]) > 1e-3  # same weights as the reference, yet KL != 0
    # The reference and the value model keep dropout off.
    assert not ppo.ref_model_.training


def test_ppo_dropout_is_refused_with_a_shared_value_head():
    world = TinyLMWorld(random_state=0)
    policy = PPOPolicy(model=world.policy_model(), dropout=0.1, value_model="shared")
    with pytest.raises(ValueError, match="value_model='shared'"):
        policy.fit(world.prompts, world.reward)
