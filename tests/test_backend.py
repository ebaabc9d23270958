"""The token-level details of Huang et al. 2024 (PPO for RLHF), one test each."""

import copy

import numpy as np
import pytest
import torch
from _tiny import tiny_config, tiny_lm, word_tokenizer
from transformers import GPT2Model

from prefopt import PPOPolicy, RewardModel, RLOOPolicy, SFTPolicy
from prefopt.backend import (
    EncodedPrompts,
    ScalarHeadModel,
    encode_prompts,
    ensure_pad_token,
    join_right_padded,
    make_generator,
    pad_left,
    response_logprobs,
    sample,
    score_sequences,
    truncate_after_eos,
)
from prefopt.policies.loop._loop import PolicyLoop
from prefopt.validation import validate_params

PROMPTS = ["the movie was", "the plot was"]
DEMOS = [
    ("the movie was", "good ."),
    ("the movie was", "bad ."),
    ("the plot was", "great ."),
    ("the plot was", "awful ."),
] * 8


def test_pad_token_added_when_missing_or_equal_to_eos():
    tok = word_tokenizer(pad=False)
    assert tok.pad_token_id is None
    fixed = ensure_pad_token(tok)
    assert fixed.pad_token_id is not None and fixed.pad_token_id != fixed.eos_token_id
    assert tok.pad_token_id is None  # the caller's tokenizer is untouched
    same = word_tokenizer(pad=False)
    same.pad_token = same.eos_token
    fixed = ensure_pad_token(same)
    assert fixed.pad_token_id != fixed.eos_token_id
    assert same.pad_token_id == same.eos_token_id


def test_prompts_left_padded_for_generation():
    tok = word_tokenizer()
    enc = encode_prompts(tok, ["the movie was", "the"])
    pad = tok.pad_token_id
    assert enc.input_ids[1, :2].tolist() == [pad, pad]
    assert enc.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_left_padding_does_not_change_log_probs():
    model = tiny_lm().eval()
    tok = model.tokenizer
    prompt = tok("the movie was", add_special_tokens=False)["input_ids"]
    response = torch.tensor([tok.convert_tokens_to_ids(["good", "."])])
    mask = torch.ones_like(response)
    alone = response_logprobs(
        model, pad_left([prompt], tok.pad_token_id), response, mask, temperature=0.7
    )
    padded = response_logprobs(
        model,
        pad_left([prompt, prompt + [5, 6, 7]], tok.pad_token_id),
        response.repeat(2, 1),
        mask.repeat(2, 1),
        temperature=0.7,
    )
    torch.testing.assert_close(alone[0], padded[0], rtol=0, atol=1e-5)


def test_sampling_matches_the_training_forward_pass():
    # Sampling uses the KV cache; the training pass recomputes everything. The sampled
    # tokens' probabilities must agree (same positions, same temperature).
    model = tiny_lm().eval()
    tok = model.tokenizer
    enc = encode_prompts(tok, PROMPTS)
    raw = sample(
        model,
        enc,
        max_new_tokens=6,
        temperature=0.7,
        generator=make_generator(0),
        suppress_ids=(tok.pad_token_id,),
    )
    assert raw.shape == (2, 6)
    assert not (raw == tok.pad_token_id).any()  # the pad token is never sampled
    ids, mask, _ = truncate_after_eos(raw, tok.eos_token_id, tok.pad_token_id)
    lp = response_logprobs(model, enc, ids, mask, temperature=0.7)
    assert torch.isfinite(lp).all() and (lp <= 0).all()


