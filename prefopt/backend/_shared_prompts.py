"""Each prompt once per group of samples, no compute on padding, the LM head in chunks.

Every pass of the loop reads ``[left-padded prompt | response]`` for the k samples of
each prompt. Three things make that cheaper without changing a number:

* **Shared prompts.** Rows with the same ``prompt_index`` hold the same prompt. The
  prompt runs once per group with ``use_cache=True``; its keys and values are then
  indexed out to the group's rows, and the responses run on that cache. Indexing is
  differentiable, so in a training pass autograd sums the gradients of the k copies
  into the one prompt computation. The last prompt position's output predicts the
  first response token; the response positions predict the rest. The attention mask
  and position ids are exactly those of the whole sequence, so left padding, learned
  positions (GPT-2) and rotary ones (Llama) give the same outputs as one full pass.
* **No padding.** Columns of left padding that no row of the batch needs, and
  response columns after every row's last real token, are cut before the forward
  pass; outputs there are 0, as a masked position's were.
* **The LM head in chunks.** Log-probs and entropy are taken from the hidden states
  a few hundred positions at a time (the head's input is captured by a hook, and the
  model's own head multiplies an empty tensor), so no pass holds logits over the whole
  vocabulary for every position, nor the several float32 copies a full log-softmax
  makes. A training pass keeps one float32 copy of its logits for the backward pass.

Where sharing cannot apply (no two rows share a prompt, a model that takes no KV
cache, gradient checkpointing, a compiled model, a model sharded across ranks) or
would save too little (``SHARE_MIN_SAVING``: short prompts) the sequence runs in one
pass, still trimmed;
a model that is not a transformers model takes the plain path of
:func:`prefopt.backend.response_logprobs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._forward import (
    _accepts,
    _cache_of,
    _forward_logits,
    _unwrapped,
    _valid_ids,
    position_ids_from_mask,
)
from ._torch import autocast
from .heads import ScalarHeadModel

# Logits computed at once by a chunk of the LM head: 2**24 float32 numbers, 64 MB (334
# positions at GPT-2's 50257 words; every position at once for a small vocabulary).
HEAD_CHUNK_ELEMENTS = 2**24

# A pass shares its prompts when that saves at least this share of the tokens one pass over
# every row would process. Sharing costs a second model call (the responses on the cached
# prompts), which on a small model is worth more than a few prompt tokens: on the review
# world's model (prompts of 3 tokens, responses of 27) it would save 7% of the tokens for a
# second call in each pass (its cost: benchmarks/README.md). Summarisation-shaped prompts
# save about 60%.
SHARE_MIN_SAVING = 0.25

# Causal LMs whose logits are exactly ``lm_head(last hidden state)`` (no soft-capping or
# scaling after the head), so the head can run outside the model, in chunks.
_PLAIN_HEAD_TYPES = frozenset(
    {
        "gpt2",
        "gpt_neox",
        "gptj",
        "llama",
        "mistral",
        "mixtral",
        "opt",
        "phi",
        "phi3",
        "qwen2",
        "qwen3",
        "smollm3",
        "olmo",
        "olmo2",
        "starcoder2",
        "gemma",
    }
)


def is_transformers_model(model) -> bool:
    """Whether ``model`` (or the model inside a DDP or peft wrapper) is a transformers model.

    A model sharded in place by ``fully_shard`` has a class made on the fly whose
    bases hold the transformers one.
    """
    return any(
        cls.__module__.startswith("transformers.models.") for cls in type(_unwrapped(model)).__mro__
    )


def _compiled(model) -> bool:
    return getattr(model, "_compiled_call_impl", None) is not None


def _one_call_only(model) -> bool:
    """A compiled model, or any model in a fit across ranks: every forward of a sharded
    model is a collective, so each rank must make the same calls (no data-dependent
    second call), and its head's weights are gathered only inside its forward (no head
    outside it); a DDP wrapper expects one forward before each backward; and the ranks of
    a DDP fit and of a sharded one then compute the same numbers."""
    from . import distributed

    return (
        _compiled(model)
        or distributed.world_size() > 1
        or distributed.is_sharded(model)
        or isinstance(model, torch.nn.parallel.DistributedDataParallel)
    )


def takes_shared_prompts(model) -> bool:
    """Whether ``model`` can run a prompt once and its responses on the cached prompt.

    A transformers model that takes a KV cache, is not compiled and does not
    checkpoint activations (which turns the cache off in training).
    """
    inner = _unwrapped(model)
    config = getattr(inner, "config", None)
    return (
        is_transformers_model(model)
        and (_accepts(model, "cache") or _accepts(model, "past_key_values"))
        and not _one_call_only(model)
        and not _checkpoints_activations(inner)
        and not getattr(config, "is_encoder_decoder", False)
    )


def _checkpoints_activations(model) -> bool:
    # Checkpointing turns the cache off only in a pass with gradients in training mode
    # (transformers' GradientCheckpointingLayer); other passes keep the shared prompt.
    if not (model.training and torch.is_grad_enabled()):
        return False
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _head_in_chunks(model) -> bool:
    config = getattr(_unwrapped(model), "config", None)
    return (
        getattr(config, "model_type", None) in _PLAIN_HEAD_TYPES
        and not _one_call_only(model)
        and isinstance(model.get_output_embeddings(), torch.nn.Module)
    )


def prompt_groups(prompt_index) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first row of each prompt and each row's group, or ``None`` if no two rows share.

    Parameters
    ----------
    prompt_index : torch.Tensor of shape (n,) or None
        Rows with equal values hold the same (identically padded) prompt.

    Returns
    -------
    first : torch.Tensor of shape (u,)
        The first row of each of the u distinct prompts.
    inverse : torch.Tensor of shape (n,)
        Which of them each row holds.

    Examples
    --------
    >>> import torch
    >>> first, inverse = prompt_groups(torch.tensor([7, 7, 3, 3, 7]))
    >>> first.tolist(), inverse.tolist()
    ([2, 0], [1, 1, 0, 0, 1])
    >>> prompt_groups(torch.tensor([0, 1])) is None
    True
    """
    if prompt_index is None:
        return None
    index = torch.as_tensor(prompt_index)
    uniq, inverse = torch.unique(index, return_inverse=True)
    n = index.shape[0]
    if uniq.shape[0] == n:
        return None
    rows = torch.arange(n, device=index.device)
    first = torch.full_like(uniq, n).scatter_reduce_(0, inverse, rows, "amin")
    return first, inverse


