"""The worlds' tiny models: GPT-2-, Llama- and Qwen2-shaped configs, and TinyLMWorld's model."""

from __future__ import annotations

import numpy as np
from transformers import GenerationConfig

from ..backend import local_seed
from ._tokenizer import save_once

ARCHITECTURES = ("gpt2", "llama", "qwen2")


def _config_class(architecture: str):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    classes = {"gpt2": GPT2Config, "llama": LlamaConfig, "qwen2": Qwen2Config}
    if architecture not in classes:
        raise ValueError(
            f"architecture must be one of {', '.join(map(repr, ARCHITECTURES))}; "
            f"got {architecture!r}."
        )
    return classes[architecture]


def config_params(
    tokenizer, architecture: str, *, width: int, inner: int, positions: int, eos_token_id=None
) -> tuple[type, dict]:
    """A 2-layer config's class and parameters over ``tokenizer``, no dropout.

    GPT-2: learned positions, GELU, LayerNorm, ``width // 16`` heads. Llama and
    Qwen2: rotary positions, SwiGLU, RMSNorm, the same heads with half as many
    key/value heads, tied embeddings.
    """
    cls = _config_class(architecture)
    heads = max(2, width // 16)
    special = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id if eos_token_id is None else eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if architecture == "gpt2":
        shape = {
            "n_positions": positions,
            "n_embd": width,
            "n_layer": 2,
            "n_head": heads,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
        if inner != 4 * width:
            shape["n_inner"] = inner
    else:
        shape = {
            "max_position_embeddings": positions,
            "hidden_size": width,
            "intermediate_size": inner,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": heads // 2,
            "tie_word_embeddings": True,
        }
    return cls, {**special, **shape}


def tiny_config(
    tokenizer,
    architecture: str,
    *,
    need: int,
    positions: int,
    cache_dir,
    overrides: dict,
    name: str,
    what: str,
    eos_token_id=None,
):
    """A 2-layer config of width 64 over ``tokenizer``, which it saves once and points to.

    ``need`` is the fewest positions a model must hold (``what``: "the longest
    problem, its answer and EOS"); ``name`` starts the saved folder's name.
    """
    cls, params = config_params(
        tokenizer,
        architecture,
        width=64,
        inner=256 if architecture == "gpt2" else 128,
        positions=positions,
        eos_token_id=eos_token_id,
    )
    known = set(cls().to_dict()) | {"attn_implementation"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"Unknown {cls.__name__} parameter(s) {unknown}.")
    if overrides.get("vocab_size", len(tokenizer)) < len(tokenizer):
        raise ValueError(
            f"vocab_size={overrides['vocab_size']} is smaller than the "
            f"tokenizer's {len(tokenizer)} tokens."
        )
    key = "n_positions" if architecture == "gpt2" else "max_position_embeddings"
    if overrides.get(key, need) < need:
        raise ValueError(f"{key}={overrides[key]} cannot hold {what} ({need} tokens).")
    path = save_once(tokenizer, cls(**params), cache_dir, name)
    config = cls(**{**params, **overrides})
    config.name_or_path = path
    return config


def tiny_lm_model(tokenizer, n_positions: int, max_len: int, seed: int, architecture: str):
    """A seeded 2-layer model of width 32 whose generation config samples the enumerated tree."""
    cls, params = config_params(tokenizer, architecture, width=32, inner=64, positions=n_positions)
    from transformers import GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM

    model_cls = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}
    with local_seed(seed):
        model = model_cls[architecture](cls(**params))
    model.eval()
    # What prefopt's loop reads: load_causal_lm takes the module's tokenizer, and
    # _setup takes temperature 1 and max_new_tokens = max_len from here, so the
    # sampled distribution is the one enumerated.
    model.tokenizer = tokenizer
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_len,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def prompt_words(i: int, vocab) -> list[str]:
    # Alternate one- and two-token prompts so a batch needs left padding; for
    # i < 2 V the singles and the pairs' first words are all distinct.
    n, j = len(vocab), i // 2
    return [vocab[j]] if i % 2 == 0 else [vocab[(j + 1) % n], vocab[(j + 2) % n]]


def tree_target(rng, prompt_ids, response_ids, n_next: int, logit_std: float, topic_bonus: float):
    """TinyLMWorld's pre-training target, shape (n_prompts, n_responses).

    At every node of the response tree (prompt, content prefix) a random
    next-token distribution over EOS and the ``n_next - 1`` content tokens (normal logits,
    the prompt's topic raised by ``topic_bonus``); a response's probability is
    the product along it. Content ids start at 2, EOS is 1.
    """
    topics = [ids[0] - 1 for ids in prompt_ids]
    target = np.ones((len(prompt_ids), len(response_ids)))
    nodes = {}
    for x in range(len(prompt_ids)):
        for j, resp in enumerate(response_ids):
            for t, token in enumerate(resp):
                key = (x, resp[:t])
                if key not in nodes:
                    logits = rng.normal(0.0, logit_std, size=n_next)
                    logits[topics[x]] += topic_bonus
                    nodes[key] = np.exp(logits) / np.exp(logits).sum()
                target[x, j] *= nodes[key][token - 1]  # ids 1 (EOS) .. V map to 0 .. V-1
    return target
