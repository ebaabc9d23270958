"""Whole-string tokenizers for the exact worlds, built locally with ``tokenizers``."""

from __future__ import annotations

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

PAD, UNK = "[PAD]", "[UNK]"


def whole_string_tokenizer(strings, eos_token: str | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer mapping each given string to exactly one token.

    No pre-tokenizer splits the input, so a whole prompt or response is one
    word of a ``WordLevel`` vocabulary. Id 0 is ``[PAD]``, id 1 is ``[UNK]``.
    """
    vocab = {PAD: 0, UNK: 1}
    if eos_token is not None:
        vocab[eos_token] = len(vocab)
    for s in strings:
        if s in vocab:
            raise ValueError(f"Duplicate string {s!r} in a world's vocabulary.")
        vocab[s] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    kwargs = {"eos_token": eos_token} if eos_token is not None else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, **kwargs)
