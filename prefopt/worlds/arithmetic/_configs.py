"""Tiny causal-LM configs (GPT-2, Llama, Qwen2 shapes) for the arithmetic world's tokenizer."""

from __future__ import annotations

from .._tokenizer import save_once

ARCHITECTURES = ("gpt2", "llama", "qwen2")


def tiny_config(tokenizer, architecture: str, need: int, cache_dir, overrides: dict):
    """A 2-layer config of width 64 over ``tokenizer``, which it saves once and points to.

    ``need`` is the fewest positions a model must hold (the longest problem,
    its answer and EOS); see :meth:`~prefopt.worlds.ArithmeticWorld.model_config`.
    """
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    special = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if architecture == "gpt2":
        cls = GPT2Config
        shape = {
            "n_positions": 32,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    elif architecture in ("llama", "qwen2"):
        cls = LlamaConfig if architecture == "llama" else Qwen2Config
        shape = {
            "max_position_embeddings": 32,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
        }
    else:
        raise ValueError(
            f"architecture must be one of {', '.join(map(repr, ARCHITECTURES))}; "
            f"got {architecture!r}."
        )
    params = {**special, **shape}
    known = set(cls().to_dict()) | {"attn_implementation"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"Unknown {cls.__name__} parameter(s) {unknown}.")
    if overrides.get("vocab_size", len(tokenizer)) < len(tokenizer):
        raise ValueError(
            f"vocab_size={overrides['vocab_size']} is smaller than the "
            f"tokenizer's {len(tokenizer)} tokens."
        )
    positions = "n_positions" if architecture == "gpt2" else "max_position_embeddings"
    if overrides.get(positions, need) < need:
        raise ValueError(
            f"{positions}={overrides[positions]} cannot hold the longest problem, its "
            f"answer and EOS ({need} tokens)."
        )
    path = save_once(tokenizer, cls(**params), cache_dir, "prefopt-arithmetic-world")
    config = cls(**{**params, **overrides})
    config.name_or_path = path
    return config
