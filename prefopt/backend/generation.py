"""Tokenising prompts, sampling responses with a KV cache, and per-token log-probs.

Conventions (the seeds and implementation details 2-8):

* prompts are left-padded; position ids are the exclusive cumulative sum of the
  attention mask, in sampling and in training alike, so padding never changes
  the logits;
* exactly ``max_new_tokens`` tokens are sampled at ``temperature``; the
  response is truncated after its first EOS (later tokens become pad);
* every log-probability divides the logits by the sampling temperature and is
  taken in float32, so the ratio at the first PPO epoch is exactly 1.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._torch import autocast


@dataclass
class EncodedPrompts:
    """Left-padded prompt ids and their attention mask."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def __getitem__(self, index) -> "EncodedPrompts":
        return EncodedPrompts(self.input_ids[index], self.attention_mask[index])

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def encode_prompts(tokenizer, prompts, *, max_length: int | None = None) -> EncodedPrompts:
    """Tokenise prompts and pad them on the left for generation.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        Must have a pad token (see :func:`ensure_pad_token`).
    prompts : list of str
        The prompts.
    max_length : int, default=None
        Longest allowed prompt in tokens; a longer one raises ``ValueError``
        naming its row.

    Returns
    -------
    encoded : EncodedPrompts

    Examples
    --------
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld()
    >>> enc = encode_prompts(world.tokenizer, world.prompts[:2])
    >>> tuple(enc.input_ids.shape)
    (2, 1)
    """
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for i, ids in enumerate(rows):
        if len(ids) == 0:
            raise ValueError(f"Prompt at row {i} ({prompts[i]!r}) has no tokens; "
                             "remove it or give it some text.")
        if max_length is not None and len(ids) > max_length:
            raise ValueError(
                f"Prompt at row {i} has {len(ids)} tokens, more than the {max_length} "
                "that fit in the model's context with the response; shorten it or "
                "lower max_new_tokens.")
    return pad_left(rows, tokenizer.pad_token_id)


