"""The one tokenizer builder of the worlds: a ``tokenizers`` WordLevel vocabulary, built locally."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, EOS = "[PAD]", "[UNK]", "</s>"


def word_level_tokenizer(
    words,
    *,
    unk_token: str | None = UNK,
    eos_token: str | None = None,
    split_on_whitespace: bool = False,
) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words``, wrapped for transformers.

    Id 0 is ``[PAD]``, then ``unk_token`` and ``eos_token`` when given, then
    ``words`` in the order given. The pad token is never EOS, so supervised
    training never masks the end of a response (Huang et al., 2024).

    Parameters
    ----------
    words : iterable of str
        The vocabulary after the special tokens, in id order.
    unk_token : str or None, default="[UNK]"
        Token of text outside the vocabulary; ``None`` makes such text an error,
        so every id a model can emit is a word, EOS or pad.
    eos_token : str or None, default=None
        End-of-sequence token, given the id after ``unk_token``.
    split_on_whitespace : bool, default=False
        Split text on whitespace into words (decoding joins them with single
        spaces); ``False`` makes each whole string one token.

    Returns
    -------
    tokenizer : transformers.PreTrainedTokenizerFast

    References
    ----------
    S. Huang et al., "The N+ implementation details of RLHF with PPO: a case
    study on TL;DR summarization", COLM, 2024.

    Examples
    --------
    >>> tok = word_level_tokenizer(["a", "b"], eos_token="</s>", split_on_whitespace=True)
    >>> tok("b a")["input_ids"], tok.eos_token_id
    ([4, 3], 2)
    """
    vocab = {PAD: 0}
    for special in (unk_token, eos_token):
        if special is not None:
            vocab[special] = len(vocab)
    for word in words:
        if word in vocab:
            raise ValueError(f"Duplicate string {word!r} in a world's vocabulary.")
        if split_on_whitespace and (not word or word.split() != [word]):
            raise ValueError(f"Word {word!r} is empty or contains whitespace.")
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk_token))
    if split_on_whitespace:
        # With no decoder, ``tokenizers`` decodes by joining tokens with single spaces.
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = {"unk_token": unk_token, "eos_token": eos_token}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        **{k: v for k, v in specials.items() if v is not None},
    )
