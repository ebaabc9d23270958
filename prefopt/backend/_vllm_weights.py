"""The weights a vLLM engine is pushed: a transformers model's, LoRA adapters merged in."""

from __future__ import annotations

import torch

from ._shared_prompts import _unwrapped


def _base(model):
    """The transformers model to mirror: inside DDP, peft and ``torch.compile`` wrappers."""
    return _unwrapped(getattr(model, "_orig_mod", model))


def named_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The weights vLLM loads, under the names of a transformers checkpoint.

    A peft (LoRA) model gives its base model's weights with every active,
    unmerged adapter's delta added (out of place: the policy is untouched).

    Parameters
    ----------
    model : torch.nn.Module
        A transformers causal LM, possibly inside DDP, peft or ``torch.compile``.

    Returns
    -------
    weights : list of (str, torch.Tensor)

    Examples
    --------
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    >>> [name for name, _ in named_weights(model)][:2]
    ['transformer.wte.weight', 'transformer.wpe.weight']
    """
    base = _base(model)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = getattr(inner, "_orig_mod", inner)
    if base is inner:
        return [(name, t.detach()) for name, t in base.state_dict().items()]
    merged = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            weight = module.base_layer.weight.detach()
            if not getattr(module, "merged", False) and not getattr(
                module, "disable_adapters", False
            ):
                for adapter in module.active_adapters:
                    if adapter in getattr(module, "lora_A", {}):
                        weight = weight + module.get_delta_weight(adapter).detach()
            merged[f"{name}.weight"] = weight
    out = []
    for name, t in base.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        out.append((name, merged.get(name, t.detach())))
    return out
