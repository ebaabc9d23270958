"""Each prompt once per group, no padding, the LM head in chunks: the same numbers as one full pass.

The reference computation is the plain one, written out here: one forward pass over
``[left-padded prompt | response]`` with the full logits, log-softmax in float32.
"""

import pytest
import torch
import torch.nn.functional as F
from _tiny import tiny_lm
from transformers import LlamaConfig, LlamaForCausalLM

import prefopt
from prefopt.backend import (
    EncodedPrompts,
    ScalarHeadModel,
    _shared_prompts,
    make_generator,
    pad_left,
    position_ids_from_mask,
    response_logprobs,
    sample,
    sequence_values,
    truncate_after_eos,
)

K = 3
PROMPTS = [[3, 4, 5, 6, 7], [8], [9, 10, 3], [4, 4]]  # different lengths: left padding varies
PAD = 1
EOS = 2


def gpt2():
    return tiny_lm(seed=0, n_positions=64).eval()


def llama():
    config = LlamaConfig(
        vocab_size=12,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama}


@pytest.fixture(autouse=True)
def always_share(monkeypatch):
    # The prompts here are short: share them however little it saves.
    monkeypatch.setattr(_shared_prompts, "SHARE_MIN_SAVING", 0.0)


def batch(model, seed=0, length=7):
    """k rows per prompt, extra left padding no row needs, responses ending at varied lengths."""
    rows = [p for p in PROMPTS for _ in range(K)]
    enc = pad_left(rows, PAD)
    # Two columns of padding on the left of every row: trimmed away.
    enc = EncodedPrompts(F.pad(enc.input_ids, (2, 0), value=PAD), F.pad(enc.attention_mask, (2, 0)))
    g = make_generator(seed)
    raw = torch.randint(3, 12, (len(rows), length), generator=g)
    ends = torch.randint(0, length - 2, (len(rows),), generator=g)  # none reaches the last column
    raw[torch.arange(len(rows)), ends] = EOS
    ids, mask, _ = truncate_after_eos(raw, EOS, PAD)
    index = torch.arange(len(PROMPTS)).repeat_interleave(K)
    return enc, ids, mask, index


