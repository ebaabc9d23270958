"""Ready 4D attention masks for decode steps, checked once per model.

A decode step's query is one real token, so its attention mask is the sequence's
padding mask; handed to a transformers SDPA model ready-made as 4D, the model
skips building it, and sampling is faster (benchmarks/README.md, "A ready decode
mask").
"""

from __future__ import annotations

import copy

import torch

# The attribute in which a model keeps the verdict of its one check (a plain attribute,
# not a parameter or buffer: no state_dict or saved config holds it; a copy keeps it).
_VERDICT = "_prefopt_ready_mask_ok"


def ready_mask_verdict(model) -> bool | None:
    """Whether ``model`` was checked to read a ready 4D decode mask; ``None``: not checked."""
    return getattr(model, _VERDICT, None)


def _may_take_ready_mask(model) -> bool:
    """Whether a decode step may pass the mask as a ready 4D tensor.

    transformers models build their attention mask with ``masking_utils``, which
    returns a 4D mask as it is, and SDPA reads it as given (a boolean mask means
    "may attend", a float mask is added to the scores). Sliding-window or chunked
    attention, other attention kernels and code outside transformers keep the 2D
    mask. A model that passes is still checked once (:func:`_check_ready_mask`).
    """
    config = getattr(model, "config", None)
    if (
        config is None
        or not type(model).__module__.startswith("transformers.models.")
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or getattr(config, "is_encoder_decoder", False)
    ):
        return False
    if any(getattr(config, key, None) for key in ("sliding_window", "attention_chunk_size")):
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    return ready_mask_verdict(model) is not False and all(
        t == "full_attention" for t in layer_types
    )


def _ready_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """The 4D decode mask: additive (0 or the dtype's minimum) in the model's float
    dtype on the CPU, where SDPA is faster with it than with a boolean mask
    (benchmarks/README.md); boolean elsewhere (under CUDA autocast the query's dtype varies)."""
    keep = mask.bool()[:, None, None, :]
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    if mask.device.type != "cpu" or not dtype.is_floating_point:
        return keep
    return torch.zeros(keep.shape, dtype=dtype).masked_fill_(~keep, torch.finfo(dtype).min)


def _check_ready_mask(model, args: dict, cache_arg: str, past, mask, ready):
    """The first decode step of ``model``: run it with the 2D mask, check the 4D one.

    The step runs as usual (2D mask, on ``past``) and once more on a copy of the
    cache with the 4D mask; the model takes the 4D mask from then on only if the
    logits agree. One extra one-token call in the model's lifetime. Returns the
    step's output.
    """
    trial_cache = copy.deepcopy(past)
    out = model(attention_mask=mask, **args, **{cache_arg: past})
    try:
        trial = model(
            attention_mask=ready[..., : mask.shape[1]], **args, **{cache_arg: trial_cache}
        )
        ok = bool(torch.allclose(out.logits.float(), trial.logits.float(), atol=1e-4, rtol=1e-4))
    except Exception:  # noqa: BLE001 - any failure means "keep the 2D mask"
        ok = False
    setattr(model, _VERDICT, ok)
    return out