def trimmed_widths(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[int, int]:
    """Left padding columns no row needs, and the response columns up to the last real token.

    Returns
    -------
    start : int
        The first prompt column holding a real token of some row.
    length : int
        One past the last response column holding a real token of some row (at least 1).

    Examples
    --------
    >>> import torch
    >>> trimmed_widths(torch.tensor([[0, 0, 1], [0, 1, 1]]), torch.tensor([[1, 0, 0], [1, 1, 0]]))
    (1, 2)
    """
    used = prompt_mask.bool().any(0)
    start = int(used.long().argmax()) if bool(used.any()) else prompt_mask.shape[1] - 1
    real = response_mask.bool().any(0)
    length = int(real.nonzero().max()) + 1 if bool(real.any()) else 1
    return start, length


class _Runner:
    """Calls a model and returns its per-position output: the LM head's input, logits or values."""

    def __init__(self, model, kind: str):
        self.model, self.kind = model, kind
        self.head = None
        if kind == "lm" and _head_in_chunks(model):
            self.head = model.get_output_embeddings()
        target = model.backbone if kind == "value" else model
        self.cache_arg = _cache_of(target, {})[0]
        self.shares = takes_shared_prompts(target)

    def __call__(self, ids, mask, positions, keep: int, cache=None, use_cache=False):
        """Outputs at the last ``keep`` positions (0: all), and the cache when ``use_cache``."""
        kwargs = {self.cache_arg: cache} if cache is not None else {}
        if use_cache:
            kwargs["use_cache"] = True
        if self.kind == "value":
            ids = _valid_ids(ids, mask[:, -ids.shape[1] :])
            with autocast(ids.device):
                out = self.model.backbone(
                    input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs
                )
            hidden = out.last_hidden_state[:, -keep:] if keep else out.last_hidden_state
            head = self.model.head
            values = head(hidden.to(head.weight.dtype)).squeeze(-1)
            return values, (_cache_of(self.model.backbone, out)[1] if use_cache else None)
        if _accepts(self.model, "logits_to_keep"):
            kwargs["logits_to_keep"] = keep
        if self.head is None:
            out = _forward_logits(self.model, ids, mask, positions, **kwargs)
            features = out.logits
        else:
            captured = []

            def capture(module, args):
                # Keep the head's input; the model's own head then multiplies nothing.
                captured.append(args[0])
                return (args[0][..., :0, :],) + tuple(args[1:])

            handle = self.head.register_forward_pre_hook(capture)
            try:
                out = _forward_logits(self.model, ids, mask, positions, **kwargs)
            finally:
                handle.remove()
            features = captured[0]
        if keep:
            features = features[:, -keep:]
        return features, (_cache_of(self.model, out)[1] if use_cache else None)


def response_outputs(runner: _Runner, prompts, response_ids, response_mask, prompt_index):
    """The model's output at the positions that predict response tokens ``0 .. L-1``.

    ``L`` is the trimmed response width (:func:`trimmed_widths`); the output has shape
    ``(n, L, ...)``.
    """
    start, length = trimmed_widths(prompts.attention_mask, response_mask)
    p_ids, p_mask = prompts.input_ids[:, start:], prompts.attention_mask[:, start:]
    # The last response token predicts nothing that is needed: it is never an input.
    r_ids = response_ids[:, : length - 1]
    r_mask = response_mask[:, : length - 1].to(p_mask.dtype)
    groups = prompt_groups(prompt_index) if runner.shares else None
    if groups is not None:
        n, saved = p_ids.shape[0], (p_ids.shape[0] - groups[0].shape[0]) * p_ids.shape[1]
        if saved < SHARE_MIN_SAVING * n * (p_ids.shape[1] + length - 1):
            groups = None  # too few prompt tokens to pay for the second call
    if groups is not None:
        first, inverse = (g.to(p_ids.device) for g in groups)
        g_mask = p_mask[first]
        last, cache = runner(
            p_ids[first], g_mask, position_ids_from_mask(g_mask), keep=1, use_cache=True
        )
        if cache is not None:
            last = last[inverse]
            if length == 1:
                return last, length
            # Each row's copy of its prompt's keys and values (autograd sums their gradients).
            cache.batch_select_indices(inverse)
            mask = torch.cat([p_mask, r_mask], dim=1)
            positions = position_ids_from_mask(mask)[:, p_mask.shape[1] :]
            rest, _ = runner(r_ids, mask, positions, keep=0, cache=cache)
            return torch.cat([last, rest], dim=1), length
    mask = torch.cat([p_mask, r_mask], dim=1)
    ids = torch.cat([p_ids, r_ids], dim=1)
    out, _ = runner(ids, mask, position_ids_from_mask(mask), keep=length)
    return out, length


def logprobs_from_outputs(
    outputs, head, targets, *, temperature, suppress_ids=(), with_entropy=False, entropy_grad=False
):
    """Per-token log-probs (and entropy) of ``targets`` from hidden states or logits.

    ``outputs`` of shape ``(n, L, d)`` are multiplied by ``head`` a chunk of positions
    at a time (``head=None``: they are logits already). Each chunk's logits are
    divided by the temperature in float32; the log-prob is the target's logit minus
    the log-sum-exp, and the entropy ``lse - sum_v p_v z_v`` (with gradients only
    when ``entropy_grad``: an entropy bonus in the loss; it then keeps ``p`` too).
    """
    n, length = targets.shape
    flat = outputs.reshape(n * length, outputs.shape[-1])
    flat_targets = targets.reshape(-1, 1)
    vocab = head.weight.shape[0] if head is not None else outputs.shape[-1]
    step = max(1, HEAD_CHUNK_ELEMENTS // vocab)
    suppress = list(suppress_ids)
    logps, entropies = [], []
    for i in range(0, n * length, step):
        if head is None:
            logits = flat[i : i + step].float() / temperature
        else:
            with autocast(flat.device):
                logits = head(flat[i : i + step]).float() / temperature
        if suppress:  # in place: the division's output is not needed for its backward
            logits[:, suppress] = float("-inf")
        lse = torch.logsumexp(logits, dim=-1)
        logps.append(logits.gather(-1, flat_targets[i : i + step]).squeeze(-1) - lse)
        if with_entropy:
            grad = entropy_grad and torch.is_grad_enabled()
            with torch.set_grad_enabled(grad):
                p = torch.exp(logits - lse.unsqueeze(-1))
                # Suppressed ids: p = 0 and z = -inf; a 0 in their place, not 0 * -inf = nan.
                if grad:
                    finite = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
                    entropies.append(lse - (p * finite).sum(-1))
                else:  # the same sum with the nan terms skipped, in one pass fewer
                    entropies.append(lse - torch.nansum(p * logits, dim=-1))
    logp = torch.cat(logps).view(n, length)
    return logp, (torch.cat(entropies).view(n, length) if with_entropy else None)


def fast_response_logprobs(
    model,
    prompts,
    response_ids,
    response_mask,
    *,
    temperature,
    suppress_ids=(),
    with_entropy=False,
    entropy_grad=False,
    prompt_index=None,
):
    """:func:`prefopt.backend.response_logprobs` for a transformers model: shared, trimmed,
    chunked. Same arguments and results."""
    runner = _Runner(model, "lm")
    outputs, length = response_outputs(runner, prompts, response_ids, response_mask, prompt_index)
    valid = response_mask.bool()
    # The pad id after a response's EOS may be the vocabulary size: gather a valid id there.
    targets = _valid_ids(response_ids[:, :length], response_mask[:, :length])
    logp, entropy = logprobs_from_outputs(
        outputs,
        runner.head,
        targets,
        temperature=temperature,
        suppress_ids=suppress_ids,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )
    width = response_ids.shape[1] - length
    logp = F.pad(logp, (0, width)).masked_fill(~valid, 0.0)
    if not with_entropy:
        return logp
    return logp, F.pad(entropy, (0, width)).masked_fill(~valid, 0.0)


def takes_fast_values(value_model) -> bool:
    """Whether ``value_model`` is a scalar head on a transformers trunk."""
    return (
        isinstance(value_model, ScalarHeadModel)
        and is_transformers_model(value_model.backbone)
        and not _one_call_only(value_model)
        and not _one_call_only(value_model.backbone)
    )


def fast_sequence_values(value_model, prompts, response_ids, response_mask, prompt_index=None):
    """:func:`prefopt.backend.sequence_values` for a scalar head on a transformers trunk.

    Positions after every row's last real token are 0 (the full pass gave the value of
    padding there, which every caller masks).
    """
    runner = _Runner(value_model, "value")
    values, length = response_outputs(runner, prompts, response_ids, response_mask, prompt_index)
    return F.pad(values.float(), (0, response_ids.shape[1] - length))
