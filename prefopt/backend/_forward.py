"""The low-level forward call every pass shares: positions, valid ids, the KV cache's name."""

from __future__ import annotations

import functools
import inspect

import torch

from ._torch import autocast


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens: exclusive cumsum of the mask.

    Parameters
    ----------
    mask : torch.Tensor of shape (n, width)
        Attention mask, 1 for real tokens.

    Returns
    -------
    position_ids : torch.Tensor of shape (n, width)
        0 at the first real token of each row (and on the left padding).

    Examples
    --------
    >>> import torch
    >>> position_ids_from_mask(torch.tensor([[0, 1, 1], [1, 1, 1]])).tolist()
    [[0, 0, 1], [0, 1, 2]]
    """
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _valid_ids(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # A tokenizer without a pad token (GPT-2, Llama, Mistral) gets one added without
    # resizing the embeddings, as the original code does, so the pad id may equal the
    # vocabulary size: it must reach no embedding lookup and no gather over the
    # vocabulary. Masked positions are ignored, so any valid id (0) will do there.
    return ids.masked_fill(mask == 0, 0)


def _forward_logits(model, input_ids, attention_mask, position_ids, **kwargs):
    # With a KV cache the mask covers the whole sequence but the ids only the new tokens.
    ids = _valid_ids(input_ids, attention_mask[:, -input_ids.shape[1] :])
    with autocast(ids.device):
        return model(
            input_ids=ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )


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


def _id_tensor(ids, device) -> torch.Tensor | None:
    """One id or a sequence of ids as a 1-D long tensor; ``None`` (or none) stays ``None``."""
    if ids is None:
        return None
    ids = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(-1)
    return ids if ids.numel() else None


def _accepts(model, name: str) -> bool:
    """Whether ``model``'s forward takes ``name``.

    A DistributedDataParallel wrapper passes every keyword on to the module it
    holds, and a peft model to its base model.
    """
    return name in _forward_parameters(type(_unwrapped(model)))


def _unwrapped(model):
    """The model inside a DDP wrapper or a peft model (an optional dependency), or itself."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        return model.get_base_model()
    return model


@functools.cache
def _forward_parameters(cls) -> frozenset:
    """Names ``cls.forward`` takes (cached: signatures are slow to read, once a token)."""
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()
