"""Tokenising prompts, sampling responses with a KV cache, and per-token log-probs.

Conventions (Ziegler et al. 2019's code, as Huang et al. 2024 describe it):

* prompts are left-padded; position ids are the exclusive cumulative sum of the
  attention mask, in sampling and in training alike, so padding never changes
  the logits;
* exactly ``max_new_tokens`` tokens are sampled at ``temperature``; the
  response is truncated after its first EOS (later tokens become pad); a
  chat model may have several EOS ids, and any of them ends a response;
* every log-probability divides the logits by the sampling temperature and is
  taken in float32, so the ratio at the first PPO epoch is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._forward import (  # noqa: F401 - position_ids_from_mask and the helpers are used from here
    _accepts,
    _cache_of,
    _forward_logits,
    _id_tensor,
    _valid_ids,
    position_ids_from_mask,
)
from ._masks import _check_ready_mask, _may_take_ready_mask, _ready_mask, ready_mask_verdict
from ._shared_prompts import fast_response_logprobs, is_transformers_model, prompt_groups
from ._torch import autocast


@dataclass
class EncodedPrompts:
    """Left-padded prompt ids and their attention mask.

    Parameters
    ----------
    input_ids : torch.Tensor of shape (n, width)
        Token ids, padded on the left.
    attention_mask : torch.Tensor of shape (n, width)
        1 for real tokens, 0 for padding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def __getitem__(self, index) -> EncodedPrompts:
        return EncodedPrompts(self.input_ids[index], self.attention_mask[index])

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def encode_prompts(tokenizer, prompts, *, max_length: int | None = None) -> EncodedPrompts:
    """Tokenise prompts and pad them on the left for generation.

    A low-level helper: the text is encoded as given, with no special tokens.
    The estimators encode prompts with the tokenizer's BOS, when it adds one
    (see the user guide, "How prompts are encoded").

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
            raise ValueError(
                f"Prompt at row {i} ({prompts[i]!r}) has no tokens; remove it or give it some text."
            )
        if max_length is not None and len(ids) > max_length:
            raise ValueError(
                f"Prompt at row {i} has {len(ids)} tokens, more than the {max_length} "
                "that fit in the model's context with the response; shorten it or "
                "lower max_new_tokens."
            )
    return pad_left(rows, tokenizer.pad_token_id)


def pad_left(rows, pad_token_id: int) -> EncodedPrompts:
    """Pad lists of token ids on the left into an :class:`EncodedPrompts`.

    Parameters
    ----------
    rows : list of list of int
        Token ids of each prompt.
    pad_token_id : int

    Returns
    -------
    encoded : EncodedPrompts

    Examples
    --------
    >>> enc = pad_left([[5, 6], [7]], pad_token_id=0)
    >>> enc.input_ids.tolist(), enc.attention_mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.as_tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return EncodedPrompts(ids, mask)


