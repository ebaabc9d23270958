"""``predict`` is greedy decoding, ``sample`` draws (prefopt/lm/_generative.py)."""

import numpy as np
import pytest
import torch
from _tiny import tiny_lm
from sklearn.pipeline import make_pipeline

from prefopt import RLOOPolicy, SFTPolicy
from prefopt.metrics import make_reward_scorer

DEMOS = [
    ("the movie was", "good ."),
    ("the movie was", "bad ."),
    ("the plot was", "great ."),
    ("the plot was", "awful ."),
] * 6
# Prompts of different lengths, so the batch is left-padded.
PROMPTS = ["the movie was", "the plot was", "the movie was good", "the"]


@pytest.fixture(scope="module")
def sft():
    return SFTPolicy(model=tiny_lm(), learning_rate=1e-2, n_epochs=2, random_state=0).fit(DEMOS)


def _greedy_generate(est, prompts, max_new_tokens):
    """transformers' own greedy decoding on the estimator's prompt ids, left-padded."""
    tok = est.tokenizer_
    rows = est._tokenize_prompts(prompts)
    width = max(len(r) for r in rows)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = est.model_.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=est.stop_token_ids_,
        pad_token_id=tok.pad_token_id,
        suppress_tokens=[tok.pad_token_id],  # prefopt never emits the pad token
    )
    texts = []
    for row in out[:, width:].tolist():
        stop = next((i for i, t in enumerate(row) if t in est.stop_token_ids_), len(row))
        texts.append(tok.decode(row[:stop], skip_special_tokens=True))
    return texts


def test_predict_equals_greedy_generate(sft):
    got = sft.predict(PROMPTS)
    assert got == _greedy_generate(sft, PROMPTS, sft.max_new_tokens_)
    assert got == sft.predict(PROMPTS)  # deterministic: no random state involved
    # With a cap of its own, still greedy generate's completion, cut at 1 token.
    short = sft.predict(PROMPTS, max_new_tokens=1)
    assert short == _greedy_generate(sft, PROMPTS, 1)
    assert all(len(sft.tokenizer_(c, add_special_tokens=False)["input_ids"]) <= 1 for c in short)


def test_sample_at_temperature_zero_is_predict_and_temperature_is_used(sft):
    greedy = sft.predict(PROMPTS)
    groups = sft.sample(PROMPTS, n=3, temperature=0.0, random_state=5)
    assert groups == [[c] * 3 for c in greedy]
    # Sampling draws: at the fit's temperature (the default 0.7) the 8 draws of a prompt
    # differ.
    assert sft.temperature_ == 0.7
    drawn = sft.sample(PROMPTS[:1], n=8, random_state=0)[0]
    assert len(set(drawn)) > 1
    assert sft.sample(PROMPTS[:1], n=8, temperature=0.7, random_state=0)[0] == drawn
    # A very high temperature draws from (nearly) uniform: other completions than at 0.7.
    hot = sft.sample(PROMPTS[:1], n=8, temperature=50.0, random_state=0)[0]
    assert hot != drawn
    lengths = [
        len(sft.tokenizer_(c, add_special_tokens=False)["input_ids"])
        for c in sft.sample(PROMPTS, n=4, max_new_tokens=2, random_state=0)[0]
    ]
    assert max(lengths) <= 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"temperature": "hot"}, "temperature must be a finite number >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be an int >= 1"),
        ({"max_new_tokens": 40}, "does not fit the model's context of 32"),
    ],
)
def test_sample_and_predict_refuse_bad_arguments(sft, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sft.sample(PROMPTS, **kwargs)
    if "temperature" not in kwargs:
        with pytest.raises(ValueError, match=message):
            sft.predict(PROMPTS, **kwargs)


def test_score_and_scorers_sample_also_through_a_pipeline(sft):
    def reward(prompts, completions):
        return np.array([len(c) for c in completions], dtype=float)

    policy = RLOOPolicy(model=sft, k=2, batch_size=4, n_steps=1, random_state=0)
    policy.fit(PROMPTS, reward)
    # score: one sampled completion per prompt, at the policy's own random_state.
    drawn = [group[0] for group in policy.sample(PROMPTS)]
    assert policy.score(PROMPTS) == pytest.approx(reward(PROMPTS, drawn).mean())
    # A scorer samples n_samples per prompt, and a Pipeline is sampled through its last
    # step, not asked for its greedy predict.
    scorer = make_reward_scorer(reward, n_samples=4, random_state=3)
    pipe = make_pipeline(policy)
    groups = policy.sample(PROMPTS, n=4, random_state=3)
    expected = np.mean([len(c) for group in groups for c in group])
    assert scorer(policy, PROMPTS) == pytest.approx(expected)
    assert scorer(pipe, PROMPTS) == pytest.approx(expected)
    assert pipe.predict(PROMPTS) == policy.predict(PROMPTS)


def _length_reward(prompts, completions):
    return np.array([len(c) for c in completions], dtype=float)


def test_a_fit_says_its_response_length_and_warns_when_sft_demonstrations_set_it(
    sft, caplog, recwarn
):
    import logging

    # SFT's longest demonstration: "great ." or "awful ." plus EOS, 3 tokens.
    assert sft.max_new_tokens_ == 3 and sft.max_new_tokens is None
    small = dict(k=2, batch_size=4, n_steps=1, random_state=0)
    with caplog.at_level(logging.INFO, logger="prefopt"):
        with pytest.warns(
            UserWarning,
            match=r"max_new_tokens=None takes 3 tokens from the "
            r"starting SFTPolicy.*Pass max_new_tokens=",
        ):
            policy = RLOOPolicy(model=sft, **small).fit(PROMPTS, _length_reward)
    assert policy.max_new_tokens_ == 3
    assert (
        "RLOOPolicy: sampling up to 3 new tokens per response (the starting SFTPolicy's "
        "longest demonstration), at temperature 0.7" in caplog.messages
    )
    # Given by the user: said, and no warning.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="prefopt"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            RLOOPolicy(model=sft, max_new_tokens=6, **small).fit(PROMPTS, _length_reward)
    assert (
        "RLOOPolicy: sampling up to 6 new tokens per response (max_new_tokens), at "
        "temperature 0.7" in caplog.messages
    )