def plain_logprobs(model, enc, ids, mask, temperature, suppress=()):
    input_ids = torch.cat([enc.input_ids, ids], 1)
    full = torch.cat([enc.attention_mask, mask.long()], 1)
    input_ids = input_ids.masked_fill(full == 0, 0)
    logits = model(
        input_ids=input_ids, attention_mask=full, position_ids=position_ids_from_mask(full)
    ).logits
    logits = logits[:, enc.input_ids.shape[1] - 1 : -1].float() / temperature
    if suppress:
        logits[..., list(suppress)] = float("-inf")
    logp_all = F.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids.masked_fill(mask == 0, 0).unsqueeze(-1)).squeeze(-1)
    # Suppressed ids (log-prob -inf) add 0 to the entropy and to its gradient.
    finite = torch.where(torch.isfinite(logp_all), logp_all, torch.zeros_like(logp_all))
    entropy = -(logp_all.exp() * finite).sum(-1)
    return logp * mask, entropy * mask


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("shared", [True, False])
def test_logprobs_and_entropy_equal_one_full_pass(name, shared):
    model = MODELS[name]()
    enc, ids, mask, index = batch(model)
    expected, expected_entropy = plain_logprobs(model, enc, ids, mask, 0.7, suppress=(PAD,))
    with torch.no_grad():
        logp, entropy = response_logprobs(
            model,
            enc,
            ids,
            mask,
            temperature=0.7,
            suppress_ids=(PAD,),
            with_entropy=True,
            prompt_index=index if shared else None,
        )
    assert logp.shape == ids.shape and bool((logp[mask == 0] == 0).all())
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_equal_one_full_pass(name):
    model = MODELS[name]()
    enc, ids, mask, index = batch(model, seed=1)
    weights = torch.randn(ids.shape, generator=make_generator(2))

    def grads(fn):
        model.zero_grad()
        (fn() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected = grads(lambda: plain_logprobs(model, enc, ids, mask, 1.0)[0])
    shared = grads(
        lambda: response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
    )
    assert expected.keys() == shared.keys()
    for key in expected:
        torch.testing.assert_close(shared[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def test_lm_head_runs_in_chunks(monkeypatch):
    # Chunks of 2 positions' logits at most: the same log-probs and gradients.
    model = gpt2()
    enc, ids, mask, index = batch(model, seed=3)
    kwargs = dict(temperature=0.9, with_entropy=True, prompt_index=index)
    whole, whole_entropy = response_logprobs(model, enc, ids, mask, **kwargs)
    monkeypatch.setattr(_shared_prompts, "HEAD_CHUNK_ELEMENTS", 2 * model.config.vocab_size)
    chunked, chunked_entropy = response_logprobs(model, enc, ids, mask, **kwargs)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked_entropy, whole_entropy, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(MODELS))
def test_no_compute_on_padding(name):
    # The forward pass sees neither the left padding no row needs nor the response
    # columns after every row's EOS; the prompt runs once per group.
    model = MODELS[name]()
    enc, ids, mask, index = batch(model, seed=4)
    shapes = []
    handle = model.register_forward_hook(
        lambda m, a, kw, out: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
    response_logprobs(model, enc, ids, mask, temperature=1.0)
    handle.remove()
    longest_prompt = max(len(p) for p in PROMPTS)
    longest_response = int(mask.sum(1).max())
    assert shapes == [
        (len(PROMPTS), longest_prompt),  # each prompt once
        (len(ids), longest_response - 1),  # the responses on the cached prompts
        (len(ids), longest_prompt + longest_response - 1),  # unshared: one trimmed pass
    ]


def test_prompts_that_save_too_little_run_in_one_pass(monkeypatch):
    # Sharing 4 prompts of at most 5 tokens among 12 rows saves 40 prompt tokens, under
    # half of what one pass processes: below a threshold of 90%, one call, as without groups.
    monkeypatch.setattr(_shared_prompts, "SHARE_MIN_SAVING", 0.9)
    model = gpt2()
    enc, ids, mask, index = batch(model, seed=4)
    shapes = []
    handle = model.register_forward_hook(
        lambda m, a, kw, out: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
    handle.remove()
    assert len(shapes) == 1


@pytest.mark.parametrize("name", list(MODELS))
def test_values_and_their_gradients_equal_one_full_pass(name):
    lm = MODELS[name]()
    value_model = ScalarHeadModel(lm.base_model, generator=make_generator(0))
    enc, ids, mask, index = batch(lm, seed=5)
    input_ids = torch.cat([enc.input_ids, ids], 1)
    full = torch.cat([enc.attention_mask, mask.long()], 1)
    expected = value_model(input_ids.masked_fill(full == 0, 0), full, position_ids_from_mask(full))[
        :, enc.input_ids.shape[1] - 1 : -1
    ]
    values = sequence_values(value_model, enc, ids, mask, prompt_index=index)
    torch.testing.assert_close(values * mask, expected * mask, rtol=1e-5, atol=1e-5)
    weights = torch.randn(ids.shape, generator=make_generator(6)) * mask
    g_expected = torch.autograd.grad((expected * weights).sum(), list(value_model.parameters()))
    g_shared = torch.autograd.grad((values * weights).sum(), list(value_model.parameters()))
    for a, b in zip(g_shared, g_expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_sampling_with_shared_prefill_draws_the_same(name):
    model = MODELS[name]()
    enc, _, _, index = batch(model)
    kwargs = dict(max_new_tokens=6, temperature=1.0, suppress_ids=(PAD,), return_logprobs=True)
    ids, logp = sample(model, enc, generator=make_generator(7), **kwargs)
    ids_shared, logp_shared = sample(
        model, enc, generator=make_generator(7), prompt_index=index, **kwargs
    )
    assert torch.equal(ids, ids_shared)
    torch.testing.assert_close(logp_shared, logp, rtol=1e-5, atol=1e-5)


def test_lora_policy_and_its_adapter_off_reference_share_prompts():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        gpt2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0)
    )
    # A non-zero adapter, so that "off" differs from "on".
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1, generator=make_generator(8))
    enc, ids, mask, index = batch(model, seed=9)
    assert _shared_prompts.takes_shared_prompts(model)
    for context in (torch.enable_grad, model.disable_adapter):
        with context():
            expected, _ = plain_logprobs(model, enc, ids, mask, 1.0)
            shared = response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
        torch.testing.assert_close(shared, expected, rtol=1e-5, atol=1e-5)


def test_models_outside_transformers_keep_the_plain_path():
    from prefopt.worlds import PreferenceWorld

    world = PreferenceWorld()
    policy = world.policy_model()
    assert not _shared_prompts.is_transformers_model(policy)
    assert not _shared_prompts.takes_shared_prompts(policy)


def test_minibatch_order_keeps_each_prompts_samples_together():
    from prefopt.policies.loop._batch import minibatch_order

    index = torch.tensor([5, 5, 5, 2, 2, 2, 7, 7, 7, 5, 5, 5])  # a prompt drawn twice
    order = minibatch_order(index, make_generator(0))
    assert sorted(order.tolist()) == list(range(12))
    groups = {tuple(sorted(order[i : i + 3].tolist())) for i in range(0, 12, 3)}
    assert groups == {(0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)}
    # One sample a prompt: the same draws as shuffling the rows.
    distinct = torch.arange(10)
    assert torch.equal(
        minibatch_order(distinct, make_generator(1)),
        torch.randperm(10, generator=make_generator(1)),
    )
    assert torch.equal(
        minibatch_order(index, make_generator(1), grouped=False),
        torch.randperm(12, generator=make_generator(1)),
    )


def test_history_records_the_time_of_each_phase():
    import numpy as np

    from prefopt import RLOOPolicy

    policy = RLOOPolicy(
        model=tiny_lm(), k=2, batch_size=4, n_steps=1, max_new_tokens=3, random_state=0
    ).fit(["the movie was", "the plot was"], lambda p, c: np.zeros(len(c)))
    row = policy.history_[0]
    for key in ("time/generation", "time/logprobs", "time/reward", "time/update"):
        assert np.isfinite(row[key]) and row[key] >= 0, key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(MODELS))
def test_shared_prompts_on_cuda(name):
    # CPU index tensors (RolloutBatch.prompt_index) with CUDA models and batches.
    model = MODELS[name]().cuda()
    enc, ids, mask, index = batch(model)
    enc = EncodedPrompts(enc.input_ids.cuda(), enc.attention_mask.cuda())
    ids, mask = ids.cuda(), mask.cuda()
    expected, _ = plain_logprobs(model, enc, ids, mask, 1.0)
    # On CUDA the default dtype ("auto") runs bfloat16 autocast; the sharing itself is
    # checked in float32, where it is exact up to kernel order.
    with prefopt.config_context(dtype="float32"):
        shared = response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
    torch.testing.assert_close(shared, expected, rtol=1e-4, atol=1e-4)
    # Under bfloat16 autocast (the CUDA default): measured on an H200, 2026-12-04, the
    # largest difference from the float32 pass was 1.04e-3 (8 bits of mantissa on
    # log-probs near -2.5); 2e-2 is bfloat16's rounding of such values, with margin.
    with prefopt.config_context(dtype="bfloat16"):
        shared_bf16 = response_logprobs(model, enc, ids, mask, temperature=1.0, prompt_index=index)
    torch.testing.assert_close(shared_bf16, expected, rtol=0, atol=2e-2)
    kwargs = dict(max_new_tokens=6, temperature=1.0, suppress_ids=(PAD,))
    a = sample(model, enc, generator=make_generator(7), **kwargs)
    b = sample(model, enc, generator=make_generator(7), prompt_index=index, **kwargs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(MODELS))
def test_entropy_gradients_equal_one_full_pass(name):
    # An entropy bonus in the loss (entropy_grad=True) differentiates the chunked entropy.
    model = MODELS[name]()
    enc, ids, mask, index = batch(model, seed=10)
    weights = torch.randn(ids.shape, generator=make_generator(11))
    params = [p for p in model.parameters() if p.requires_grad]
    _, plain = plain_logprobs(model, enc, ids, mask, 0.8, suppress=(PAD,))
    _, shared = response_logprobs(
        model,
        enc,
        ids,
        mask,
        temperature=0.8,
        suppress_ids=(PAD,),
        with_entropy=True,
        entropy_grad=True,
        prompt_index=index,
    )
    expected = torch.autograd.grad((plain * weights).sum(), params, allow_unused=True)
    got = torch.autograd.grad((shared * weights).sum(), params, allow_unused=True)
    for a, b in zip(got, expected):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