def pad_right(rows, pad_token_id: int, width: int | None = None):
    """Pad lists of token ids on the right.

    Parameters
    ----------
    rows : list of list of int
        Token ids of each sequence.
    pad_token_id : int
    width : int, default=None
        Width of the result; longer rows are cut. ``None`` is the longest row.

    Returns
    -------
    ids, mask : torch.Tensor of shape (n, width)

    Examples
    --------
    >>> ids, mask = pad_right([[5, 6], [7]], pad_token_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [7, 0]], [[1, 1], [1, 0]])
    """
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        r = r[:width]
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def draw_tokens(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row of ``probs`` by inverting its cumulative sum.

    One uniform number per row, from ``generator`` (on its own device, so a CPU
    generator gives the same draws on any device), is compared with the row's
    cumulative probabilities in float64. This is an exact categorical draw, like
    ``torch.multinomial(probs, 1)``, but faster on the CPU, where ``multinomial``
    draws an exponential number for every entry of the row (benchmarks/README.md).
    Tokens of probability 0 are never drawn.

    Parameters
    ----------
    probs : torch.Tensor of shape (n, vocab)
        Non-negative weights; each row needs a positive sum (it need not be 1).
    generator : torch.Generator

    Returns
    -------
    tokens : torch.Tensor of shape (n, 1), dtype long

    Examples
    --------
    >>> import torch
    >>> probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    >>> tokens = draw_tokens(probs, torch.Generator().manual_seed(0))
    >>> tokens[0].item(), tokens[1].item() in (0, 2)
    (1, True)
    """
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, dtype=torch.float64, device=generator.device
    ).to(probs.device)
    # u < 1, but u * total may round up to total; stay strictly below it, so the draw
    # lands on a token of positive probability (trailing zeros repeat the total).
    v = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, v, right=True)


@torch.no_grad()
def sample(
    model,
    prompts: EncodedPrompts,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    suppress_ids=(),
    return_logprobs: bool = False,
    eos_token_id=None,
    prompt_index=None,
):
    """Sample exactly ``max_new_tokens`` tokens per prompt with a KV cache.

    Sampling never stops early at EOS (fixed-length sampling, as the original
    code does; Huang et al. 2024); use :func:`truncate_after_eos`.

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
        Logits are divided by it; ``0.0`` is greedy decoding, as ``generate(do_sample=False)``
        (the generator is unused; log-probs are then at temperature 1).
    generator : torch.Generator
        Source of randomness.
    suppress_ids : sequence of int, default=()
        Token ids never sampled (the pad token).

    return_logprobs : bool, default=False
        Also return the sampled tokens' log-probabilities (float32, tempered),
        read from the sampling logits: no extra forward pass.
    eos_token_id : int or sequence of int, default=None
        When given, sampling stops as soon as every response holds an EOS (any
        of the ids), and the remaining columns are filled with the first (log-prob
        0). Everything after a response's first EOS is discarded by
        :func:`truncate_after_eos` anyway, so the result is the same fixed-length
        sample, without the wasted steps.
    prompt_index : torch.Tensor of shape (n_prompts,), default=None
        Rows with equal values hold the same prompt (the k samples of a prompt):
        the prompt's pass then runs once for them, and its KV cache is copied to
        each row. The draws are the same.

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
    n, width = ids.shape
    device = ids.device
    # The attention mask of the whole sequence, made once; step t passes a view of it.
    full_mask = torch.cat(
        [prompts.attention_mask, prompts.attention_mask.new_ones((n, max_new_tokens))], dim=1
    )
    positions = position_ids_from_mask(prompts.attention_mask)
    # The prompt's pass needs the logits of its last position only.
    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    groups = prompt_groups(prompt_index)
    if groups is None:
        out = _forward_logits(model, ids, prompts.attention_mask, positions, use_cache=True, **keep)
        cache_arg, past = _cache_of(model, out)
    else:  # each prompt once; its logits and cache copied to the rows that share it
        first, inverse = (g.to(device) for g in groups)
        out = _forward_logits(
            model,
            ids[first],
            prompts.attention_mask[first],
            positions[first],
            use_cache=True,
            **keep,
        )
        cache_arg, past = _cache_of(model, out)
        if past is not None:
            past.batch_select_indices(inverse)
        out = _PrefillOutput(out.logits[inverse])
    suppress = (
        torch.as_tensor(sorted(set(suppress_ids)), dtype=torch.long, device=device)
        if suppress_ids
        else None
    )
    stops = _id_tensor(eos_token_id, device)
    tokens = torch.full(
        (n, max_new_tokens), 0 if stops is None else int(stops[0]), dtype=torch.long, device=device
    )
    logprobs = torch.zeros((n, max_new_tokens), device=device) if return_logprobs else None
    done = torch.zeros(n, dtype=torch.bool, device=device)
    next_position = positions[:, -1:] + 1
    # A decode step's query is one real token, so its attention mask is just the
    # sequence's padding mask: passed ready-made as 4D, the model skips building it.
    # Sampling is faster with it (benchmarks/README.md, "A ready decode mask"), so the
    # one-time probe per model pays.
    ready = _ready_mask(model, full_mask) if _may_take_ready_mask(model) else None
    unchecked = ready is not None and ready_mask_verdict(model) is None  # its one check ahead
    for step in range(max_new_tokens):
        # A new tensor, safe to edit in place; greedy (temperature 0) takes the logits as they are.
        logits = out.logits[:, -1].float() / (temperature or 1.0)
        if suppress is not None:
            logits.index_fill_(-1, suppress, float("-inf"))
        logp = F.log_softmax(logits, dim=-1)
        token = draw_tokens(logp.exp(), generator) if temperature else logits.argmax(-1, True)
        tokens[:, step : step + 1] = token
        if return_logprobs:
            logprobs[:, step : step + 1] = logp.gather(-1, token)
        if stops is not None:
            done |= torch.isin(token.squeeze(1), stops)
            # A sharded model's every forward is a collective: stop only when every rank
            # is done, or the ranks still sampling wait forever for the one that left.
            if _all_done(model, done):
                break  # the rest stays EOS (log-prob 0): discarded by truncate_after_eos
        if step == max_new_tokens - 1:
            break
        mask = full_mask[:, : width + step + 1]
        if past is not None:
            # Sampled ids are real tokens (mask 1): no pad replacement needed here.
            args = dict(input_ids=token, position_ids=next_position + step, use_cache=True, **keep)
            with autocast(device):
                if unchecked:
                    out = _check_ready_mask(model, args, cache_arg, past, mask, ready)
                    ready, unchecked = (ready if ready_mask_verdict(model) else None), False
                else:
                    step_mask = mask if ready is None else ready[..., : mask.shape[1]]
                    out = model(attention_mask=step_mask, **args, **{cache_arg: past})
            past = _cache_of(model, out)[1]
        else:  # a model without a cache: recompute the whole sequence
            seq = torch.cat([ids, tokens[:, : step + 1]], dim=1)
            out = _forward_logits(model, seq, mask, position_ids_from_mask(mask))
    if return_logprobs:
        return tokens, logprobs
    return tokens


@dataclass
class _PrefillOutput:
    logits: torch.Tensor


def truncate_after_eos(response_ids: torch.Tensor, eos_token_id, pad_token_id: int):
    """Keep each response up to and including its first EOS; pad the rest.

    Parameters
    ----------
    response_ids : torch.Tensor of shape (n, length)
    eos_token_id : int, sequence of int or None
        The id, or ids, that end a response (a chat model's end of turn and
        EOS). ``None`` means responses have a fixed length and need no EOS
        (every response counts as ended).
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
    >>> truncate_after_eos(torch.tensor([[5, 2, 7], [6, 7, 2]]), [2, 7], 0)[0].tolist()
    [[5, 2, 0], [6, 7, 0]]
    """
    stops = _id_tensor(eos_token_id, response_ids.device)
    if stops is None:
        mask = torch.ones_like(response_ids)
        return (
            response_ids,
            mask,
            torch.ones(response_ids.shape[0], dtype=torch.bool, device=response_ids.device),
        )
    is_eos = torch.isin(response_ids, stops)
    ended = is_eos.any(dim=1)
    # Tokens strictly after the first EOS: cumulative count of EOS before them > 0.
    after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    mask = (~after).long()
    return response_ids.masked_fill(after, pad_token_id), mask, ended


def response_logprobs(
    model,
    prompts: EncodedPrompts,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float,
    suppress_ids=(),
    with_entropy: bool = False,
    entropy_grad: bool = False,
    prompt_index=None,
):
    """Per-token log-probabilities of responses under ``model``.

    One forward pass over ``[left-padded prompt | response]``; logits are divided
    by ``temperature`` and log-softmax runs in float32. Positions outside
    ``response_mask`` get log-prob 0 (so any KL there is exactly 0).

    A transformers model runs each prompt once for the rows that share it (given
    ``prompt_index``), cuts the padding no row needs, and takes the log-probs from
    its LM head in chunks of positions (``prefopt.backend._shared_prompts``): the
    same numbers, up to float rounding, for less time and memory.

    Parameters
    ----------
    model : torch.nn.Module
    prompts : EncodedPrompts
    response_ids, response_mask : torch.Tensor of shape (n, length)
    temperature : float
    suppress_ids : sequence of int, default=()
    with_entropy : bool, default=False
        Also return the per-token entropy of the tempered distribution.
    entropy_grad : bool, default=False
        Keep the entropy in the autograd graph (an entropy bonus in the loss);
        by default it is computed without gradient, for logging.
    prompt_index : torch.Tensor of shape (n,), default=None
        Rows with equal values hold the same prompt (the k samples of a prompt),
        which then runs once for all of them; gradients flow as through k copies.

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
    if is_transformers_model(model):
        return fast_response_logprobs(
            model,
            prompts,
            response_ids,
            response_mask,
            temperature=temperature,
            suppress_ids=suppress_ids,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            prompt_index=prompt_index,
        )
    input_ids = torch.cat([prompts.input_ids, response_ids], dim=1)
    mask = torch.cat([prompts.attention_mask, response_mask.long()], dim=1)
    n_response = response_ids.shape[1]
    # Only the positions that predict response tokens need the (vocabulary-wide) output
    # layer: transformers models compute just those with logits_to_keep.
    keep = {"logits_to_keep": n_response + 1} if _accepts(model, "logits_to_keep") else {}
    out = _forward_logits(model, input_ids, mask, position_ids_from_mask(mask), **keep)
    logits = out.logits[:, -(n_response + 1) : -1].float() / temperature
    if suppress_ids:  # in place: the division's output is not needed for its backward
        logits[..., list(suppress_ids)] = float("-inf")
    logp_all = F.log_softmax(logits, dim=-1)
    # The pad id after a response's EOS may be the vocabulary size: gather a valid id there.
    targets = _valid_ids(response_ids, response_mask)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    valid = response_mask.bool()
    logp = logp.masked_fill(~valid, 0.0)
    if not with_entropy:
        return logp
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # Suppressed ids have log-prob -inf and probability 0: they add 0, and a 0 (not
        # 0 * -inf = nan) to the gradient, when their log-prob is replaced before the product.
        finite = torch.where(torch.isfinite(logp_all), logp_all, torch.zeros_like(logp_all))
        entropy = -(logp_all.exp() * finite).sum(-1)
    return logp, entropy.masked_fill(~valid, 0.0)


def _all_done(model, done: torch.Tensor) -> bool:
    from . import distributed

    finished = bool(done.all())
    if distributed.is_sharded(model):
        return not distributed.any_rank(not finished)
    return finished
