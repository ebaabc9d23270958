"""TinyLMWorld's prompts and its tiny GPT-2, sized to the response tree, sampling at T = 1."""

from __future__ import annotations

from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

from ..backend import local_seed


def tiny_gpt2(tokenizer, n_positions: int, max_len: int, seed: int) -> GPT2LMHeadModel:
    """A seeded 2-layer GPT-2 of width 32 whose generation config samples the enumerated tree."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with local_seed(seed):
        model = GPT2LMHeadModel(config)
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
