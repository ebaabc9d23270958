"""The speed-ups change nothing but speed: fused GELU, the inverse-CDF sampler, ready masks."""

import copy

import numpy as np
import pytest
import torch
from _tiny import tiny_lm
from torch import nn
from transformers.activations import NewGELUActivation

from prefopt import RLOOPolicy
from prefopt.backend import (
    encode_prompts,
    fuse_activations,
    generation,
    load_causal_lm,
    make_generator,
)
from prefopt.backend.generation import draw_tokens, response_logprobs, sample

PROMPTS = ["the movie was", "the", "the plot was good"] * 4


def test_fused_gelu_is_gpt2s_gelu_new():
    x = torch.linspace(-6, 6, 10_001)
    fused, original = nn.GELU(approximate="tanh")(x), NewGELUActivation()(x)
    torch.testing.assert_close(fused, original, rtol=1e-6, atol=1e-6)


def test_loaded_models_are_fused_and_keep_their_log_probs():
    model = tiny_lm().eval()
    fused, tok = load_causal_lm(model)
    assert not any(isinstance(m, NewGELUActivation) for m in fused.modules())
    assert any(isinstance(m, NewGELUActivation) for m in model.modules())  # the user's is untouched
    assert fuse_activations(fused) == 0  # nothing left to swap
    enc = encode_prompts(tok, PROMPTS)
    ids = torch.randint(3, len(tok), (len(PROMPTS), 5), generator=make_generator(0))
    kwargs = dict(temperature=0.7)
    torch.testing.assert_close(
        response_logprobs(fused, enc, ids, torch.ones_like(ids), **kwargs),
        response_logprobs(model, enc, ids, torch.ones_like(ids), **kwargs),
        rtol=1e-5,
        atol=1e-5,
    )


def test_fused_policy_round_trips_through_joblib(tmp_path):
    import joblib

    policy = RLOOPolicy(
        model=tiny_lm(), k=2, batch_size=4, n_steps=1, max_new_tokens=3, random_state=0
    ).fit(["the movie was"], lambda p, c: np.zeros(len(c)))
    joblib.dump(policy, tmp_path / "p.joblib")
    loaded = joblib.load(tmp_path / "p.joblib")
    assert not any(isinstance(m, NewGELUActivation) for m in loaded.model_.modules())
    assert loaded.predict(["the movie was"] * 4) == policy.predict(["the movie was"] * 4)


def test_draw_tokens_matches_the_distribution():
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]]).expand(100_000, 6).contiguous()
    counts = torch.bincount(draw_tokens(probs, make_generator(0)).squeeze(1), minlength=6)
    share = counts.double() / counts.sum()
    assert counts[[0, 2, 5]].sum() == 0  # zero-probability tokens are never drawn
    # 100,000 draws: the standard error of a share is at most 0.0016; allow 4 of them.
    torch.testing.assert_close(share, probs[0].double(), atol=0.0064, rtol=0)


def test_draw_tokens_never_picks_a_trailing_zero_even_when_u_rounds_to_one(monkeypatch):
    # u * total may round up to total; the draw must still land on a token of positive
    # probability, not on the zero-probability tokens after it. Force the worst case.
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: real_rand(*a, **k).fill_(1.0))
    probs = torch.tensor([[1e-30, 3.0, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]])
    assert draw_tokens(probs, make_generator(0)).flatten().tolist() == [1, 2]


def test_draw_tokens_is_reproducible():
    probs = torch.softmax(torch.randn(64, 50, generator=make_generator(1)), -1)
    assert torch.equal(draw_tokens(probs, make_generator(5)), draw_tokens(probs, make_generator(5)))


def test_ready_decode_mask_gives_the_same_samples_and_log_probs(monkeypatch):
    model, tok = load_causal_lm(tiny_lm())
    model.eval()
    enc = encode_prompts(tok, PROMPTS)  # left padding of different lengths
    kwargs = dict(
        max_new_tokens=8, temperature=1.0, suppress_ids=(tok.pad_token_id,), return_logprobs=True
    )
    ids, logp = sample(model, enc, generator=make_generator(3), **kwargs)
    assert generation.ready_mask_verdict(model) is True  # GPT-2 with SDPA reads the 4D mask
    monkeypatch.setattr(generation, "_may_take_ready_mask", lambda model: False)
    ids_2d, logp_2d = sample(model, enc, generator=make_generator(3), **kwargs)
    assert torch.equal(ids, ids_2d)
    torch.testing.assert_close(logp, logp_2d, rtol=1e-5, atol=1e-6)


def test_a_model_that_misreads_the_ready_mask_keeps_the_2d_one():
    base, tok = load_causal_lm(tiny_lm())

    class Misreads(type(base)):
        """A transformers-looking model that drops a 4D mask (attends to the padding)."""

        def forward(self, attention_mask=None, **kwargs):
            if attention_mask is not None and attention_mask.dim() == 4:
                attention_mask = None
            return super().forward(attention_mask=attention_mask, **kwargs)

    Misreads.__module__ = "transformers.models.misreads"
    model = Misreads(base.config)
    model.load_state_dict(base.state_dict())
    model.eval()
    enc = encode_prompts(tok, PROMPTS)
    kwargs = dict(max_new_tokens=6, temperature=1.0, suppress_ids=(tok.pad_token_id,))
    ids = sample(model, enc, generator=make_generator(3), **kwargs)
    assert generation.ready_mask_verdict(model) is False
    base.eval()
    assert torch.equal(ids, sample(base, enc, generator=make_generator(3), **kwargs))


@pytest.mark.parametrize("setting", [{"sliding_window": 4}, {"_attn_implementation": "eager"}])
def test_no_ready_mask_for_windowed_or_non_sdpa_attention(setting):
    model, _ = load_causal_lm(tiny_lm())
    model = copy.deepcopy(model)
    for key, value in setting.items():
        setattr(model.config, key, value)
    assert generation._may_take_ready_mask(model) is False


@pytest.mark.slow
def test_compiled_models_train_as_the_plain_ones(tmp_path):
    # The "eager" backend traces the models with TorchDynamo (what inductor would compile)
    # without generating code: quick, and it exercises the compiled call path.
    import joblib

    import prefopt

    def fit():
        return RLOOPolicy(
            model=tiny_lm(), k=2, batch_size=4, n_steps=2, max_new_tokens=3, random_state=0
        ).fit(
            ["the movie was", "the plot was"],
            lambda p, c: np.array([x.count("good") for x in c], dtype=float),
        )

    plain = fit()
    with prefopt.config_context(compile="eager"):
        compiled = fit()
    assert compiled.model_._compiled_call_impl is not None
    assert compiled.ref_model_._compiled_call_impl is not None
    assert [r["objective/reward"] for r in compiled.history_] == [
        r["objective/reward"] for r in plain.history_
    ]
    for a, b in zip(compiled.model_.parameters(), plain.model_.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    joblib.dump(compiled, tmp_path / "c.joblib")  # the compiled wrapper is not saved
    assert joblib.load(tmp_path / "c.joblib").model_._compiled_call_impl is None


def test_compile_setting_is_checked():
    import prefopt

    with pytest.raises(ValueError, match="compile must be True, False or the name"):
        prefopt.set_config(compile=3)