def pad_left(rows, pad_token_id: int) -> EncodedPrompts:
    """Pad lists of token ids on the left into an :class:`EncodedPrompts`."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return EncodedPrompts(ids, mask)


def pad_right(rows, pad_token_id: int, width: int | None = None):
    """Pad lists of token ids on the right; returns ``(ids, mask)``."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        r = r[:width]
        ids[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens: exclusive cumsum of the mask."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _forward_logits(model, input_ids, attention_mask, position_ids, **kwargs):
    # Pad ids may lie outside the embedding matrix (the pad token is added without
    # resizing, implementation detail 1B); they are masked, so any valid id will do.
    # With a KV cache the mask covers the whole sequence but the ids only the new tokens.
    ids = input_ids.masked_fill(attention_mask[:, -input_ids.shape[1]:] == 0, 0)
    with autocast(ids.device):
        return model(input_ids=ids, attention_mask=attention_mask,
                     position_ids=position_ids, **kwargs)


def _cache_of(model, out):
    """The KV cache of a forward's output, and the keyword that passes it back.

    transformers 5 names it ``cache``; earlier versions ``past_key_values``.
    """
    name = "cache" if _accepts(model, "cache") else "past_key_values"
    keys = out.keys() if hasattr(out, "keys") else ()
    for key in ("cache", "past_key_values"):
        if key in keys and out[key] is not None:
            return name, out[key]
    return name, None


def _mask_logits(logits: torch.Tensor, suppress_ids) -> torch.Tensor:
    if suppress_ids:
        logits = logits.clone()
        logits[..., list(suppress_ids)] = float("-inf")
    return logits


@torch.no_grad()
def sample(model, prompts: EncodedPrompts, *, max_new_tokens: int, temperature: float,
           generator: torch.Generator, suppress_ids=(), return_logprobs: bool = False,
           eos_token_id: int | None = None):
    """Sample exactly ``max_new_tokens`` tokens per prompt with a KV cache.

    Sampling never stops early at EOS (fixed-length sampling, as the original
    code does; implementation detail 4); use :func:`truncate_after_eos`.

    Parameters
    ----------
    model : torch.nn.Module
        Called like a causal LM; its output has ``.logits`` and, when it caches,
        ``.past_key_values``.
    prompts : EncodedPrompts
        Left-padded prompts.
    max_new_tokens : int
        Tokens to draw.
    temperature : float
        Logits are divided by it.
    generator : torch.Generator
        Source of randomness.
    suppress_ids : sequence of int, default=()
        Token ids never sampled (the pad token).

    return_logprobs : bool, default=False
        Also return the sampled tokens' log-probabilities (float32, tempered),
        read from the sampling logits: no extra forward pass.
    eos_token_id : int, default=None
        When given, sampling stops as soon as every response holds an EOS, and
        the remaining columns are filled with EOS (log-prob 0). Everything after a
        response's first EOS is discarded by :func:`truncate_after_eos` anyway, so
        the result is the same fixed-length sample, without the wasted steps.

    Returns
    -------
    response_ids : torch.Tensor of shape (n_prompts, max_new_tokens)
    logprobs : torch.Tensor of shape (n_prompts, max_new_tokens), only when ``return_logprobs``

    Examples
    --------
    >>> from prefopt.worlds import PreferenceWorld
    >>> from prefopt.backend import make_generator
    >>> world = PreferenceWorld()
    >>> enc = encode_prompts(world.tokenizer, world.prompts)
    >>> ids = sample(world.policy_model(), enc, max_new_tokens=1, temperature=1.0,
    ...              generator=make_generator(0))
    >>> ids.shape[1]
    1
    """
    ids = prompts.input_ids
    mask = prompts.attention_mask
    positions = position_ids_from_mask(mask)
    # The prompt's pass needs the logits of its last position only.
    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    out = _forward_logits(model, ids, mask, positions, use_cache=True, **keep)
    cache_arg, past = _cache_of(model, out)
    tokens, logprobs = [], []
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for step in range(max_new_tokens):
        logits = _mask_logits(out.logits[:, -1].float() / temperature, suppress_ids)
        logp = F.log_softmax(logits, dim=-1)
        token = torch.multinomial(logp.exp().cpu(), 1, generator=generator).to(ids.device)
        tokens.append(token)
        if return_logprobs:
            logprobs.append(logp.gather(-1, token))
        if eos_token_id is not None:
            done |= token.squeeze(1) == eos_token_id
            if bool(done.all()):
                rest = max_new_tokens - step - 1
                tokens.append(torch.full((ids.shape[0], rest), eos_token_id, dtype=token.dtype,
                                         device=ids.device))
                logprobs.append(torch.zeros((ids.shape[0], rest), device=ids.device))
                break
        if step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        if past is not None:
            positions = positions[:, -1:] + 1
            out = _forward_logits(model, token, mask, positions, use_cache=True,
                                  **{cache_arg: past}, **keep)
            past = _cache_of(model, out)[1]
        else:  # a model without a cache: recompute the whole sequence
            ids = torch.cat([ids, token], dim=1)
            positions = position_ids_from_mask(mask)
            out = _forward_logits(model, ids, mask, positions)
    if return_logprobs:
        return torch.cat(tokens, dim=1), torch.cat(logprobs, dim=1)
    return torch.cat(tokens, dim=1)


def truncate_after_eos(response_ids: torch.Tensor, eos_token_id: int | None,
                       pad_token_id: int):
    """Keep each response up to and including its first EOS; pad the rest.

    Parameters
    ----------
    response_ids : torch.Tensor of shape (n, length)
    eos_token_id : int or None
        ``None`` means responses have a fixed length and need no EOS (every
        response counts as ended).
    pad_token_id : int

    Returns
    -------
    response_ids : torch.Tensor
        Tokens after the first EOS replaced by ``pad_token_id``.
    response_mask : torch.Tensor
        1 up to and including the first EOS.
    ended : torch.Tensor of bool
        Whether each response contains an EOS.

    Examples
    --------
    >>> import torch
    >>> ids, mask, ended = truncate_after_eos(torch.tensor([[5, 2, 7], [5, 6, 7]]), 2, 0)
    >>> ids.tolist(), mask.tolist(), ended.tolist()
    ([[5, 2, 0], [5, 6, 7]], [[1, 1, 0], [1, 1, 1]], [True, False])
    """
    if eos_token_id is None:
        mask = torch.ones_like(response_ids)
        return response_ids, mask, torch.ones(response_ids.shape[0], dtype=torch.bool,
                                              device=response_ids.device)
    is_eos = response_ids == eos_token_id
    ended = is_eos.any(dim=1)
    # Tokens strictly after the first EOS: cumulative count of EOS before them > 0.
    after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    mask = (~after).long()
    return response_ids.masked_fill(after, pad_token_id), mask, ended


def response_logprobs(model, prompts: EncodedPrompts, response_ids: torch.Tensor,
                      response_mask: torch.Tensor, *, temperature: float,
                      suppress_ids=(), with_entropy: bool = False):
    """Per-token log-probabilities of responses under ``model``.

    One forward pass over ``[left-padded prompt | response]``; logits are divided
    by ``temperature`` and log-softmax runs in float32. Positions outside
    ``response_mask`` get log-prob 0 (so any KL there is exactly 0).

    Parameters
    ----------
    model : torch.nn.Module
    prompts : EncodedPrompts
    response_ids, response_mask : torch.Tensor of shape (n, length)
    temperature : float
    suppress_ids : sequence of int, default=()
    with_entropy : bool, default=False
        Also return the per-token entropy of the tempered distribution.

    Returns
    -------
    logprobs : torch.Tensor of shape (n, length)
    entropy : torch.Tensor of shape (n, length), only when ``with_entropy``

    Examples
    --------
    >>> import torch
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld()
    >>> enc = encode_prompts(world.tokenizer, world.prompts[:1])
    >>> ids = torch.tensor([[world.tokenizer.convert_tokens_to_ids(world.responses[0])]])
    >>> lp = response_logprobs(world.policy_model(), enc, ids, torch.ones_like(ids),
    ...                        temperature=1.0)
    >>> bool(lp.exp().item() == world.reference_probs()[0, 0])
    True
    """
    input_ids = torch.cat([prompts.input_ids, response_ids], dim=1)
    mask = torch.cat([prompts.attention_mask, response_mask.long()], dim=1)
    n_response = response_ids.shape[1]
    # Only the positions that predict response tokens need the (vocabulary-wide) output
    # layer: transformers models compute just those with logits_to_keep.
    keep = {"logits_to_keep": n_response + 1} if _accepts(model, "logits_to_keep") else {}
    out = _forward_logits(model, input_ids, mask, position_ids_from_mask(mask), **keep)
    logits = out.logits[:, -(n_response + 1):-1].float() / temperature
    if suppress_ids:  # in place: the division's output is not needed for its backward
        logits[..., list(suppress_ids)] = float("-inf")
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    valid = response_mask.bool()
    logp = logp.masked_fill(~valid, 0.0)
    if not with_entropy:
        return logp
    with torch.no_grad():  # entropy is logged, never differentiated
        p = logp_all.exp()
        entropy = -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)
    return logp, entropy.masked_fill(~valid, 0.0)


def _accepts(model, name: str) -> bool:
    return name in _forward_parameters(type(model))


@functools.lru_cache(maxsize=None)
def _forward_parameters(cls) -> frozenset:
    """Names ``cls.forward`` takes (cached: signatures are slow to read, once a token)."""
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def sequence_values(value_model, prompts: EncodedPrompts, response_ids, response_mask):
    """Value estimates V(s_t) for each response token t (the state before it).

    Returns a tensor of shape (n, length), read from the value model's output at
    the positions that predict each response token.
    """
    n_prompt = prompts.input_ids.shape[1]
    input_ids = torch.cat([prompts.input_ids, response_ids], dim=1)
    mask = torch.cat([prompts.attention_mask, response_mask.long()], dim=1)
    values = _forward_logits(value_model, input_ids, mask, position_ids_from_mask(mask))
    return values[:, n_prompt - 1:-1].float()
