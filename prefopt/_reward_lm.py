"""Training and scoring of the language-model RewardModel (private to rewards.py)."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from ._config import get_config
from .backend import (
    ScalarHeadModel,
    adamw,
    default_learning_rate,
    disable_dropout,
    ensure_pad_token,
    gradient_step,
    join_right_padded,
    load_causal_lm,
    make_generator,
    model_vocab_size,
    pad_left,
    resolve_device,
    sample,
    score_sequences,
    truncate_after_eos,
)
from .data import check_demonstrations


def _load(rm, model, seed: int):
    # A path, a config, a module, or a fitted (possibly frozen) SFTPolicy, copied.
    lm, tok = load_causal_lm(model, rm.tokenizer, seed=seed)
    trunk = getattr(lm, "base_model", None)
    if trunk is None or trunk is lm or not hasattr(trunk, "config"):
        raise TypeError(
            f"RewardModel needs a transformers causal LM with a base model; got "
            f"{type(lm).__name__}."
        )
    return disable_dropout(lm).eval(), ensure_pad_token(tok), trunk


def fit_lm_reward(rm, model, data, references) -> None:
    """Bradley-Terry training of a scalar head on the SFT trunk, then normalisation."""
    rng = check_random_state(rm.random_state)
    seeds = rng.randint(np.iinfo(np.int32).max, size=4)
    device = resolve_device()
    lm, tok, trunk = _load(rm, model, int(seeds[0]))
    rm.tokenizer_ = tok
    rm.device_ = device
    # The head is drawn with std 1/sqrt(d_model + 1) from a local generator.
    head_gen = make_generator(int(seeds[1]))
    model = ScalarHeadModel(copy.deepcopy(trunk), head_std=rm.head_std, generator=head_gen)
    rm.model_ = disable_dropout(model).to(device).eval()
    rm.gain_, rm.bias_ = 1.0, 0.0
    rm.learning_rate_ = (
        float(rm.learning_rate)
        if rm.learning_rate is not None
        else default_learning_rate(model, large=1e-5)
    )
    prompts = _tokens(tok, data.prompt, add_eos=False)
    chosen = _tokens(tok, data.chosen, add_eos=True)
    rejected = _tokens(tok, data.rejected, add_eos=True)
    _train(rm, prompts, chosen, rejected, make_generator(int(seeds[2])))
    if rm.normalize:
        _normalize(rm, lm.to(device), prompts, check_random_state(int(seeds[3])))
    if references is not None:
        ref_prompts, ref_completions = check_demonstrations(references)
        shift = predict_text(rm, ref_prompts, ref_completions).mean()
        rm.bias_ -= float(shift)  # reference responses now score 0 on average (Huang et al.)


def _tokens(tok, texts, add_eos: bool) -> list[list[int]]:
    rows = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        if add_eos and tok.eos_token_id is not None:
            ids = ids + [tok.eos_token_id]
        rows.append(ids)
    return rows


def _raw(rm, prompt_rows, response_rows) -> torch.Tensor:
    ids, mask, last = join_right_padded(prompt_rows, response_rows, rm.tokenizer_.pad_token_id)
    context = getattr(rm.model_.config, "n_positions", None) or getattr(
        rm.model_.config, "max_position_embeddings", None
    )
    if context is not None and ids.shape[1] > context:
        raise ValueError(
            f"A prompt + response has {ids.shape[1]} tokens, more than the reward "
            f"model's context of {context}; shorten it."
        )
    return score_sequences(rm.model_, ids.to(rm.device_), mask.to(rm.device_), last.to(rm.device_))


def _train(rm, prompts, chosen, rejected, generator) -> None:
    model = rm.model_
    optimizer = adamw(model.parameters(), rm.learning_rate_)
    n = len(prompts)
    total = math.ceil(n / rm.batch_size) * rm.n_epochs
    rm.history_ = []
    bar = tqdm(
        total=total, desc="RewardModel", leave=False, disable=not get_config()["show_progress_bar"]
    )
    step = 0
    for _ in range(rm.n_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, rm.batch_size):
            rows = order[start : start + rm.batch_size]
            for group in optimizer.param_groups:  # linear decay to 0 (the original code)
                group["lr"] = rm.learning_rate_ * (1 - step / total)
            # Chosen and rejected go through one forward pass together.
            both = _raw(
                rm,
                [prompts[i] for i in rows] * 2,
                [chosen[i] for i in rows] + [rejected[i] for i in rows],
            )
            margin = both[: len(rows)] - both[len(rows) :]
            loss = -F.logsigmoid(margin).mean()
            gradient_step(optimizer, loss, who="RewardModel", step=step + 1)
            step += 1
            rm.history_.append(
                {
                    "step": step,
                    "loss/reward": loss.item(),
                    "reward/accuracy": float((margin > 0).float().mean()),
                }
            )
            bar.update(1)
    bar.close()


@torch.no_grad()
def _normalize(rm, policy, prompts, rng) -> None:
    """gain and bias so that samples of the starting policy score mean 0, std 1.

    Population std (E[r^2] - mu^2), as the original code's ``set_reward_norm``.
    """
    tok = rm.tokenizer_
    generation_config = getattr(policy, "generation_config", None)
    temperature = rm.temperature or getattr(generation_config, "temperature", None) or 0.7
    max_new = rm.max_new_tokens or getattr(generation_config, "max_new_tokens", None) or 53
    vocab = model_vocab_size(policy)
    suppress = (tok.pad_token_id,) if vocab is not None and tok.pad_token_id < vocab else ()
    rows = rng.randint(len(prompts), size=rm.normalize_samples)
    generator = make_generator(rng)
    scores = []
    size = get_config()["eval_batch_size"]
    for start in range(0, len(rows), size):
        chunk = [prompts[i] for i in rows[start : start + size]]
        enc = pad_left(chunk, tok.pad_token_id)
        enc.input_ids, enc.attention_mask = (
            enc.input_ids.to(rm.device_),
            enc.attention_mask.to(rm.device_),
        )
        raw = sample(
            policy,
            enc,
            max_new_tokens=int(max_new),
            temperature=float(temperature),
            generator=generator,
            suppress_ids=suppress,
            eos_token_id=tok.eos_token_id,
        )
        ids, mask, _ = truncate_after_eos(raw, tok.eos_token_id, tok.pad_token_id)
        responses = [r[m.bool()].tolist() for r, m in zip(ids.cpu(), mask.cpu())]
        scores.append(_raw(rm, chunk, responses).cpu())
    scores = torch.cat(scores).double()
    mean, std = float(scores.mean()), float(scores.std(unbiased=False))
    rm.gain_ = 1.0 / max(std, 1e-8)
    rm.bias_ = -rm.gain_ * mean
    rm.normalization_ = {"mean": mean, "std": std, "n_samples": len(scores)}


@torch.no_grad()
def score_token_rows(rm, prompt_rows, response_rows) -> torch.Tensor:
    out = []
    size = get_config()["eval_batch_size"]
    for start in range(0, len(prompt_rows), size):
        out.append(_raw(rm, prompt_rows[start : start + size], response_rows[start : start + size]))
    return torch.cat(out) * rm.gain_ + rm.bias_


def predict_text(rm, prompts, completions) -> np.ndarray:
    p = _tokens(rm.tokenizer_, prompts, add_eos=False)
    c = _tokens(rm.tokenizer_, completions, add_eos=True)
    return score_token_rows(rm, p, c).cpu().double().numpy()