class _NoCache(torch.nn.Module):
    """The same model without a KV cache: sampling recomputes the whole sequence."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )
        return type("Out", (), {"logits": out.logits})()


def test_kv_cache_sampling_equals_full_recomputation():
    # Same generator, same draws: the cached and uncached paths must pick the same tokens
    # at every step, including with left-padded prompts of different lengths.
    model = tiny_lm().eval()
    tok = model.tokenizer
    enc = encode_prompts(tok, ["the movie was", "the", "the plot was good"] * 4)
    kwargs = dict(max_new_tokens=8, temperature=1.0, suppress_ids=(tok.pad_token_id,))
    cached = sample(model, enc, generator=make_generator(3), **kwargs)
    full = sample(_NoCache(model), enc, generator=make_generator(3), **kwargs)
    assert torch.equal(cached, full)


def test_truncation_after_first_eos_in_rollouts():
    model = tiny_lm()
    eos = model.tokenizer.eos_token_id
    raw = torch.tensor([[5, eos, 6, eos], [5, 6, 7, 8]])
    ids, mask, ended = truncate_after_eos(raw, eos, model.tokenizer.pad_token_id)
    assert ids[0].tolist() == [5, eos, model.tokenizer.pad_token_id, model.tokenizer.pad_token_id]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert ended.tolist() == [True, False]


def _started(policy, reward):
    """The loop of a fresh run of ``policy`` on PROMPTS, before any step."""
    validate_params(policy)
    run, _ = policy._start_run(reward, policy.model)
    policy.reward_model_ = reward
    return PolicyLoop(policy, view=policy._step_view(), run=run, prompts=PROMPTS, reward=reward)


def test_missing_eos_reward_replaces_the_score():
    # An EOS-less response scores -1 whatever the reward says (replaced, not offset).
    loop = _started(
        RLOOPolicy(model=tiny_lm(), k=2, max_new_tokens=2, batch_size=16, random_state=0),
        lambda p, c: np.full(len(c), 5.0),
    )
    batch = loop.rollout(np.array([0, 1] * 4))
    assert (~batch.ended).any() and batch.ended.any()
    expected = torch.where(batch.ended, torch.tensor(5.0), torch.tensor(-1.0))
    torch.testing.assert_close(batch.scores, expected)
    # The score sits at each response's last real token in the shaped reward.
    last = batch.response_mask.sum(1) - 1
    shaped = (
        batch.rewards[torch.arange(len(batch)), last]
        + batch.beta * batch.kl[torch.arange(len(batch)), last]
    )
    torch.testing.assert_close(shaped, expected)


def test_missing_eos_reward_none_keeps_the_score():
    loop = _started(
        RLOOPolicy(
            model=tiny_lm(),
            k=2,
            max_new_tokens=2,
            batch_size=16,
            missing_eos_reward=None,
            random_state=0,
        ),
        lambda p, c: np.full(len(c), 5.0),
    )
    batch = loop.rollout(np.array([0, 1] * 4))
    assert (batch.scores == 5.0).all()


def test_ratio_exactly_one_and_no_clipping_at_first_epoch():
    reward = lambda p, c: np.array([len(x) for x in c], dtype=float)  # noqa: E731
    loop = _started(
        PPOPolicy(
            model=tiny_lm(), max_new_tokens=5, batch_size=8, learning_rate=1e-2, random_state=0
        ),
        reward,
    )
    batch = loop.rollout(np.array([0, 1] * 4))
    policy = loop.policy
    again = response_logprobs(
        policy.model_,
        batch.prompts,
        batch.response_ids,
        batch.response_mask,
        temperature=policy.temperature_,
        suppress_ids=policy._suppress_ids,
        prompt_index=batch.prompt_index,  # the training pass runs each prompt once too
    )
    assert torch.equal(again, batch.old_logprobs)
    ppo = PPOPolicy(
        model=tiny_lm(),
        max_new_tokens=5,
        batch_size=8,
        n_epochs=1,
        learning_rate=1e-2,
        n_steps=1,
        random_state=0,
    ).fit(PROMPTS, reward)
    row = ppo.history_[0]
    assert row["policy/clipfrac"] == 0.0
    assert row["policy/approxkl"] == 0.0
    assert row["policy/ratio_mean"] == 1.0


def test_dropout_off_in_every_model():
    model = tiny_lm(resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    reward = lambda p, c: np.zeros(len(c))  # noqa: E731
    ppo = PPOPolicy(model=model, max_new_tokens=3, batch_size=4, n_steps=1, random_state=0).fit(
        PROMPTS, reward
    )
    for m in (ppo.model_, ppo.ref_model_, ppo.value_model_):
        drops = [mod.p for mod in m.modules() if isinstance(mod, torch.nn.Dropout)]
        assert drops and all(p == 0.0 for p in drops)
    # The user's model is not mutated.
    assert any(mod.p == 0.5 for mod in model.modules() if isinstance(mod, torch.nn.Dropout))
    enc = encode_prompts(ppo.tokenizer_, PROMPTS)
    a = ppo.model_(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits
    b = ppo.model_(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits
    assert torch.equal(a, b)


def test_reference_model_is_frozen_and_unchanged():
    reward = lambda p, c: np.array([c_.count("good") for c_ in c], dtype=float)  # noqa: E731
    start = tiny_lm()
    policy = RLOOPolicy(
        model=start,
        k=2,
        max_new_tokens=4,
        batch_size=8,
        n_steps=3,
        learning_rate=1e-2,
        random_state=0,
    ).fit(PROMPTS, reward)
    for (name, p_ref), p_start in zip(policy.ref_model_.named_parameters(), start.parameters()):
        assert not p_ref.requires_grad
        assert torch.equal(p_ref, p_start), name
    changed = [
        not torch.equal(p, q) for p, q in zip(policy.model_.parameters(), start.parameters())
    ]
    assert all(changed)  # every trained weight moved


def test_reward_head_init_std():
    class Wide(torch.nn.Module):
        config = type("C", (), {"hidden_size": 4095})()

    head = ScalarHeadModel(Wide(), generator=make_generator(0))
    std = head.head.weight.std().item()
    # 4095 draws: the sample std is within 3% of 1/sqrt(4096) = 0.015625 (its own std is ~1.1%).
    assert abs(std - 1 / 64) < 0.03 / 64
    assert head.head.bias.item() == 0.0


def test_reward_read_at_the_last_real_token():
    tok = word_tokenizer()
    trunk = GPT2Model(tiny_config(tok))
    model = ScalarHeadModel(trunk, generator=make_generator(0)).eval()
    eos = tok.eos_token_id
    ids, mask, last = join_right_padded([[3, 4], [3]], [[5, eos], [6, 7, eos]], tok.pad_token_id)
    assert last.tolist() == [3, 3]
    scores = score_sequences(model, ids, mask, last)
    # Same as the model's output at the EOS position of each unpadded sequence.
    for row, seq in enumerate([[3, 4, 5, eos], [3, 6, 7, eos]]):
        full = model(torch.tensor([seq]))
        torch.testing.assert_close(scores[row], full[0, -1], rtol=0, atol=1e-5)


def test_sft_learns_to_emit_eos():
    sft = SFTPolicy(
        model=tiny_lm(), learning_rate=1e-2, n_epochs=20, batch_size=8, random_state=0
    ).fit(DEMOS)
    assert sft.max_new_tokens_ == 3  # longest completion (2 words) plus EOS
    assert sft.history_[-1]["loss/sft"] < 0.5 * sft.history_[0]["loss/sft"]
    completions = [c for row in sft.sample(PROMPTS, n=16) for c in row]
    enc = encode_prompts(sft.tokenizer_, PROMPTS * 16)
    raw = sample(
        sft.model_,
        enc,
        max_new_tokens=sft.max_new_tokens_,
        temperature=sft.temperature_,
        generator=make_generator(1),
        suppress_ids=sft._suppress_ids,
    )
    _, _, ended = truncate_after_eos(raw, sft.tokenizer_.eos_token_id, sft.tokenizer_.pad_token_id)
    assert ended.float().mean() > 0.9
    assert sum(c.endswith(".") for c in completions) > 0.9 * len(completions)


@pytest.fixture(scope="module")
def sft():
    return SFTPolicy(
        model=tiny_lm(), learning_rate=1e-2, n_epochs=20, batch_size=8, random_state=0
    ).fit(DEMOS)


COMPARISONS = [
    ("the movie was", "good .", "bad ."),
    ("the plot was", "great .", "awful ."),
    ("the movie was", "great .", "awful ."),
    ("the plot was", "good .", "bad ."),
] * 8


def test_reward_model_normalised_on_starting_policy(sft):
    rm = RewardModel(model=sft, learning_rate=3e-3, normalize_samples=128, random_state=0).fit(
        COMPARISONS
    )
    assert rm.score(COMPARISONS) == 1.0
    norm = rm.normalization_
    assert rm.gain_ * norm["mean"] + rm.bias_ == pytest.approx(0.0, abs=1e-9)
    assert rm.gain_ * norm["std"] == pytest.approx(1.0)
    # Fresh samples of the starting policy, scored as the RL loop scores them (token ids,
    # no decoding), have mean ~0 and std ~1: 512 draws give a standard error of 0.044 on
    # the mean, so 0.15 is over 3 standard errors.
    enc = encode_prompts(sft.tokenizer_, PROMPTS * 256)
    raw = sample(
        sft.model_,
        enc,
        max_new_tokens=sft.max_new_tokens_,
        temperature=sft.temperature_,
        generator=make_generator(7),
        suppress_ids=sft._suppress_ids,
    )
    ids, mask, _ = truncate_after_eos(raw, sft.tokenizer_.eos_token_id, sft.tokenizer_.pad_token_id)
    scores = rm.score_tokens(enc, ids, mask).detach().numpy()
    assert abs(scores.mean()) < 0.15 and 0.85 < scores.std() < 1.15


def test_reward_model_reference_shift(sft):
    refs = [("the movie was", "good ."), ("the plot was", "great .")]
    rm = RewardModel(model=sft, learning_rate=3e-3, normalize_samples=64, random_state=0).fit(
        COMPARISONS, references=refs
    )
    assert rm.predict([p for p, _ in refs], [c for _, c in refs]).mean() == pytest.approx(
        0, abs=1e-5
    )


def test_reward_model_scores_tokens_like_text(sft):
    rm = RewardModel(model=sft, learning_rate=3e-3, normalize_samples=16, random_state=0).fit(
        COMPARISONS
    )
    tok = rm.tokenizer_
    text = rm.predict(["the movie was"], ["good ."])
    enc = encode_prompts(tok, ["the movie was"])
    ids = torch.tensor([tok.convert_tokens_to_ids(["good", ".", tok.eos_token])])
    tokens = rm.score_tokens(
        EncodedPrompts(enc.input_ids, enc.attention_mask), ids, torch.ones_like(ids)
    )
    assert tokens.item() == pytest.approx(text[0], abs=1e-5)


def test_ppo_value_model_initialised_from_reward_model(sft):
    rm = RewardModel(model=sft, learning_rate=3e-3, normalize_samples=16, random_state=0).fit(
        COMPARISONS
    )
    ppo = PPOPolicy(model=sft, n_steps=1, batch_size=4, learning_rate=1e-12, random_state=0).fit(
        PROMPTS, rm
    )
    assert ppo.value_model_ is not rm.model_
    start = copy.deepcopy(rm.model_)
    for p, q in zip(ppo.value_model_.parameters(), start.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
