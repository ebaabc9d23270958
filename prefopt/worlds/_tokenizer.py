"""The worlds' tokenizers: WordLevel vocabularies built locally, a chat template, a shared cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, EOS = "[PAD]", "[UNK]", "</s>"

# A chat template in the style of ChatML over three words of the vocabulary: the
# user's turn after <user>, the assistant's after <assistant>, closed by the
# end-of-turn token <eot>, which the model config lists as an EOS id besides </s>.
USER, ASSISTANT, END_OF_TURN = "<user>", "<assistant>", "<eot>"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<user> ' + message['content'] + ' ' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ '<assistant> ' + message['content'] + ' <eot> ' }}"
    "{%- else -%}{{ raise_exception('the roles are user and assistant, not '"
    " + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<assistant>' }}{%- endif -%}"
)


def word_level_tokenizer(
    words,
    *,
    unk_token: str | None = UNK,
    eos_token: str | None = None,
    split_on_whitespace: bool = False,
    chat_template: str | None = None,
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
    chat_template : str, default=None
        A Jinja chat template (such as :data:`CHAT_TEMPLATE`, whose words
        ``words`` must then hold) set as ``tokenizer.chat_template``.

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
    specials = {"unk_token": unk_token, "eos_token": eos_token, "chat_template": chat_template}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        **{k: v for k, v in specials.items() if v is not None},
    )


def words_by_frequency(texts) -> list[str]:
    """The whitespace-split words of ``texts``, most frequent first, ties in string order.

    The order ``tokenizers``' WordLevelTrainer gives, so ids are those of a
    tokenizer trained on the corpus.

    Parameters
    ----------
    texts : iterable of str

    Returns
    -------
    words : list of str

    Examples
    --------
    >>> words_by_frequency(["b a", "a c"])
    ['a', 'b', 'c']
    """
    split = pre_tokenizers.WhitespaceSplit()
    counts = Counter(word for text in texts for word, _ in split.pre_tokenize_str(text))
    return sorted(counts, key=lambda word: (-counts[word], word))


def save_once(tokenizer, config, cache_dir, name: str) -> str:
    """Save a tokenizer and a model config once, to a folder named by their hash.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    config : transformers config
    cache_dir : str, path or None
        The folder to save under; ``None`` is the system's temporary folder.
    name : str
        Start of the folder's name (``"prefopt-review-world"``).

    Returns
    -------
    path : str
        The folder, which ``from_pretrained`` loads.
    """
    text = tokenizer.backend_tokenizer.to_str() + config.to_json_string()
    text += tokenizer.chat_template or ""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    base = os.fspath(cache_dir) if cache_dir is not None else tempfile.gettempdir()
    path = os.path.join(base, f"{name}-{digest}")
    files = ("tokenizer.json", "tokenizer_config.json", "config.json")
    if all(os.path.isfile(os.path.join(path, f)) for f in files):
        return path
    os.makedirs(base, exist_ok=True)
    # Write into a private folder and rename it into place, so processes
    # building the same world at once (pytest-xdist, joblib) never read half
    # a tokenizer.
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=base)
    try:
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared
        os.rename(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process got there first
    if not all(os.path.isfile(os.path.join(path, f)) for f in files):
        raise OSError(
            f"Could not save the world's tokenizer to {path}; pass cache_dir= a writable folder."
        )
    return path
